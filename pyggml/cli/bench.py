"""`pyggml bench [MODEL.gguf] [-p 512] [-n 128] [-r 5] [-o md|csv|json|jsonl]`: prompt and generation speed,
as llama-bench.

What llama-bench measures and this repeats: `pp<P>` evaluates P random tokens on an empty cache (prompt
processing, in pieces of min(-b, -ub) tokens), `tg<N>` decodes N tokens one at a time after a BOS token
(text generation), `pp<P>+tg<N>` (-pg) both, timed together; `@ d<D>` (-d) after D tokens already in the
cache (evaluated, untimed, before each repetition). Its options take comma lists (`-p 64,128 -t 1,2`) and
every combination is a test, in llama-bench's order; a model is loaded once for the tests that share it.
One untimed warm-up run of each test first (it plans graphs and touches the mapped weights), then `-r`
timed repetitions, written as llama-bench writes them: a markdown table of mean ± standard deviation of
tokens/s, or its fields as csv, json or jsonl. Without MODEL it measures the built-in model.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from pyggml.cli._common import (
    ALL_LAYERS,
    DEFAULT_BATCH,
    DEFAULT_UBATCH,
    GGUF_MODEL,
    CLIError,
    LoadSettings,
    add_backend_options,
    add_check_finite,
    add_debug,
    add_flash_attn,
    add_model,
    backend_plan_of,
    builtin_model_path,
    check_model_path,
    file_type_name,
    fmt_bytes,
    fmt_count,
    int_range,
    load_model,
    non_negative_int,
    positive_int,
    read_hparams,
    table,
)

DEFAULT_N_PROMPT = 512  # llama-bench's defaults
DEFAULT_N_GEN = 128
DEFAULT_REPETITIONS = 5
OUTPUTS = ("md", "csv", "json", "jsonl")
FLASH_ATTN_TYPE = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type, as llama-bench writes it
N_GPU_LAYERS_FIELD = {None: -1, ALL_LAYERS: -2}  # llama.cpp's -ngl auto and all


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="measure prompt and generation tokens/s (like llama-bench)",
                       description="Measure prompt processing (pp: P random tokens in one go) and text generation "
                                   "(tg: N tokens one by one) in tokens/s, as mean ± std over repetitions after a "
                                   "warm-up run, like llama.cpp's llama-bench. Options marked 'comma list' take "
                                   "several values (or are repeated): every combination is a test.")
    add_model(p, f"{GGUF_MODEL} files (default: the built-in model)", several=True)
    p.add_argument("-p", "--n-prompt", type=int_range(non_negative_int), action="extend", default=None, metavar="P",
                   help=f"prompt tokens of the pp tests, 0 none (default: {DEFAULT_N_PROMPT}); a comma list of "
                        f"values or FIRST-LAST[+STEP|*MULT] ranges, as llama-bench's")
    p.add_argument("-n", "--n-gen", type=int_range(non_negative_int), action="extend", default=None, metavar="N",
                   help=f"generated tokens of the tg tests, 0 none (default: {DEFAULT_N_GEN}); a comma list")
    p.add_argument("-pg", type=prompt_gen, action="append", default=None, metavar="PP,TG",
                   help="a test of PP prompt tokens then TG generated ones, timed together (pp<PP>+tg<TG>); repeat it "
                        "for several")
    p.add_argument("-d", "--n-depth", type=int_range(non_negative_int), action="extend", default=None, metavar="D",
                   help="tokens already in the KV cache when each test starts (default: 0); a comma list")
    p.add_argument("-r", "--repetitions", type=positive_int, default=DEFAULT_REPETITIONS, metavar="R",
                   help=f"timed repetitions of each test (default: {DEFAULT_REPETITIONS})")
    p.add_argument("-o", "--output", choices=OUTPUTS, default="md",
                   help="what stdout gets: llama-bench's markdown table, or its fields as csv, json or jsonl "
                        "(default: md)")
    add_backend_options(p, lists=True)
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the random tokens (default: 0)")
    add_check_finite(p)
    add_flash_attn(p, lists=True)
    add_debug(p)
    return p


def prompt_gen(text: str) -> tuple[int, int]:
    """-pg's value: "PP,TG"."""
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"wants PP,TG (two token counts), got {text!r}")
    return non_negative_int(parts[0]), non_negative_int(parts[1])


@dataclass(frozen=True)
class Test:
    """One test of the combinations: what is loaded (`load_key`), the threads, and what is timed."""

    model: str
    n_gpu_layers: int | str | None
    tensor_split: str | None
    override_tensor: str | None
    n_batch: int
    n_ubatch: int
    type_k: str | None
    type_v: str | None
    flash_attn: str
    n_threads: int | None
    n_depth: int
    n_prompt: int
    n_gen: int

    def load_key(self) -> tuple[Any, ...]:
        """What the loaded model depends on (tests that share it share the model)."""
        return (self.model, self.n_gpu_layers, self.tensor_split, self.override_tensor, self.n_batch,
                self.n_ubatch, self.type_k, self.type_v, self.flash_attn)

    def n_ctx(self) -> int:
        return self.n_depth + self.n_prompt + self.n_gen  # llama-bench's context

    def name(self) -> str:
        """The test column: pp512, tg128, pp512+tg128, with " @ d<D>" after a depth."""
        if self.n_gen == 0:
            name = f"pp{self.n_prompt}"
        elif self.n_prompt == 0:
            name = f"tg{self.n_gen}"
        else:
            name = f"pp{self.n_prompt}+tg{self.n_gen}"
        return name + (f" @ d{self.n_depth}" if self.n_depth else "")


def _given(values: list[Any] | None, default: Any) -> list[Any]:
    return values if values else [default]


def tests_of(args: argparse.Namespace, models: list[str]) -> list[Test]:
    """Every combination of the options' values, in llama-bench's order (get_cmd_params_instances): for each
    model, -ngl, -ts, -ot, -b, -ub, -ctk, -ctv, -fa, -t and -d, the pp tests, then the tg tests, then -pg's."""
    prompts = _given(args.n_prompt, DEFAULT_N_PROMPT)
    gens = _given(args.n_gen, DEFAULT_N_GEN)
    out: list[Test] = []
    for combo in itertools.product(models, _given(args.n_gpu_layers, None), _given(args.tensor_split, None),
                                   _given(args.override_tensor, None), _given(args.batch_size, DEFAULT_BATCH),
                                   _given(args.ubatch_size, DEFAULT_UBATCH), _given(args.cache_type_k, None),
                                   _given(args.cache_type_v, None), _given(args.flash_attn, "auto"),
                                   _given(args.threads, None), _given(args.n_depth, 0)):
        sizes = [(p, 0) for p in prompts if p] + [(0, n) for n in gens if n]
        sizes += [(p, n) for p, n in args.pg or [] if p or n]
        out += [Test(*combo, n_prompt=p, n_gen=n) for p, n in sizes]
    return out


def _plan(args: argparse.Namespace, test: Test) -> Any:
    """The BackendPlan of a test: --backend and --n-layers-on, its -ts and -ot sets (llama-bench's: '/' or ';'
    between proportions, ';' between overrides), -ngl and --no-repack."""
    split = test.tensor_split.replace(";", "/") if test.tensor_split is not None else None
    overrides = [o for o in (test.override_tensor or "").split(";") if o]
    plan = backend_plan_of(args.backend, args.n_layers_on, split, overrides)
    plan.repack = args.repack
    plan.n_gpu_layers = test.n_gpu_layers
    return plan


def _settings(args: argparse.Namespace, test: Test) -> LoadSettings:
    return LoadSettings(test.n_batch, test.n_ubatch, test.type_k, test.type_v, test.flash_attn, args.check_finite)


def _time_tg(model: Any, first: int, tokens: np.ndarray) -> None:
    """llama-bench's test_gen: decode `first`, then one token at a time (the next ids are random,
    so the time does not depend on what the model writes)."""
    model.eval_last([first])
    for tok in tokens[:-1]:
        model.eval_last([int(tok)])


def _run_once(model: Any, test: Test, rng: np.random.Generator, first: int) -> int:
    """One repetition: the depth's tokens untimed, then the test; its nanoseconds."""
    n_vocab = model.hparams.n_vocab
    model.reset()
    if test.n_depth:
        model.eval_last(rng.integers(0, n_vocab, test.n_depth))
    prompt = rng.integers(0, n_vocab, test.n_prompt)
    gen = rng.integers(0, n_vocab, test.n_gen)
    t0 = time.perf_counter_ns()
    if test.n_prompt:
        model.eval_last(prompt)  # llama-bench's test_prompt: the batch's logits of its last token only
    if test.n_gen:
        _time_tg(model, first, gen)
    return time.perf_counter_ns() - t0


def _backend_names(model: Any) -> str:
    """The backend column: the names in order joined by '+', a run of one name as NAME×K ("CPU×3+Torch(cpu)")
    so that many backends stay readable."""
    runs: list[list[Any]] = []
    for b in model.backends:
        if runs and runs[-1][0] == b.name():
            runs[-1][1] += 1
        else:
            runs.append([b.name(), 1])
    return "+".join(name if k == 1 else f"{name}×{k}" for name, k in runs)


def _layer_counts(model: Any) -> str:
    """The layers of each backend, in --backend order, as llama-bench writes a split: "1/1/2"."""
    return "/".join(str(sum(x is b for x in model.layer_backend)) for b in model.backends)


def _device_info(model: Any, cpu: bool) -> str:
    """llama-bench's cpu_info (the CPU and ACCEL devices' descriptions) or gpu_info (the others')."""
    from pyggml.ggml_backend.device import DeviceType

    out: list[str] = []
    for b in model.backends:
        device = b.get_device()
        if device is not None and (device.type() in (DeviceType.CPU, DeviceType.ACCEL)) == cpu:
            if device.description() not in out:
                out.append(device.description())
    return ", ".join(out)


def _tensor_split_field(test: Test) -> str:
    """llama-bench's tensor_split: each proportion as %.2f up to the last non-zero, '/' between ("0.00": none)."""
    if test.tensor_split is None:
        return "0.00"
    values = [float(x) for x in test.tensor_split.replace(";", "/").replace(",", "/").split("/") if x.strip()]
    last = max((i for i, x in enumerate(values) if x > 0), default=0)
    return "/".join(f"{x:.2f}" for x in values[:last + 1])


def _model_type(model: Any) -> str:
    """llama_model_desc's "ARCH SIZE FTYPE" (the size from the parameter count)."""
    hp = model.hparams
    ftype = file_type_name(model.file.get("general.file_type", None)) or "?"
    return f"{hp.arch.name} {fmt_count(_n_params(model)).replace(' ', '')} {ftype}"


def _n_params(model: Any) -> int:
    return sum(t.nelements() for t in model.file)


def result_fields(test: Test, model: Any, test_time: str, samples_ns: list[int], repack: bool) -> dict[str, Any]:
    """A test's measurements and what it ran on, as llama-bench's fields (test::get_fields, the ones pyggml has,
    in its order, then samples_ns and samples_ts); taken when the test ends (the threads change between tests)."""
    from pyggml import __version__

    ns = np.array(samples_ns, dtype=np.float64)
    ts = 1e9 * (test.n_prompt + test.n_gen) / ns
    return {
        "build_commit": f"pyggml {__version__}", "cpu_info": _device_info(model, True),
        "gpu_info": _device_info(model, False), "backends": _backend_names(model),
        "model_filename": test.model, "model_type": _model_type(model),
        "model_size": sum(t.nbytes for t in model.file), "model_n_params": _n_params(model),
        "n_batch": test.n_batch, "n_ubatch": test.n_ubatch, "n_threads": _threads(model),
        "type_k": model.kv.type_k.name.lower(), "type_v": model.kv.type_v.name.lower(),
        "n_gpu_layers": N_GPU_LAYERS_FIELD.get(test.n_gpu_layers, test.n_gpu_layers),
        "flash_attn": FLASH_ATTN_TYPE[test.flash_attn], "tensor_split": _tensor_split_field(test),
        "tensor_buft_overrides": test.override_tensor or "none", "repack": repack,
        "n_prompt": test.n_prompt, "n_gen": test.n_gen, "n_depth": test.n_depth, "test_time": test_time,
        "avg_ns": int(ns.mean()), "stddev_ns": int(ns.std(ddof=1)) if len(ns) > 1 else 0,
        "avg_ts": float(ts.mean()), "stddev_ts": float(ts.std(ddof=1)) if len(ts) > 1 else 0.0,
        "samples_ns": list(samples_ns), "samples_ts": [float(x) for x in ts],
    }


def _threads(model: Any) -> int | str:
    """The CPU backends' thread counts (one number when they agree, as llama-bench's n_threads)."""
    counts = list(dict.fromkeys(b.n_threads for b in model.backends if hasattr(b, "n_threads")))
    if not counts:
        return "-"
    return counts[0] if len(counts) == 1 else ",".join(str(c) for c in counts)


class Printer:
    """llama-bench's printers: markdown (a table once every test is done), csv, json and jsonl (a test as it ends)."""

    def __init__(self, kind: str, args: argparse.Namespace, out: TextIO) -> None:
        self.kind, self.args, self.out = kind, args, out
        self.rows: list[tuple[Test, dict[str, Any], str]] = []  # each test, its fields, its layers column

    def header(self) -> None:
        if self.kind == "json":
            self.out.write("[\n")

    def add(self, test: Test, fields: dict[str, Any], layers: str) -> None:
        self.rows.append((test, fields, layers))
        if self.kind == "csv":
            if len(self.rows) == 1:
                self.out.write(",".join(fields) + "\n")
            self.out.write(",".join(_csv(v) for v in fields.values()) + "\n")
        elif self.kind == "json":
            body = ",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in fields.items())
            self.out.write(("" if len(self.rows) == 1 else ",\n") + "  {\n" + body + "\n  }")
        elif self.kind == "jsonl":
            self.out.write(json.dumps(fields) + "\n")
        self.out.flush()

    def footer(self) -> None:
        if self.kind == "json":
            self.out.write("\n]\n")
        elif self.kind == "md" and self.rows:
            for line in self.markdown():
                print(line, file=self.out)
        self.out.flush()

    def markdown(self) -> list[str]:
        """llama-bench's table: model, size, params, backend, a column for each option given a value other than
        its default (ngl, n_batch, n_ubatch, type_k, type_v, fa, ts, ot), threads, test, t/s; "layers" (each
        backend's layer count) when a model sits on several backends."""
        args = self.args
        shown = {"ngl": bool(args.n_gpu_layers), "layers": any("/" in layers for _, _, layers in self.rows),
                 "threads": True, "n_batch": _not_default(args.batch_size, DEFAULT_BATCH),
                 "n_ubatch": _not_default(args.ubatch_size, DEFAULT_UBATCH), "type_k": bool(args.cache_type_k),
                 "type_v": bool(args.cache_type_v), "fa": _not_default(args.flash_attn, "auto"),
                 "ts": bool(args.tensor_split), "ot": bool(args.override_tensor)}
        columns = [name for name, show in shown.items() if show]
        rows = [["model", "size", "params", "backend", *columns, "test", "t/s"]]
        for test, f, layers in self.rows:
            cells = {"ngl": f["n_gpu_layers"], "layers": layers, "threads": f["n_threads"],
                     "n_batch": f["n_batch"], "n_ubatch": f["n_ubatch"], "type_k": f["type_k"], "type_v": f["type_v"],
                     "fa": f["flash_attn"], "ts": f["tensor_split"], "ot": f["tensor_buft_overrides"]}
            rows.append([Path(test.model).name, fmt_bytes(f["model_size"]), fmt_count(f["model_n_params"]),
                         f["backends"], *(str(cells[c]) for c in columns), test.name(),
                         f"{f['avg_ts']:.2f} ± {f['stddev_ts']:.2f}"])
        numbers = {"ngl", "layers", "threads", "n_batch", "n_ubatch", "fa"}  # right-aligned, as llama-bench's
        right = [1, 2, *(4 + i for i, c in enumerate(columns) if c in numbers), len(rows[0]) - 1]
        return table(rows, right=right)


def _not_default(values: list[Any] | None, default: Any) -> bool:
    return bool(values) and values != [default]


def _csv(value: Any) -> str:
    """llama-bench's csv cell: in double quotes, a quote doubled."""
    text = json.dumps(value) if isinstance(value, list) else str(value).lower() if isinstance(value, bool) \
        else str(value)
    return '"' + text.replace('"', '""') + '"'


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout  # looked up per call: tests and callers swap sys.stdout
    err = err or sys.stderr
    from pyggml.ggml_backend.registry import set_n_threads

    models = args.model or [str(builtin_model_path())]
    paths = {m: check_model_path(m) for m in models}
    tests = tests_of(args, models)
    if not tests:
        raise CLIError("nothing to measure: no test has tokens (-p, -n and -pg are all 0)")
    # every option checked before anything is loaded or timed
    hparams = {m: read_hparams(p) for m, p in paths.items()}
    for test in {t.load_key(): t for t in tests}.values():
        _plan(args, test)
        _settings(args, test).kv_types()
    printer = Printer(args.output, args, out)
    printer.header()
    rng = np.random.default_rng(args.seed)
    try:
        for _, group in itertools.groupby(tests, key=Test.load_key):
            _run_group(args, list(group), paths, hparams, printer, rng, err, set_n_threads)
    finally:
        printer.footer()
    return 0


def _run_group(args: argparse.Namespace, group: list[Test], paths: dict[str, Path], hparams: dict[str, Any],
               printer: Printer, rng: np.random.Generator, err: TextIO, set_n_threads: Any) -> None:
    """The tests that share a loaded model: loaded once with the largest context among them."""
    first_test = group[0]
    model = load_model(paths[first_test.model], _plan(args, first_test), _settings(args, first_test),
                       max(t.n_ctx() for t in group), hparams[first_test.model].n_layer, first_test.n_threads, err,
                       "pyggml bench")
    try:
        bos = model.token_bos()
        for test in group:
            if test.n_threads is not None:
                for b in model.backends:
                    set_n_threads(b, test.n_threads)
            first = bos if bos is not None else int(rng.integers(model.hparams.n_vocab))
            test_time = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            _run_once(model, test, rng, first)  # warm-up: plans the graphs, pages the weights in
            samples = [_run_once(model, test, rng, first) for _ in range(args.repetitions)]
            printer.add(test, result_fields(test, model, test_time, samples, args.repack), _layer_counts(model))
    finally:
        model.free()

