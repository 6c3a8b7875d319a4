"""What the subcommands share: the argument parser that fails in one line, backend options, sizes.

Errors a user can cause (a bad path, a corrupt file, a bad option value) end
in one line on stderr and a non-zero exit code; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TextIO

from pyggml.core.errors import ArgumentError, GGUFError
from pyggml.models.arch import ARCHS


class CLIError(Exception):
    """A user error found by the command line itself (its message is the one line printed)."""


class Parser(argparse.ArgumentParser):
    """argparse that takes an option only by its whole name and reports a bad one in one line, naming the
    subcommand's help.

    Without this, argparse reads `-ngl 99` as `-n gl` (a short option glued to its value) and `-o json` as
    `-ot json` (a prefix) even with allow_abbrev=False, and `--n-gpu 9` as `--n-gpu-layers 9` without it: here
    an option is only ever its exact name, or its exact name and `=VALUE`, as llama.cpp's parsers read them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _get_option_tuples(self, option_string: str) -> list[Any]:
        return []  # the options a prefix or a glued value could mean: none

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """As argparse's, but an unknown option is reported by the subcommand's parser (its name, its help)."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self._subcommand_parser(ns)
            parser.error(f"unrecognized arguments: {' '.join(extras)}{parser.close_option(extras)}")
        return ns

    def _subcommand_parser(self, ns: argparse.Namespace) -> Parser:
        for action in self._actions:
            choices = action.choices if isinstance(action, argparse._SubParsersAction) else None
            if choices is not None and getattr(ns, action.dest, None) in choices:
                sub = choices[getattr(ns, action.dest)]
                return sub._subcommand_parser(ns) if isinstance(sub, Parser) else self
        return self

    def close_option(self, words: Sequence[str]) -> str:
        """" (did you mean --ctx-size?)" for the first unknown option that is close to one of this parser's."""
        for word in words:
            if word.startswith("-"):
                close = difflib.get_close_matches(word.split("=")[0], list(self._option_string_actions), n=1,
                                                  cutoff=0.8)  # a typo, not merely another option
                if close:
                    return f" (did you mean {close[0]}?)"
        return ""


def add_debug(parser: argparse.ArgumentParser) -> None:
    """--debug on a subcommand; SUPPRESS keeps `pyggml --debug run` from being reset by the subparser."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error and debug logging")


class _ModelAction(argparse.Action):
    """MODEL.gguf and -m/--model name the same file: given twice, the parser says so."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        given = getattr(namespace, self.dest, None)
        if given is not None:
            parser.error(f"the model is given twice: '{given}' and '{values}' (give MODEL.gguf or -m, once)")
        setattr(namespace, self.dest, values)


class _ModelsAction(argparse.Action):
    """bench's models: every MODEL.gguf and -m value, each split at ',' (llama-bench's -m a.gguf,b.gguf)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        items = [values] if isinstance(values, str) else list(values)
        paths = [p for item in items for p in item.split(",") if p]
        setattr(namespace, self.dest, (getattr(namespace, self.dest, None) or []) + paths)


FAMILIES = ", ".join(ARCHS)  # the architectures (general.architecture) pyggml.models runs
GGUF_MODEL = f"GGUF model ({FAMILIES})"


def add_model(parser: argparse.ArgumentParser, what: str, several: bool = False) -> None:
    """The model file, as MODEL.gguf or llama.cpp's -m/--model (args.model: None when neither is given;
    with `several`, bench's list of them)."""
    action = _ModelsAction if several else _ModelAction
    # SUPPRESS: an absent MODEL.gguf leaves args.model to -m
    parser.add_argument("model", nargs="*" if several else "?", default=argparse.SUPPRESS, action=action,
                        metavar="MODEL.gguf", help=what)
    parser.add_argument("-m", "--model", dest="model", default=None, action=action, metavar="FILE",
                        help="the model file, as llama.cpp's -m (the same as MODEL.gguf)"
                             + ("; a comma list or repeated: each is measured" if several else ""))


# llama.cpp's KV cache types (common/arg.cpp's kv_cache_types), by the names its -ctk/-ctv take
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
DEFAULT_CACHE_TYPE = "f16"  # llama.cpp's -ctk/-ctv default
ALL_LAYERS = "all"  # -ngl all


def cache_type(text: str) -> str:
    if text not in KV_CACHE_TYPES:
        raise argparse.ArgumentTypeError(f"invalid cache type {text!r} (llama.cpp's: {', '.join(KV_CACHE_TYPES)})")
    return text


def flash_attn_mode(text: str) -> str:
    """-fa's value as llama.cpp reads it: on|enabled|true|1, off|disabled|false|0, auto|-1."""
    for mode, words in (("on", ("on", "enabled", "true", "1")), ("off", ("off", "disabled", "false", "0")),
                        ("auto", ("auto", "-1"))):
        if text in words:
            return mode
    raise argparse.ArgumentTypeError(f"invalid value {text!r} (on, off or auto)")


def gpu_layers(text: str) -> int | str | None:
    """-ngl's value: a layer count, 'all', or 'auto' (None: the placement options decide, as without -ngl)."""
    if text == "auto":
        return None
    if text == ALL_LAYERS:
        return ALL_LAYERS
    return _int_at_least(0, text)


def comma_list(parse: Any) -> Any:
    """The argparse type of a comma list whose items `parse` reads (llama-bench's lists: -t 1,2)."""
    def parse_list(text: str) -> list[Any]:
        return [parse(item) for item in text.split(",")]
    parse_list.__name__ = getattr(parse, "__name__", "list")
    return parse_list


def int_range(parse: Any) -> Any:
    """The argparse type of llama-bench's integer lists: items "N", "FIRST-LAST", "FIRST-LAST+STEP" or
    "FIRST-LAST*MULT" separated by ',' (its parse_int_range), each value checked by `parse`."""
    item = re.compile(r"(\d+)(?:-(\d+)(?:([+*])(\d+))?)?")

    def parse_range(text: str) -> list[int]:
        out: list[int] = []
        for part in text.split(","):
            m = item.fullmatch(part.strip())
            if m is None:
                raise argparse.ArgumentTypeError(f"invalid value {part!r} (N, FIRST-LAST, FIRST-LAST+STEP or "
                                                 f"FIRST-LAST*MULT, separated by ',')")
            first = int(m.group(1))
            last = int(m.group(2)) if m.group(2) is not None else first
            op, step = m.group(3) or "+", int(m.group(4) or 1)
            i = first
            while i <= last:
                out.append(parse(str(i)))
                if len(out) > MAX_LIST:
                    raise argparse.ArgumentTypeError(f"{text!r} makes more than {MAX_LIST} values")
                following = i * step if op == "*" else i + step
                if following <= i:
                    raise argparse.ArgumentTypeError(f"invalid range {part!r}: its step does not make it grow")
                i = following
        return out
    parse_range.__name__ = "list"
    return parse_range


MAX_LIST = 1024  # values a bench list may hold (a range such as 1-1000000 would make a test of each)


DEFAULT_BATCH = 2048  # llama.cpp's n_batch
DEFAULT_UBATCH = 512  # llama.cpp's n_ubatch


def _value_or_list(parse: Any, default: Any, lists: bool, ranges: bool = False) -> dict[str, Any]:
    """add_argument's keywords for one value `parse` reads, or with `lists` llama-bench's list of them: comma
    separated (ranges for integers), the option repeated adds to it, None when not given."""
    if not lists:
        return {"type": parse, "default": default}
    return {"type": int_range(parse) if ranges else comma_list(parse), "action": "extend", "default": None}


def add_backend_options(parser: argparse.ArgumentParser, lists: bool = False) -> None:
    """The options that say where a model goes and how it computes, with llama.cpp's names (run, chat, serve,
    bench); with `lists`, llama-bench's comma lists (one test of each value)."""
    many = " (a comma list: one test of each)" if lists else ""

    def listed(parse: Any, default: Any, ranges: bool = False) -> dict[str, Any]:
        return _value_or_list(parse, default, lists, ranges)

    parser.add_argument("--backend", action="append", default=None, metavar="NAME",
                        help="backend by registry name (cpu, torch, torch:cuda:0); repeat it to use several "
                             "(up to the scheduler's limit), in priority order (default: cpu)")
    parser.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", dest="n_gpu_layers",
                        **listed(gpu_layers, None), metavar="N",
                        help="layers on the first backend that is not the CPU (a count, 'all' or 'auto'), as "
                             "llama.cpp's -ngl; the rest on a CPU backend (appended to --backend when there is "
                             "none). Layers go in backend order: with the CPU listed first it takes the first "
                             "layers and N are the last, as in llama.cpp; listed after, N are the first. Without "
                             "such a backend every layer stays on the CPU (default: auto, every layer on the "
                             "first backend, or as --n-layers-on/-ts place them)" + many)
    parser.add_argument("--n-layers-on", action="append", default=None, metavar="N0,N1,...|BACKEND=N",
                        help="layer counts of the backends (like llama.cpp's --n-gpu-layers per device): "
                             "N0,N1,... for the --backend list in order, or one backend's count as NAME=N, "
                             "NAME#I=N or I=N (I its position from 0, as `run -v` labels it: CPU#1); the "
                             "layers go to the backends in order, the rest to the next one (or the last)")
    if lists:
        parser.add_argument("-ts", "--tensor-split", **listed(str, None), metavar="P0/P1/...",
                            help="layers in proportions over the --backend list, as llama-bench's -ts: proportions "
                                 "separated by '/' or ';', a comma between the splits to measure")
        parser.add_argument("-ot", "--override-tensor", **listed(str, None), metavar="REGEX=BACKEND;...",
                            help="put the weights whose name REGEX finds on BACKEND (NAME, NAME#I or I), as "
                                 "llama-bench's -ot: pairs separated by ';', a comma between the sets to measure")
    else:
        parser.add_argument("-ts", "--tensor-split", default=None, metavar="P0,P1,...",
                            help="layers in proportions over the --backend list, as llama.cpp's -ts places them "
                                 "(e.g. 1,1,2; not with --n-layers-on)")
        parser.add_argument("-ot", "--override-tensor", action="append", default=None, metavar="REGEX=BACKEND",
                            help="put the weights whose name REGEX finds on BACKEND (NAME, NAME#I or I) whatever "
                                 "their layer, as llama.cpp's -ot; repeat it, or join several with commas; the "
                                 "first that matches wins")
    parser.add_argument("-t", "--threads", **listed(thread_count, None, ranges=True), metavar="N",
                        help=f"threads of the CPU backend, 1..{MAX_THREADS} (default: the physical cores, as "
                             f"llama.cpp){many}")
    parser.add_argument("-b", "--batch-size", "--batch", dest="batch_size",
                        **listed(positive_int, DEFAULT_BATCH, ranges=True), metavar="N",
                        help=f"logical batch size, as llama.cpp's (default: {DEFAULT_BATCH}); a batch is computed "
                             f"in pieces of min(-b, -ub) tokens{many}")
    parser.add_argument("-ub", "--ubatch-size", dest="ubatch_size",
                        **listed(positive_int, DEFAULT_UBATCH, ranges=True), metavar="N",
                        help=f"physical batch size: the tokens of one graph (default: {DEFAULT_UBATCH}){many}")
    for flag, long, part in (("-ctk", "--cache-type-k", "K"), ("-ctv", "--cache-type-v", "V")):
        parser.add_argument(flag, long, **listed(cache_type, None), metavar="TYPE",
                            help=f"KV cache type of {part}, as llama.cpp's {flag} ({', '.join(KV_CACHE_TYPES)}; "
                                 f"default: {DEFAULT_CACHE_TYPE}; a quantized V needs flash attention){many}")
    parser.add_argument("-nr", "--no-repack", dest="repack", action="store_false",
                        help="keep every weight in its backend's default buffer type, as llama.cpp's --no-repack "
                             "(by default the CPU holds its Q4_0 layer matrices repacked, in CPU_REPACK)")


def add_flash_attn(parser: argparse.ArgumentParser, lists: bool = False) -> None:
    """-fa/--flash-attn on|off|auto, as llama.cpp's (with `lists`, llama-bench's comma list)."""
    parser.add_argument("-fa", "--flash-attn", dest="flash_attn", **_value_or_list(flash_attn_mode, "auto", lists),
                        metavar="on|off|auto",
                        help="attention by FLASH_ATTN_EXT (on), by MUL_MAT and SOFT_MAX_EXT (off), or auto "
                             "(off for now: on the CPU backend flash attention measured no faster; default: auto)"
                             + (" (a comma list: one test of each)" if lists else ""))


def add_check_finite(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-check-finite", dest="check_finite", action="store_false",
                        help="do not check that the logits are finite (by default NaN or inf stops with an error "
                             "naming the first tensor where it appears)")


def add_chat_template(parser: argparse.ArgumentParser) -> None:
    """--chat-template-file and --chat-template-kwargs (llama.cpp's)."""
    parser.add_argument("--chat-template-file", default=None, metavar="FILE",
                        help="a jinja chat template to use instead of the file's (as llama.cpp's option)")
    parser.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                        help='more template variables, a JSON object (e.g. \'{"enable_thinking": false}\')')


@dataclass
class ChatTemplateArgs:
    """What --chat-template-file and --chat-template-kwargs give: the template's text and name (None: the
    file's own template) and the variables."""

    source: str | None = None
    name: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


def chat_template_args(args: argparse.Namespace) -> ChatTemplateArgs:
    """The options of `add_chat_template`, read and checked (CLIError naming the option)."""
    out = ChatTemplateArgs()
    if args.chat_template_kwargs is not None:
        try:
            value = json.loads(args.chat_template_kwargs)
        except json.JSONDecodeError as e:
            raise CLIError(f"--chat-template-kwargs: not JSON: {e}") from None
        if not isinstance(value, dict):
            raise CLIError(f"--chat-template-kwargs: expected a JSON object, got {type(value).__name__}")
        from pyggml.models.chat import RESERVED_VARIABLES

        reserved = sorted(RESERVED_VARIABLES.intersection(value))
        if reserved:
            raise CLIError(f"--chat-template-kwargs: {reserved[0]!r} is not a variable the command line may set")
        out.kwargs = value
    if args.chat_template_file is not None:
        try:
            with open(args.chat_template_file, encoding="utf-8") as f:
                out.source = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise CLIError(f"--chat-template-file: cannot read '{args.chat_template_file}': {e}") from None
        out.name = f"'{args.chat_template_file}'"
    return out


def add_ctx_size(parser: argparse.ArgumentParser, default: str) -> None:
    """-c/--ctx-size (llama.cpp's; --ctx, pyggml's name, too): 0 is the model's training context."""
    parser.add_argument("-c", "--ctx-size", "--ctx", dest="ctx", type=non_negative_int, default=None, metavar="N",
                        help=f"context size in tokens, 0 the model's training context (default: {default})")


def context_size(ctx: int | None, n_ctx_train: int, default: int) -> int:
    """The context of -c: N tokens, 0 the model's training context (llama.cpp's), None `default`."""
    return default if ctx is None else ctx or n_ctx_train


def warn_context(n_ctx_seq: int, n_ctx_train: int, prog: str, err: TextIO) -> None:
    """llama.cpp's warning (llama_context's, in its words) when a sequence's context exceeds the model's
    training context."""
    if n_ctx_seq > n_ctx_train:
        print(f"{prog}: warning: n_ctx_seq ({n_ctx_seq}) > n_ctx_train ({n_ctx_train}) -- possible training "
              f"context overflow", file=err)


def n_predict(text: str) -> int:
    """-n's value: tokens to generate, -1 without a limit (llama.cpp's)."""
    return _int_at_least(-1, text)


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
    n_gpu_layers: int | str | None = None  # -ngl: a count, ALL_LAYERS, or None (auto: the other options decide)

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

    def load_kwargs(self, backends: Sequence[Any] | None = None, n_layer: int | None = None) -> dict[str, Any]:
        """The placement keywords of `pyggml.models.load` for these backends (CLIError for a bad name); -ngl
        needs the backends and the model's `n_layer`."""
        kw: dict[str, Any] = {"n_layers_on": self.n_layers_on(backends), "repack": self.repack}
        if self.tensor_split is not None:
            kw["tensor_split"] = self.tensor_split
        if self.override_tensor:
            kw["override_tensor"] = self.overrides(backends)
        counts = self.gpu_layer_counts(backends, n_layer) if backends is not None and n_layer is not None else None
        if counts is not None:
            kw["n_layers_on"] = counts
        return kw

    def gpu_layer_counts(self, backends: Sequence[Any], n_layer: int) -> list[int] | None:
        """-ngl as layer counts by position: its layers on the first backend that is not the CPU, the rest on a
        CPU: the first one before it (which then takes the first layers, as in llama.cpp, where the offloaded
        layers are the last), else the first after it (`init` appends one when none is there). None when -ngl
        decides nothing: auto, no such backend, or every layer offloaded while --n-layers-on or -ts place them
        (any fewer with those is a CLIError: two options would place the same layers)."""
        g = offload_index(backends)
        if self.n_gpu_layers is None or g is None:
            return None
        n = n_layer if self.n_gpu_layers == ALL_LAYERS else min(int(self.n_gpu_layers), n_layer)
        if self.layers_on or self.tensor_split is not None:
            if n < n_layer:
                other = "--n-layers-on" if self.layers_on else "--tensor-split"
                raise CLIError(f"-ngl {self.n_gpu_layers} and {other} both place the layers ({n} of {n_layer} on "
                               f"the first backend that is not the CPU, or {other}'s): give one")
            return None
        if n == n_layer:
            return [0] * g + [n]
        cpu = next((i for i, b in enumerate(backends) if has_cpu_device(b)), None)
        if cpu is not None and cpu < g:
            return [0] * cpu + [n_layer - n] + [0] * (g - cpu - 1) + [n]
        cpu = next(i for i in range(g + 1, len(backends)) if has_cpu_device(backends[i]))
        return [0] * g + [n] + [0] * (cpu - g - 1)

    def init(self, n_threads: int | None, n_layer: int) -> list[Any]:
        """The backends of the plan (`init_backends`), with a CPU backend appended when -ngl leaves layers and
        no CPU is there to take them (llama.cpp keeps them on the CPU)."""
        backends = init_backends(self.names, n_threads)
        if self.n_gpu_layers in (None, ALL_LAYERS) or int(self.n_gpu_layers) >= n_layer or self.layers_on \
                or self.tensor_split is not None or offload_index(backends) is None \
                or any(map(has_cpu_device, backends)):
            return backends
        self.names.append("cpu")
        return backends + init_backends(["cpu"], n_threads)

    def offload_note(self, backends: Sequence[Any]) -> str | None:
        """What to say when -ngl asks for layers and no backend but the CPU is there (llama.cpp warns too)."""
        if self.n_gpu_layers in (None, 0) or offload_index(backends) is not None:
            return None
        return (f"-ngl {self.n_gpu_layers}: no backend but the CPU (give one with --backend): every layer stays on "
                f"the CPU")


def has_cpu_device(backend: Any) -> bool:
    """Whether the backend's device is a CPU (ggml's device type; a backend without a device is not one)."""
    from pyggml.ggml_backend.device import DeviceType

    device = backend.get_device()
    return device is not None and device.type() == DeviceType.CPU


def offload_index(backends: Sequence[Any]) -> int | None:
    """The position of the first backend that is not a CPU (-ngl's target), None when all are."""
    return next((i for i, b in enumerate(backends) if not has_cpu_device(b)), None)


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
    from pyggml.sched.backend_sched import GGML_SCHED_MAX_BACKENDS

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
    plan.n_gpu_layers = getattr(args, "n_gpu_layers", None)
    return plan


def backend_plan(names: Sequence[str] | None, layers_on: Sequence[str] | None) -> tuple[list[str], list[int] | None]:
    """(backend names in priority order, n_layers_on counts) from --backend and --n-layers-on, names
    matched against the registry names."""
    plan = backend_plan_of(names, layers_on)
    return plan.names, plan.n_layers_on()


def init_backends(names: Sequence[str], n_threads: int | None) -> list[Any]:
    """Backend objects for registry names (a CLIError for an unknown or unavailable one); `n_threads` is
    set on those whose registry sets a thread count (the CPU's)."""
    from pyggml.ggml_backend.registry import init_backend, set_n_threads

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


@dataclass
class LoadSettings:
    """How a model computes, as llama.cpp's context options say it: -b/-ub (a batch is computed in pieces of
    min(n_batch, n_ubatch) tokens, as llama_context clamps n_ubatch), -ctk/-ctv, -fa, and the finite check."""

    n_batch: int = DEFAULT_BATCH
    n_ubatch: int = DEFAULT_UBATCH
    type_k: str | None = None
    type_v: str | None = None
    flash_attn: str = "auto"
    check_finite: bool = True

    def kv_types(self) -> tuple[str, str]:
        """The KV cache's K and V types (llama.cpp's default f16 for one not given); CLIError for a quantized V
        with -fa off, in llama.cpp's words."""
        from pyggml.core.types import TYPE_TRAITS, as_type

        type_k, type_v = self.type_k or DEFAULT_CACHE_TYPE, self.type_v or DEFAULT_CACHE_TYPE
        if TYPE_TRAITS[as_type(type_v)].is_quantized and self.flash_attn == "off":
            raise CLIError(f"-ctv {type_v} -fa off: quantized V cache requires flash_attn to be enabled")
        return type_k, type_v

    def load_kwargs(self) -> dict[str, Any]:
        """The keywords of `pyggml.models.load` (the KV type checked)."""
        kw: dict[str, Any] = {"n_batch": min(self.n_batch, self.n_ubatch), "flash_attn": self.flash_attn,
                              "check_finite": self.check_finite}
        kw["kv_type"], kw["kv_type_v"] = self.kv_types()
        return kw


def settings_from_args(args: argparse.Namespace) -> LoadSettings:
    """The LoadSettings of run's, chat's or serve's options."""
    return LoadSettings(args.batch_size, args.ubatch_size, args.cache_type_k, args.cache_type_v, args.flash_attn,
                        args.check_finite)


def read_hparams(path: Path) -> Any:
    """The model's hyper-parameters from the file's header (checked: a bad file fails here, naming the key)."""
    from pyggml.gguf.reader import read_gguf
    from pyggml.models import HParams

    gf = read_gguf(path)
    try:
        return HParams.from_gguf(gf)
    finally:
        gf.close()


def load_model(path: Path, plan: BackendPlan, settings: LoadSettings, n_ctx: int, n_layer: int,
               n_threads: int | None, err: TextIO, prog: str, verbose: bool = False, **load_extra: Any) -> Any:
    """The model loaded as the options say: the backends of `plan` (-ngl's CPU appended), its placement,
    the settings (and `load_extra`, more keywords of `pyggml.models.load`); the options' checks come first,
    so a bad one fails before any weight is read. The loading's progress bar shows on a terminal, or
    elsewhere with `verbose`."""
    from pyggml.models import load

    load_kw = settings.load_kwargs()
    backends = plan.init(n_threads, n_layer)
    place_kw = plan.load_kwargs(backends, n_layer)
    note = plan.offload_note(backends)
    if note:
        print(f"{prog}: warning: {note}", file=err)
    return load(path, backends, n_ctx=n_ctx, **place_kw, **load_kw, **load_extra, progress=verbose or err.isatty())


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


def file_type_name(code: Any) -> str | None:
    """general.file_type by llama.cpp's name of it (Q4_1, F16, Q4_K_M), None when the file has no valid one."""
    try:
        import gguf

        name = gguf.LlamaFileType(int(code)).name
    except (ValueError, TypeError, AttributeError, ImportError):
        return None
    return "all F32" if name == "ALL_F32" else name.removeprefix("MOSTLY_")


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
