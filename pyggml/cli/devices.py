"""`pyggml devices`: the backend registries, their devices, memory and capabilities.

Every registry the `pyggml.backends` entry points name (and any registered in
this process) is loaded; each device is one row: its registry, name, type,
memory free and total, capabilities (ggml's names: async, host_buffer,
buffer_from_host_ptr, events, mmap) and description. A registry without
devices (one made by `register_backend`, or rpc before a server is added) is listed too, and an entry point
that fails to load is listed with why (a missing dependency, say): neither is
an error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from pyggml.cli._common import add_debug, fmt_bytes, table


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("devices", help="list the backend registries, their devices, memory and capabilities",
                       description="List every backend registry (found through the pyggml.backends entry points), "
                                   "its devices with their type, memory free and total, and capabilities.")
    add_debug(p)
    return p


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout  # looked up per call: tests and callers swap sys.stdout
    from pyggml.ggml_backend import registry

    registry.load_all()
    rows = [["registry", "device", "type", "free", "total", "caps", "description"]]
    empty: list[str] = []
    for reg in registry.regs():
        devices = reg.devices()
        if not devices:
            empty.append(reg.name())
        for dev in devices:
            props = dev.get_props()
            rows.append([reg.name(), props.name, props.type.name, fmt_bytes(props.memory_free),
                         fmt_bytes(props.memory_total), ", ".join(props.caps.names()) or "-", props.description])
    if len(rows) > 1:
        for line in table(rows, right=(3, 4)):
            print(line, file=out)
    else:
        print("no devices", file=out)
    if empty:
        # backends made by a factory, and the rpc registry before a server is added (`--backend rpc://HOST:PORT`)
        print(f"registries without devices: {', '.join(empty)}", file=out)
    for name, why in sorted(registry.load_errors().items()):
        print(f"not loaded: {name}: {why}", file=out)
    return 0
