#!/usr/bin/python3 -IS
"""Fake `nvidia-smi` installed as /usr/local/bin/nvidia-smi on one simulated host.

`hardware.render_tool` copies this file into the host's private bin directory with CONFIG replaced by
that host's GPUs, so the probe under test parses the real tool's output formats without a GPU. The
formats live here (and only here); tests/fixtures/h200-capture holds real H200 outputs that the tests
compare these against byte for byte.
Standard library only: it runs under the host's system python3, not the workstation virtualenv.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # `typing.TYPE_CHECKING` without importing `typing`: start-up is most of a run's cost
if TYPE_CHECKING:
    from typing import Any

CONFIG: dict[str, Any] = {"gpus": [], "driver_version": "580.159.04", "cuda_version": "13.0"}  # fleetsim

# Query field (and its aliases) -> (GPU key, unit shown in the csv header and after unit values).
FIELDS: dict[str, tuple[str, str]] = {
    "index": ("index", ""),
    "uuid": ("uuid", ""),
    "gpu_uuid": ("uuid", ""),
    "name": ("name", ""),
    "gpu_name": ("name", ""),
    "memory.total": ("memory_mib", "MiB"),
    "pci.bus_id": ("bus_id", ""),
    "gpu_bus_id": ("bus_id", ""),
    "driver_version": ("driver_version", ""),
    "count": ("count", ""),
}
LIST_LINE = "GPU {index}: {name} (UUID: {uuid})"
INVALID_FIELD = 'Field "{field}" is not a valid field to query.'
VERSION = (
    "NVIDIA-SMI version  : {driver}\n"
    "NVML version        : {nvml}\n"
    "DRIVER version      : {driver}\n"
    "CUDA Version        : {cuda}\n"
)
USAGE_EXIT = 2


def _option(argv: list[str], name: str) -> str | None:
    """The value of `--name=value` or `--name value`; None when absent."""
    for i, arg in enumerate(argv):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _value(gpu: dict[str, Any], field: str, units: bool) -> str:
    key, unit = FIELDS[field]
    if key == "driver_version":
        return str(CONFIG["driver_version"])
    if key == "count":
        return str(len(CONFIG["gpus"]))
    value = str(gpu[key])
    return f"{value} {unit}" if units and unit else value


def query_gpu(fields: list[str], fmt: set[str]) -> tuple[int, str]:
    """`--query-gpu=a,b --format=csv[,noheader][,nounits]`: one csv line per GPU, fields joined by ', '."""
    for field in fields:
        if field not in FIELDS:
            return USAGE_EXIT, INVALID_FIELD.format(field=field) + "\n\n"
    lines = []
    if "noheader" not in fmt:
        lines.append(", ".join(f"{f} [{FIELDS[f][1]}]" if FIELDS[f][1] else f for f in fields))
    units = "nounits" not in fmt
    lines += [", ".join(_value(gpu, f, units) for f in fields) for gpu in CONFIG["gpus"]]
    return 0, "".join(line + "\n" for line in lines)


def list_gpus() -> str:
    """`nvidia-smi -L`."""
    return "".join(LIST_LINE.format(**gpu) + "\n" for gpu in CONFIG["gpus"])


def version() -> str:
    """`nvidia-smi --version`."""
    driver = str(CONFIG["driver_version"])
    nvml = ".".join(driver.split(".")[:2])
    return VERSION.format(driver=driver, nvml=nvml, cuda=CONFIG["cuda_version"])


def main(argv: list[str]) -> tuple[int, str]:
    """Exit status and stdout for one invocation (kept pure so unit tests can call it)."""
    if argv in (["-L"], ["--list-gpus"]):
        return 0, list_gpus()
    if argv == ["--version"]:
        return 0, version()
    query = _option(argv, "--query-gpu")
    fmt = _option(argv, "--format")
    if query is not None and fmt is not None and fmt.split(",")[0] == "csv":
        return query_gpu([f.strip() for f in query.split(",") if f.strip()], set(fmt.split(",")[1:]))
    return USAGE_EXIT, f"fleetsim nvidia-smi: unsupported arguments {argv!r}\n"


if __name__ == "__main__":
    status, out = main(sys.argv[1:])
    sys.stdout.write(out)
    sys.exit(status)
