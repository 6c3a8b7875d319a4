"""`pyggml rpc-server`: serve pyggml backends with ggml's RPC protocol, as ggml-rpc-server does.

llama.cpp offloads layers to it with `--rpc HOST:PORT -ngl 99`, pyggml with
`--backend rpc://HOST:PORT`. Each `--backend` is one remote device, in order (default: cpu). It
listens on 127.0.0.1 unless `--host` says otherwise, which is logged as a warning: the protocol has
no authentication. Connections, disconnections and refused messages are logged on stderr. The
limits a client meets (connections, timeouts, a graph's work and temporaries) are options with the
server's defaults; the process exits non-zero when it stops serving for any reason but an interrupt.

The server is the rpc registry's "pyggml_rpc_server" (the CLI finds backends by name only, as
llama.cpp's rpc-server finds ggml_backend_rpc_start_server through the registry).
"""

from __future__ import annotations

import argparse
import inspect
import logging
import math
import re
import sys
from typing import Any

from pyggml.cli._common import CLIError, add_debug, fmt_bytes, init_backends, positive_int, thread_count
from pyggml.core import work

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from "4096", "512M", "1.5GiB" (K/M/G/T are powers of 1024, KB/MB/GB/TB of 1000)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 4096, 512M, 2G, 1.5GiB)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a memory limit must be > 0 bytes")
    return value


def count(text: str) -> int:
    """A positive whole number, also written "3.5e13" or "2^45"."""
    base, caret, exp = text.strip().partition("^")
    try:
        if caret:
            value = int(base) ** int(exp)
        else:
            number = float(text)
            value = int(number) if math.isfinite(number) and number == int(number) else 0
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (e.g. 1000000, 3.5e13, 2^45)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number > 0")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0 seconds")
    return value


def seconds_or_never(text: str) -> float | None:
    """Seconds, or None for 0 (no limit)."""
    try:
        never = float(text) == 0
    except ValueError:
        never = False
    return None if never else seconds(text)


def port_number(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0..65535; 0: any free port)")
    return int(text)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("rpc-server", help="serve pyggml backends over ggml's RPC protocol (llama.cpp --rpc)",
                       description="Serve pyggml backends with ggml's RPC protocol 7.0.0, so that llama.cpp "
                                   "(--rpc HOST:PORT) and pyggml (--backend rpc://HOST:PORT) offload layers to "
                                   "them. Each --backend is one device.")
    p.add_argument("-b", "--backend", action="append", default=None, metavar="NAME",
                   help="a backend to serve (cpu, torch, torch:cuda:0); repeat it for several devices (default: cpu)")
    p.add_argument("-H", "--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1; any other is reachable from other machines, "
                        "with no authentication: a warning says so)")
    p.add_argument("-p", "--port", type=port_number, default=50052, help="port (default: 50052, as ggml-rpc-server)")
    p.add_argument("-c", "--cache", default=None, metavar="DIR",
                   help="keep large weights sent with SET_TENSOR_HASH in DIR, so a model loads again without "
                        "sending them")
    p.add_argument("--mem", type=parse_size, default=None, metavar="SIZE",
                   help="limit the memory of all clients' buffers and their graphs' temporaries (e.g. 2G); a "
                        "buffer beyond it is refused")
    p.add_argument("-t", "--threads", type=thread_count, default=None, metavar="N",
                   help="threads of the CPU backend (default: all cores)")
    p.add_argument("--no-fallback", action="store_true",
                   help="refuse a graph with a node the served backend does not compute (default: such nodes run "
                        "on the host CPU, each op named once in the log); for testing a backend alone")
    limits = server_defaults()
    g = p.add_argument_group("limits (a client past one is disconnected, with a log line naming it)")
    g.add_argument("--max-connections", type=positive_int, default=limits["max_connections"], metavar="N",
                   help="clients connected at once; more are closed as they connect (default: "
                        "%(default)s)")
    g.add_argument("--hello-timeout", type=seconds, default=limits["hello_timeout"], metavar="SECONDS",
                   help="time from connecting to a whole HELLO (default: %(default)s)")
    g.add_argument("-to", "--timeout", type=seconds_or_never, default=limits["idle_timeout"], metavar="SECONDS",
                   help="time a client holding no buffer may stay silent between messages (one holding buffers "
                        "may think as long as it likes); 0: no limit (default: %(default)s)")
    g.add_argument("--message-timeout", type=seconds, default=limits["message_timeout"], metavar="SECONDS",
                   help="time for the whole of a message once it started, and for an answer to be taken, plus "
                        "a second per MiB (default: %(default)s)")
    g.add_argument("--max-work", type=count, default=work.MAX_GRAPH_WORK, metavar="N",
                   help=f"a graph's work: its nodes' elements and multiply-adds; a model's batch costs about "
                        f"its parameters times its tokens (default: 2^45 = {work.MAX_GRAPH_WORK:.2g})")
    g.add_argument("--max-node-elements", type=count, default=work.MAX_NODE_ELEMENTS, metavar="N",
                   help=f"elements of a node or one of its sources (default: 2^34 = {work.MAX_NODE_ELEMENTS})")
    g.add_argument("--max-temp", type=parse_size, default=work.MAX_TEMP_BYTES, metavar="SIZE",
                   help="temporaries a graph's kernels may hold: its non-contiguous tensors as float32; they "
                        "count against --mem too (default: 1G)")
    add_debug(p)
    return p


def server_class() -> Any:
    """The RPC server, as the "rpc" registry hands it out ("pyggml_rpc_server"); None without one."""
    from pyggml.ggml_backend.registry import reg_by_name

    reg = reg_by_name("rpc")
    return reg.get_proc_address("pyggml_rpc_server") if reg is not None else None


def server_defaults() -> dict[str, Any]:
    """The server's own defaults of the connection limits (its constructor's), for the options' defaults."""
    names = ("max_connections", "hello_timeout", "idle_timeout", "message_timeout")
    server_cls = server_class()
    if server_cls is None:
        return dict.fromkeys(names)
    params = inspect.signature(server_cls).parameters
    return {name: params[name].default for name in names}


def run(args: argparse.Namespace) -> int:
    server_cls = server_class()
    if server_cls is None:
        raise CLIError("the rpc backend is not registered (no 'rpc' registry with a server): reinstall pyggml "
                       "(pip install -e .) so that its pyggml.backends entry point 'rpc' is known")
    backends = init_backends(args.backend or ["cpu"], args.threads)
    server_log = logging.getLogger("pyggml.backends.rpc.server")
    if not args.debug:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        server_log.addHandler(handler)
        server_log.setLevel(logging.INFO)
        server_log.propagate = False
    budget = work.WorkBudget(node_elements=args.max_node_elements, work=args.max_work, temp_bytes=args.max_temp)
    server = server_cls(backends, args.host, args.port, cache_dir=args.cache, mem_limit=args.mem, budget=budget,
                        max_connections=args.max_connections, hello_timeout=args.hello_timeout,
                        idle_timeout=args.timeout, message_timeout=args.message_timeout,
                        fallback=not args.no_fallback, host_threads=args.threads)
    print(f"pyggml RPC server, protocol {server.version}, listening on {server.endpoint}", flush=True)
    print(f"  cache: {args.cache or 'n/a'}; memory limit: {fmt_bytes(args.mem) if args.mem else 'none'}; nodes a "
          f"backend lacks: {'refused' if args.no_fallback else 'on the host CPU'}")
    idle = f"{args.timeout:g} s" if args.timeout is not None else "none"
    print(f"  per client: {args.max_connections} connections, HELLO within {args.hello_timeout:g} s, idle "
          f"{idle}, a message {args.message_timeout:g} s; a graph: work {args.max_work:.3g}, "
          f"{args.max_node_elements:.3g} elements a node, {fmt_bytes(args.max_temp)} of temporaries")
    for i, b in enumerate(backends):
        dev = b.get_device()
        free, total = dev.memory() if dev is not None else (0, 0)
        print(f"  device {i}: {b.name()} ({fmt_bytes(total)}, {fmt_bytes(free)} free)")
    sys.stdout.flush()
    try:
        server.serve_forever()
    finally:
        server.close()
    return 0
