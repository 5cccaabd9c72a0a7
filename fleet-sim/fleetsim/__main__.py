"""`python -m fleetsim start|stop --dir DIR`: the README demo's simulated fleet.

`start` leaves the fleet running after it exits (sshd runs in its own session) and prints the `.env`
lines that point the deployer at it; progress goes to stderr so `start ... > .env` works. `--hosts N` goes
up to the fleet limit (fleetsim.network.MAX_HOSTS); `--latency-ms MS` puts a relay adding MS milliseconds
each way in front of every host. `stop` removes everything recorded in DIR/fleet.json.
"""

from __future__ import annotations

import argparse
import secrets
import shlex
import sys
from pathlib import Path

from fleetsim.fleet import SimFleet
from fleetsim.network import DEFAULT_CAPACITY, MAX_HOSTS
from fleetsim.state import FleetState, teardown
from fleetsim.system import FleetError

DEMO_MODEL = "demo-model"


def build_demo(workdir: Path, hosts: int, latency: float | None = None) -> tuple[SimFleet, dict[str, str]]:
    """h1: router + engine-1 (key); h2: engine-2 (password); h3: engine-3 (key, only via h1); more: key.

    Returns the fleet (not started) and its role -> host mapping.
    """
    fleet = SimFleet(workdir, capacity=max(hosts, DEFAULT_CAPACITY))
    roles = {"router": "h1"}
    for n in range(1, hosts + 1):
        name = f"h{n}"
        password = secrets.token_urlsafe(12) if n == 2 else None
        fleet.add_host(name, password=password, via="h1" if n == 3 else None, rdma=True, latency=latency)
        roles[f"engine-{n}"] = name
    return fleet, roles


def _demo_model(fleet: SimFleet) -> None:
    """A small model with a real-looking config.json and synthetic weights, identical on every host."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "num_hidden_layers": 2, "num_attention_heads": 4, "torch_dtype": "bfloat16"}  # fmt: skip
    weights = {"model-00001-of-00001.safetensors": bytes(range(256)) * 4096}
    fleet.write_model(DEMO_MODEL, weights, config)


def start(workdir: Path, hosts: int, latency_ms: float | None = None) -> int:
    fleet, roles = build_demo(workdir, hosts, None if latency_ms is None else latency_ms / 1000)
    fleet.start()
    _demo_model(fleet)
    fleet.detach()
    print("\n".join(fleet.env_lines(roles)))
    h1 = fleet.host("h1")
    print(
        f"fleet {fleet.prefix}: {len(fleet.hosts)} hosts up in {fleet.last_start_seconds:.2f}s "
        f"(image {h1.image_ref}, model /srv/models/{DEMO_MODEL}); state in {fleet.state_path}\n"
        f"stop it with: {stop_command(workdir)}",
        file=sys.stderr,
    )
    return 0


def stop_command(workdir: Path) -> str:
    """The stop command as it works from any directory and shell: this interpreter (the one that has
    fleetsim, usually the repository's .venv, not whichever `python` is on PATH) and an absolute DIR."""
    return shlex.join([sys.executable, "-m", "fleetsim", "stop", "--dir", str(workdir.resolve())])


def stop(workdir: Path) -> int:
    problems = teardown(FleetState.load(workdir))
    for problem in problems:
        print(f"fleetsim stop: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _host_count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_HOSTS:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of hosts from 1 to {MAX_HOSTS}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetsim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    start_cmd = sub.add_parser("start", help="start a demo fleet in DIR and print its .env lines")
    start_cmd.add_argument("--dir", type=Path, required=True)
    start_cmd.add_argument("--hosts", type=_host_count, default=3, metavar=f"N (1-{MAX_HOSTS})")
    start_cmd.add_argument("--latency-ms", type=float, default=None, metavar="MS",
                           help="a relay in front of every host adds MS milliseconds each way")  # fmt: skip
    stop_cmd = sub.add_parser("stop", help="remove the fleet recorded in DIR/fleet.json")
    stop_cmd.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        return start(args.dir, args.hosts, args.latency_ms) if args.command == "start" else stop(args.dir)
    except (FleetError, ValueError) as exc:
        print(f"fleetsim {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
