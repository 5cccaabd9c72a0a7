#!/usr/bin/python3 -IS
"""Fake `docker` installed as /usr/local/bin/docker on one simulated host.

`hardware.render_tool` copies this file into the host's private bin directory with CONFIG replaced by
that host's images (`hardware.docker_config`: each image's inspect object and its JSON text, rendered once
on the workstation). `image inspect` prints what the real CLI prints (the shape of Docker 28 output,
including the `[]` plus daemon error for a missing image); `run` records its argv as one JSON line in
`~/.fake-docker-runs.jsonl` so launcher tests can read what would have been started. A `run` of a local
image with `--entrypoint python3 IMAGE -c PROGRAM ARGS...` (how discovery reads an image's package versions;
it leaves nothing running, so it is not recorded) really runs PROGRAM, under the host's python3 with the
image's packages installed as metadata only (`<name>-<version>.dist-info/METADATA`, all that
`importlib.metadata` reads); a run of an image that is not local fails as `--pull never` makes docker fail.
Standard library only: it runs under the host's system python3, not the workstation virtualenv.
Every probe runs it, and on the simulated fleet all hosts share the workstation's CPUs, so it starts
isolated (`-IS`) and imports `json` and `re` only on the paths that need them: the probe's plain
`image inspect` needs neither.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # `typing.TYPE_CHECKING` without importing `typing`
if TYPE_CHECKING:
    from typing import Any

CONFIG: dict[str, Any] = {"images": [], "inspect_json": [], "packages": []}  # fleetsim: host config

VERSION_LINE = "Docker version 28.2.2, build e6534b4"
NO_SUCH_IMAGE = "Error response from daemon: No such image: {ref}"
RUN_NO_IMAGE = "docker: Error response from daemon: No such image: {ref}.\nSee 'docker run --help'."
RUN_VALUE_OPTIONS = frozenset({"--name", "--network", "--ipc", "--gpus", "--entrypoint", "--pull", "--device", "-e",
                               "--env", "-v", "--volume", "--mount", "--ulimit", "--env-file", "--security-opt"})
RUNS_FILE = ".fake-docker-runs.jsonl"
FIELD_TEMPLATE = r"\{\{\s*(json\s+)?\.([A-Za-z]*)\s*\}\}"
INDEX_TEMPLATE = r"\{\{\s*index\s+\.([A-Za-z]+)\s+([0-9]+)\s*\}\}"
HEX = frozenset("0123456789abcdef")

Result = tuple[int, str, str]


def familiar(ref: str) -> str:
    """The daemon names a tagless, digestless reference `name:latest` in its errors, as docker does."""
    if ref.startswith("sha256:") or "@" in ref or (12 <= len(ref) <= 64 and HEX.issuperset(ref)):
        return ref
    return ref if ":" in ref.rsplit("/", 1)[-1] else ref + ":latest"


def find_image(ref: str) -> int | None:
    """The index in CONFIG of the image matching by full id, hex id prefix, tag (with implied :latest) or
    repo digest."""
    for index, image in enumerate(CONFIG["images"]):
        hex_id = image["Id"].removeprefix("sha256:")
        if ref == image["Id"] or (len(ref) >= 12 and hex_id.startswith(ref)):
            return index
        if familiar(ref) in image["RepoTags"] or ref in image["RepoDigests"]:
            return index
    return None


def _go_text(value: Any) -> str:
    """Go's text/template rendering of a plain value: strings raw, lists as [a b]."""
    if isinstance(value, list):
        return "[" + " ".join(_go_text(v) for v in value) + "]"
    if isinstance(value, dict):
        import json

        return json.dumps(value, separators=(",", ":"))
    return "<nil>" if value is None else str(value)


def render_format(template: str, image: dict[str, Any]) -> str | None:
    """The few Go templates callers use: {{json .}}, {{.Field}}, {{json .Field}}, {{index .Field N}}."""
    import json
    import re

    match = re.fullmatch(FIELD_TEMPLATE, template.strip())
    if match:
        value = image if not match.group(2) else image.get(match.group(2))
        if match.group(1):
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        return _go_text(value) if match.group(2) else None
    match = re.fullmatch(INDEX_TEMPLATE, template.strip())
    if match and int(match.group(2)) < len(image.get(match.group(1)) or []):
        return _go_text(image[match.group(1)][int(match.group(2))])
    return None


def _split_format(args: list[str]) -> tuple[str | None, list[str]]:
    fmt, refs, i = None, [], 0
    while i < len(args):
        arg = args[i]
        if arg in ("-f", "--format") and i + 1 < len(args):
            fmt, i = args[i + 1], i + 2
            continue
        if arg.startswith("--format="):
            fmt = arg.split("=", 1)[1]
        elif arg not in ("--type=image",):
            refs.append(arg)
        i += 1
    return fmt, refs


def image_inspect(args: list[str]) -> Result:
    """`docker image inspect [-f FMT] REF...`: an indented JSON array, or one formatted line per image."""
    fmt, refs = _split_format(args)
    if not refs:
        return 1, "", '"docker image inspect" requires at least 1 argument.\n'
    found = [(ref, find_image(ref)) for ref in refs]
    indexes = [index for _, index in found if index is not None]
    err = "".join(NO_SUCH_IMAGE.format(ref=familiar(ref)) + "\n" for ref, index in found if index is None)
    status = 1 if err else 0
    if fmt is None:
        return status, inspect_json([CONFIG["inspect_json"][i] for i in indexes]) + "\n", err
    lines = [render_format(fmt, CONFIG["images"][i]) for i in indexes]
    if any(line is None for line in lines):
        return 1, "", f"template: :1: unsupported by fleetsim fake docker: {fmt}\n"
    return status, "".join(f"{line}\n" for line in lines), err


def inspect_json(texts: list[str]) -> str:
    """`json.dumps(images, indent=4)` from each image's own `json.dumps(image, indent=4)` text."""
    if not texts:
        return "[]"
    return "[\n" + ",\n".join("    " + text.replace("\n", "\n    ") for text in texts) + "\n]"


def record_run(args: list[str]) -> Result:
    """`docker run ...`: append argv to ~/.fake-docker-runs.jsonl; print a container id when detached."""
    import hashlib
    import json
    import time

    line = json.dumps(["run", *args], ensure_ascii=False)
    path = os.path.join(os.path.expanduser("~"), RUNS_FILE)
    with open(path, "a", encoding="utf-8") as runs:
        runs.write(line + "\n")
    detached = any(a in ("-d", "--detach") for a in args)
    container = hashlib.sha256(f"{line}{time.time_ns()}".encode()).hexdigest()
    return 0, container + "\n" if detached else "", ""


def run_program(args: list[str]) -> Result | None:
    """`run ... --entrypoint python3 IMAGE -c PROGRAM ARGS...`: PROGRAM's own result; None for other runs."""
    options, i = {}, 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] in RUN_VALUE_OPTIONS and i + 1 < len(args):
            options[args[i]], i = args[i + 1], i + 2
        else:
            i += 1
    if options.get("--entrypoint") != "python3" or args[i + 1 : i + 2] != ["-c"] or len(args) < i + 3:
        return None
    index = find_image(args[i])
    if index is None:
        return 125, "", RUN_NO_IMAGE.format(ref=familiar(args[i])) + "\n"
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fake-image-") as site:
        for name, version in sorted(CONFIG["packages"][index].items()):
            info = os.path.join(site, f"{name.replace('-', '_')}-{version}.dist-info")
            os.mkdir(info)
            with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as handle:
                handle.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        done = subprocess.run([sys.executable, "-s", "-S", "-c", args[i + 2], *args[i + 3 :]], capture_output=True,
                              text=True, env={"PYTHONPATH": site, "LC_ALL": "C"}, check=False)  # fmt: skip
    return done.returncode, done.stdout, done.stderr


def main(argv: list[str]) -> Result:
    """Exit status, stdout and stderr for one invocation (kept pure-ish so unit tests can call it)."""
    if argv in (["--version"], ["-v"]):
        return 0, VERSION_LINE + "\n", ""
    if argv[:2] == ["image", "inspect"]:
        return image_inspect(argv[2:])
    if argv[:1] == ["inspect"]:
        return image_inspect(argv[1:])
    if argv[:1] == ["run"]:
        return run_program(argv[1:]) or record_run(argv[1:])
    command = argv[0] if argv else ""
    return 1, "", f"docker: unknown command: docker {command}\n\nRun 'docker --help' for more information\n"


if __name__ == "__main__":
    status, out, err = main(sys.argv[1:])
    sys.stdout.write(out)
    sys.stderr.write(err)
    sys.exit(status)
