"""What the subcommands share: the argument parser that fails in one line, backend options, sizes.

Errors a user can cause (a bad path, a corrupt file, a bad option value) end
in one line on stderr and a non-zero exit code; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from pyggml.core.errors import ArgumentError, GGUFError


class CLIError(Exception):
    """A user error found by the command line itself (its message is the one line printed)."""


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad option in one line (with the subcommand's name) instead of a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def add_debug(parser: argparse.ArgumentParser) -> None:
    """--debug on a subcommand; SUPPRESS keeps `pyggml --debug run` from being reset by the subparser."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error and debug logging")


def add_backend_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-b", "--backend", action="append", default=None, metavar="NAME",
                        help="backend by registry name (cpu, torch, torch:cuda:0); repeat it to use several, "
                             "in priority order (default: cpu)")
    parser.add_argument("--n-layers-on", action="append", default=None, metavar="BACKEND=N",
                        help="put N layers on BACKEND (like llama.cpp's --n-gpu-layers); the layers go to the "
                             "backends in --backend order, the rest to the last one")
    parser.add_argument("-t", "--threads", type=thread_count, default=None, metavar="N",
                        help=f"threads of the CPU backend, 1..{MAX_THREADS} (default: all cores)")


def add_flash_attn(parser: argparse.ArgumentParser) -> None:
    """--flash-attn / -fa on|off|auto, as llama.cpp's."""
    parser.add_argument("-fa", "--flash-attn", dest="flash_attn", choices=("on", "off", "auto"), default="auto",
                        help="attention by FLASH_ATTN_EXT (on), by MUL_MAT and SOFT_MAX_EXT (off), or auto "
                             "(off for now: on the CPU backend flash attention measured no faster; default: auto)")


def add_check_finite(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-check-finite", dest="check_finite", action="store_false",
                        help="do not check that the logits are finite (by default NaN or inf stops with an error "
                             "naming the first tensor where it appears)")


def _int_at_least(minimum: int, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(1, text)


MAX_THREADS = 512  # ggml's GGML_MAX_N_THREADS


def thread_count(text: str) -> int:
    value = _int_at_least(1, text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_THREADS} (GGML_MAX_N_THREADS), got {value}")
    return value


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    return _int_at_least(0, text)


def backend_plan(names: Sequence[str] | None, layers_on: Sequence[str] | None) -> tuple[list[str], list[int] | None]:
    """(backend names in priority order, n_layers_on counts) from --backend and --n-layers-on.

    `--n-layers-on torch=2` without `--backend` means: torch for 2 layers, then the CPU.
    A backend named in --n-layers-on must be one of --backend's when that is given."""
    specs: list[tuple[str, int]] = []
    for spec in layers_on or []:
        name, sep, count = spec.rpartition("=")
        if not sep or not name:
            raise CLIError(f"--n-layers-on wants BACKEND=N, got {spec!r}")
        try:
            n = int(count)
        except ValueError:
            raise CLIError(f"--n-layers-on {spec!r}: {count!r} is not a layer count") from None
        if n < 0:
            raise CLIError(f"--n-layers-on {spec!r}: the layer count must be >= 0")
        specs.append((name, n))
    if names:
        backends = list(names)
    else:
        backends = list(dict.fromkeys(name for name, _ in specs))
        if not any(b.lower() == "cpu" for b in backends):
            backends.append("cpu")
    if not specs:
        return backends, None
    counts = [0] * len(backends)
    last = -1
    for name, n in specs:
        matches = [i for i, b in enumerate(backends) if b.lower() == name.lower()]
        if not matches:
            raise CLIError(f"--n-layers-on {name}={n}: '{name}' is not one of the backends ({', '.join(backends)})")
        counts[matches[0]] = n
        last = max(last, matches[0])
    return backends, counts[: last + 1]


def init_backends(names: Sequence[str], n_threads: int | None) -> list[Any]:
    """Backend objects for registry names (a CLIError for an unknown or unavailable one); `n_threads` is
    set on those whose registry sets a thread count (the CPU's)."""
    from pyggml.backend.registry import init_backend, set_n_threads

    out = []
    for name in names:
        try:
            backend = init_backend(name)
        except ArgumentError as e:
            raise CLIError(f"--backend {name}: {e}") from None
        if n_threads is not None:
            set_n_threads(backend, n_threads)
        out.append(backend)
    return out


def builtin_model_path() -> Path:
    """The GGUF file shipped inside the package (pyggml/data/builtin-llama.gguf)."""
    from pyggml.models.builtin import builtin_model_path as path_in_package

    try:
        return path_in_package()
    except GGUFError as e:
        raise CLIError(f"{e}, or give a MODEL.gguf") from None


def check_model_path(path: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise CLIError(f"no such file: '{path}'")
    if p.is_dir():
        raise CLIError(f"'{path}' is a directory, not a GGUF file")
    return p


def fmt_bytes(n: int) -> str:
    """Sizes as llama.cpp prints them (MiB for the big ones)."""
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.2f} KiB"
    return f"{n} B"


def fmt_count(n: int) -> str:
    if n >= 1_000_000_000:
        return f"{n / 1e9:.2f} B"
    if n >= 1_000_000:
        return f"{n / 1e6:.2f} M"
    if n >= 1_000:
        return f"{n / 1e3:.2f} K"
    return str(n)


def table(rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> list[str]:
    """A markdown table (first row the header); columns in `right` are right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def line(r: Sequence[str]) -> str:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        return "| " + " | ".join(cells) + " |"

    sep = "| " + " | ".join(("-" * (w - 1) + ":") if i in right else "-" * w for i, w in enumerate(widths)) + " |"
    return [line(rows[0]), sep] + [line(r) for r in rows[1:]]


def fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 1
