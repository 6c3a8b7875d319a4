"""What the subcommands share: the argument parser that fails in one line, backend options, sizes.

Errors a user can cause (a bad path, a corrupt file, a bad option value) end
in one line on stderr and a non-zero exit code; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
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
                        help="backend by registry name (cpu, torch, torch:cuda:0); repeat it to use several "
                             "(up to the scheduler's limit), in priority order (default: cpu)")
    parser.add_argument("--n-layers-on", action="append", default=None, metavar="N0,N1,...|BACKEND=N",
                        help="layer counts of the backends (like llama.cpp's --n-gpu-layers per device): "
                             "N0,N1,... for the --backend list in order, or one backend's count as NAME=N, "
                             "NAME#I=N or I=N (I its position from 0, as `run -v` labels it: CPU#1); the "
                             "layers go to the backends in order, the rest to the next one (or the last)")
    parser.add_argument("-ts", "--tensor-split", default=None, metavar="P0,P1,...",
                        help="layers in proportions over the --backend list, as llama.cpp's -ts places them "
                             "(e.g. 1,1,2; not with --n-layers-on)")
    parser.add_argument("-ot", "--override-tensor", action="append", default=None, metavar="REGEX=BACKEND",
                        help="put the weights whose name REGEX finds on BACKEND (NAME, NAME#I or I) whatever "
                             "their layer, as llama.cpp's -ot; repeat it, or join several with commas; the "
                             "first that matches wins")
    parser.add_argument("-t", "--threads", type=thread_count, default=None, metavar="N",
                        help=f"threads of the CPU backend, 1..{MAX_THREADS} (default: all cores)")
    parser.add_argument("-nr", "--no-repack", dest="repack", action="store_false",
                        help="keep every weight in its backend's default buffer type, as llama.cpp's --no-repack "
                             "(by default the CPU holds its Q4_0 layer matrices repacked, in CPU_REPACK)")


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


LayerSpec = tuple[str, int | str, int]  # (the --n-layers-on text, backend position or name, layer count)


def _layer_count(spec: str, text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise CLIError(f"--n-layers-on {spec!r}: {text.strip()!r} is not a layer count") from None
    if n < 0:
        raise CLIError(f"--n-layers-on {spec!r}: the layer count must be >= 0, got {n}")
    return n


def parse_layers_on(spec: str) -> list[LayerSpec]:
    """One --n-layers-on value: "N0,N1,..." (counts by position), "I=N", "NAME#I=N" or "NAME=N".
    The name is kept as text (resolved against the backends later); a name may hold '=' itself
    ("torch:cpu,matmul_precision=f32=1"), so the count is what follows the last '='."""
    if "=" not in spec:
        items = spec.split(",")
        if len(items) == 1 and not items[0].strip().lstrip("+-").isdigit():
            raise CLIError(f"--n-layers-on wants BACKEND=N (or NAME#I=N, I=N, N0,N1,...), got {spec!r}")
        return [(spec, i, _layer_count(spec, text)) for i, text in enumerate(items)]
    name, _, count = spec.rpartition("=")
    if not name.strip():
        raise CLIError(f"--n-layers-on wants BACKEND=N (or NAME#I=N, I=N, N0,N1,...), got {spec!r}")
    n = _layer_count(spec, count)
    return [(spec, int(name) if name.strip().isdigit() else name.strip(), n)]


def parse_tensor_split(text: str, n_backends: int) -> list[float]:
    """--tensor-split: proportions separated by ',' or '/' (as llama.cpp's -ts), one per backend."""
    from pyggml.models.placement import check_tensor_split  # here: `pyggml --help` need not import the models

    values = []
    for item in re.split(r"[,/]+", text.strip()):
        try:
            values.append(float(item))
        except ValueError:
            raise CLIError(f"--tensor-split {text!r}: {item!r} is not a number") from None
    try:
        return check_tensor_split(values, n_backends, f"--tensor-split {text!r}")
    except ArgumentError as e:
        raise CLIError(str(e)) from None


@dataclass
class BackendPlan:
    """The backend options as given: the --backend list and the placement, checked for syntax.
    `load_kwargs` turns names and positions into the `load` keywords once the backends exist (so that
    the backends' own names, "CPU#1" as `run -v` prints them, name them too)."""

    names: list[str]
    layers_on: list[LayerSpec] = field(default_factory=list)
    tensor_split: list[float] | None = None
    override_tensor: list[str] = field(default_factory=list)
    repack: bool = True

    def aliases(self, backends: Sequence[Any] | None = None) -> list[list[str]]:
        """The names each backend answers to: its registry name, and the backend's own ("CPU", "Torch(cpu)")."""
        out = [[name] for name in self.names]
        for names, b in zip(out, backends or [], strict=False):
            if b.name().lower() != names[0].lower():
                names.append(b.name())
        return out

    def n_layers_on(self, backends: Sequence[Any] | None = None) -> list[int] | None:
        """The layer counts by position (None: no --n-layers-on), each backend named at most once."""
        if not self.layers_on:
            return None
        from pyggml.models.placement import backend_index, backend_label, backend_labels

        aliases = self.aliases(backends)
        n = len(self.names)
        given: dict[int, tuple[int, str]] = {}
        for spec, target, count in self.layers_on:
            if isinstance(target, int) and target >= n and "=" not in spec:
                raise CLIError(f"--n-layers-on {spec!r}: {len(spec.split(','))} counts for {n} backend(s) "
                               f"({backend_labels(aliases)})")
            try:
                i = backend_index(target, aliases, f"--n-layers-on {spec}")
            except ArgumentError as e:
                raise CLIError(str(e)) from None
            if i in given:
                raise CLIError(f"--n-layers-on gives backend {i} ({backend_label(aliases, i)}) two counts: "
                               f"{given[i][0]} (in {given[i][1]!r}) and {count} (in {spec!r})")
            given[i] = (count, spec)
        return [given[i][0] if i in given else 0 for i in range(max(given) + 1)]

    def overrides(self, backends: Sequence[Any] | None = None) -> list[tuple[str, int]]:
        """(regex, backend position) of each --override-tensor item, the regex checked."""
        from pyggml.models.placement import backend_index

        aliases = self.aliases(backends)
        out: list[tuple[str, int]] = []
        for value in self.override_tensor:
            for pattern, target in split_overrides(value, aliases):
                i = backend_index(target, aliases, "--override-tensor")  # split_overrides checked it
                try:
                    re.compile(pattern)
                except re.error as e:
                    raise CLIError(f"--override-tensor {value!r}: bad regex {pattern!r}: {e}") from None
                out.append((pattern, i))
        return out

    def load_kwargs(self, backends: Sequence[Any] | None = None) -> dict[str, Any]:
        """The placement keywords of `pyggml.models.load` for these backends (CLIError for a bad name)."""
        kw: dict[str, Any] = {"n_layers_on": self.n_layers_on(backends), "repack": self.repack}
        if self.tensor_split is not None:
            kw["tensor_split"] = self.tensor_split
        if self.override_tensor:
            kw["override_tensor"] = self.overrides(backends)
        return kw


def split_overrides(value: str, aliases: Sequence[Sequence[str]]) -> list[tuple[str, str]]:
    """The (regex, backend) pairs of one --override-tensor value, "REGEX=BACKEND[,REGEX=BACKEND...]".

    llama.cpp splits the value at every ',' and each part at its first '='; here a regex may hold ','
    ("blk\\.[0-9]{1,2}\\.") or '=' and a backend name may hold both ("torch:cpu,matmul_precision=f32"),
    so a pair ends where a backend the list knows ends: the first '=' followed by a backend name (the
    longest that ends at a ',' or the end) closes the regex."""
    from pyggml.models.placement import backend_index, backend_labels

    def is_backend(text: str) -> bool:
        try:
            backend_index(text, aliases, "--override-tensor")
        except ArgumentError:
            return False
        return True

    out: list[tuple[str, str]] = []
    rest = value
    while True:
        found = None
        for eq in (i for i, c in enumerate(rest) if c == "="):
            tail = rest[eq + 1:]
            ends = [len(tail)] + [k for k in range(len(tail) - 1, -1, -1) if tail[k] == ","]
            end = next((e for e in ends if tail[:e].strip() and is_backend(tail[:e])), None)
            if end is not None:
                found = (rest[:eq], tail[:end].strip(), tail[end + 1:] if end < len(tail) else None)
                break
        if found is None:
            pattern, sep, target = rest.split(",")[0].partition("=") if "=" in rest else (rest, "", "")
            if not sep:
                raise CLIError(f"--override-tensor wants REGEX=BACKEND, got {value!r}")
            where = f"--override-tensor {value!r}"
            if not target.strip():
                raise CLIError(f"{where}: no backend after '=' (one of {backend_labels(aliases)})")
            try:
                backend_index(target.strip(), aliases, where)
            except ArgumentError as e:
                raise CLIError(str(e)) from None
            raise CLIError(f"{where}: no REGEX=BACKEND pair in {rest!r} ends with a backend "
                           f"({backend_labels(aliases)}) and a ',' or the end")
        out.append((found[0], found[1]))
        if found[2] is None:
            return out
        rest = found[2]


def backend_plan_of(names: Sequence[str] | None, layers_on: Sequence[str] | None = None,
                    tensor_split: str | None = None, override_tensor: Sequence[str] | None = None) -> BackendPlan:
    """The BackendPlan of the options (CLIError for bad syntax, a split of the wrong length, too many
    backends, or --tensor-split with --n-layers-on).

    Without --backend the list is the backends --n-layers-on names (NAME=N), then the CPU:
    `--n-layers-on torch=2` means torch for 2 layers, then the CPU."""
    from pyggml.sched.sched import GGML_SCHED_MAX_BACKENDS

    specs = [item for spec in layers_on or [] for item in parse_layers_on(spec)]
    if tensor_split is not None and specs:
        raise CLIError("--tensor-split and --n-layers-on both given: use one (proportions or layer counts)")
    if names:
        backends = list(names)
    else:
        backends = list(dict.fromkeys(t for _, t, _ in specs if isinstance(t, str) and "#" not in t))
        if not any(b.lower() == "cpu" for b in backends):
            backends.append("cpu")
    if len(backends) > GGML_SCHED_MAX_BACKENDS:
        raise CLIError(f"--backend: {len(backends)} backends exceed GGML_SCHED_MAX_BACKENDS = "
                       f"{GGML_SCHED_MAX_BACKENDS} (the scheduler's limit)")
    for value in override_tensor or []:
        if "=" not in value:
            raise CLIError(f"--override-tensor wants REGEX=BACKEND, got {value!r}")
    split = parse_tensor_split(tensor_split, len(backends)) if tensor_split is not None else None
    return BackendPlan(backends, specs, split, list(override_tensor or []))


def plan_from_args(args: argparse.Namespace) -> BackendPlan:
    """The BackendPlan of a subcommand's backend options."""
    plan = backend_plan_of(args.backend, args.n_layers_on, getattr(args, "tensor_split", None),
                           getattr(args, "override_tensor", None))
    plan.repack = getattr(args, "repack", True)
    return plan


def backend_plan(names: Sequence[str] | None, layers_on: Sequence[str] | None) -> tuple[list[str], list[int] | None]:
    """(backend names in priority order, n_layers_on counts) from --backend and --n-layers-on, names
    matched against the registry names."""
    plan = backend_plan_of(names, layers_on)
    return plan.names, plan.n_layers_on()


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
