"""`resolve`: where each destination connects, as OpenSSH resolves it and as every command connects to it."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from narwhal_assets.core.display import printable
from narwhal_assets.core.errors import InputError

if TYPE_CHECKING:
    from narwhal_assets.ssh.destination import Endpoint

EXIT_REFUSED = 2


def resolve(args: argparse.Namespace) -> int:
    from narwhal_assets.ssh.destination import resolve_endpoint

    config = _config(args)
    results: list[dict[str, Any]] = []
    for destination in args.destinations:
        try:
            endpoint = resolve_endpoint(destination, config)
            refused = endpoint.refusal()
        except InputError as exc:
            refused = "; ".join(exc.problems)
        results.append({"destination": destination, "error": refused} if refused else describe(endpoint))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for result in results:
            print(_line(result))
    return EXIT_REFUSED if any("error" in result for result in results) else 0


def describe(endpoint: Endpoint) -> dict[str, Any]:
    """The JSON object for one endpoint (each ProxyJump hop is described the same way, in connection order)."""
    from narwhal_assets.ssh.identities import implicit_certificates

    return {
        "destination": endpoint.destination,
        "hostname": endpoint.host,
        "port": endpoint.port,
        "user": endpoint.user,
        "identity_files": [os.path.abspath(path) for path in endpoint.identity_files],
        "certificate_files": [os.path.abspath(path) for path in
                              (*endpoint.certificate_files, *implicit_certificates(endpoint.identity_files))],
        "identities_only": endpoint.identities_only,
        "identity_agent": endpoint.identity_agent,
        "host_key_alias": endpoint.host_key_alias,
        "known_hosts_names": list(endpoint.known_hosts_names),
        "proxy_command": endpoint.proxy_command,
        "jumps": [describe(hop) for hop in endpoint.hops()],
        "connect_timeout": endpoint.connect_timeout,
        "not_applied": [{"option": n.option, "value": n.value, "reason": n.reason} for n in endpoint.not_applied],
    }  # fmt: skip


def _line(result: dict[str, Any]) -> str:
    """`DEST: user@host:port via hop -> hop (ProxyCommand ...) keys ... known as NAME`, or why it is refused."""
    shown = printable(result["destination"], 120)
    if "error" in result:
        return f"{shown}: refused: {printable(result['error'], None)}"
    route = [f"{hop['user']}@{_address(hop)}" for hop in result["jumps"]]
    parts = [f"{shown}: {result['user']}@{_address(result)}"]
    if route:
        parts.append("via " + " -> ".join(route))
    first = result["jumps"][0] if result["jumps"] else result
    if first["proxy_command"]:
        parts.append(f"(ProxyCommand {first['proxy_command']})")
    keys = result["identity_files"] + result["certificate_files"]
    parts.append(f"keys {', '.join(keys) if keys else 'none'}" + (" only" if result["identities_only"] else ""))
    parts.append(f"known as {', '.join(result['known_hosts_names'])}")
    if result["not_applied"]:
        parts.append(f"not applied: {', '.join(sorted({n['option'] for n in result['not_applied']}))}")
    return printable(" ".join(parts), None)


def _address(result: dict[str, Any]) -> str:
    host = result["hostname"]
    return f"[{host}]:{result['port']}" if ":" in host else f"{host}:{result['port']}"


def _config(args: argparse.Namespace) -> Path | None:
    """`--ssh-config`, else the checkout's (NARWHAL_SSH_CONFIG) when run in one, else OpenSSH's own files."""
    given: Path | None = args.ssh_config
    if given is not None:
        if not given.is_file():
            raise InputError([f"--ssh-config: {given} is not a file"])
        return given.absolute()
    from narwhal_assets.core.inputs.settings import DEPLOYMENT_ENV, DOTENV, Settings

    if any((args.root / name).is_file() for name in (DOTENV, DEPLOYMENT_ENV)):
        return Settings.load(args.root).ssh_config_path
    return None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("resolve", help="where each destination connects: host, port, user, keys, route, "
                            "host-key name, as OpenSSH resolves it")  # fmt: skip
    parser.add_argument("--ssh-config", type=Path, metavar="FILE", help="OpenSSH client config (default: the "
                        "checkout's NARWHAL_SSH_CONFIG in a checkout, else OpenSSH's own files)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="a JSON list, one object per destination, in order")
    parser.add_argument("destinations", nargs="+", metavar="DESTINATION", help="alias, host, user@host, "
                        "user@[host]:port or ssh://user@host:port")  # fmt: skip
    parser.set_defaults(func=resolve)
