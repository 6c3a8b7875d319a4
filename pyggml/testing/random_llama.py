"""Random-weight LLaMA GGUF files at real shapes, for speed measurements and type checks at full width.

    python -m pyggml.testing.random_llama --shape tinyllama-1.1b -o /tmp/tl.gguf --quantize Q4_K_M,Q8_0

The file is llama.cpp's LLaMA layout (F16 or F32 matrices, F32 norms) with the tokenizer of llama.cpp's
`ggml-vocab-llama-spm.gguf` (32000 tokens), so llama.cpp and pyggml load the same bytes; `--quantize` makes
each listed type from it with llama-quantize (`--imatrix FILE` passes an importance matrix where a type needs
one, `--imatrix auto` makes one with llama-imatrix).
Weights are N(0, 1/fan_in) matrices, N(0, 1) embeddings and norms 1 + N(0, 0.1), so activations keep their
scale through the layers as a trained model's do.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType

from pyggml.core.errors import ArgumentError
from pyggml.core.types import GGMLType
from pyggml.models.convert import write_llama_gguf
from pyggml.testing import llamacpp

VOCAB_FILE = "ggml-vocab-llama-spm.gguf"


@dataclass(frozen=True)
class LlamaShape:
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int = 32000
    n_ctx_train: int = 2048


SHAPES = {
    "tinyllama-1.1b": LlamaShape(2048, 22, 32, 4, 5632),
    "llama-w1024": LlamaShape(1024, 2, 16, 4, 2816),  # rows of 4 * 256: every K-quant and IQ type applies
}


def vocab_metadata(n_vocab: int) -> dict[str, Any]:
    """The `tokenizer.*` keys of llama.cpp's SPM vocabulary file, with their GGUF types."""
    from pyggml.gguf.reader import read_gguf
    from pyggml.models.metadata import gguf_type

    gf = read_gguf(llamacpp.models_dir() / VOCAB_FILE)
    try:
        out: dict[str, Any] = {}
        for key in gf.keys():
            if not key.startswith("tokenizer."):
                continue
            main, _, sub = (gguf_type(gf, key) or "").partition(" of ")
            value = gf.get(key)
            out[key] = (value, GGUFValueType[main], GGUFValueType[sub]) if sub else (value, GGUFValueType[main])
        n_tokens = len(out["tokenizer.ggml.tokens"][0])
    finally:
        gf.close()
    if n_tokens != n_vocab:
        raise ArgumentError(f"random_llama: n_vocab {n_vocab} must be the SPM vocabulary's {n_tokens} tokens")
    return out


def write_random_llama(path: str | Path, shape: LlamaShape, type: GGMLType = GGMLType.F16, seed: int = 0) -> Path:
    """Write a random LLaMA of `shape` with matrices in `type` (F16 or F32); return the path."""
    if type not in (GGMLType.F16, GGMLType.F32):
        raise ArgumentError(f"random_llama: matrices are F16 or F32 (llama-quantize makes the rest), got {type.name}")
    if shape.n_embd % shape.n_head or shape.n_head % shape.n_head_kv:
        raise ArgumentError(f"random_llama: n_embd {shape.n_embd}, n_head {shape.n_head} and n_head_kv "
                            f"{shape.n_head_kv} do not divide")
    rng = np.random.default_rng(seed)
    n_embd, n_ff = shape.n_embd, shape.n_ff
    n_embd_kv = n_embd // shape.n_head * shape.n_head_kv

    def matrix(rows: int, cols: int, scale: float) -> np.ndarray:
        return rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(scale)

    def norm() -> np.ndarray:
        return 1.0 + 0.1 * rng.standard_normal(n_embd, dtype=np.float32)

    state = {"model.embed_tokens.weight": matrix(shape.n_vocab, n_embd, 1.0)}
    for il in range(shape.n_layer):
        b = f"model.layers.{il}."
        state[b + "input_layernorm.weight"] = norm()
        for name, rows in (("q_proj", n_embd), ("k_proj", n_embd_kv), ("v_proj", n_embd_kv), ("o_proj", n_embd)):
            state[b + f"self_attn.{name}.weight"] = matrix(rows, n_embd, n_embd ** -0.5)
        state[b + "post_attention_layernorm.weight"] = norm()
        state[b + "mlp.gate_proj.weight"] = matrix(n_ff, n_embd, n_embd ** -0.5)
        state[b + "mlp.up_proj.weight"] = matrix(n_ff, n_embd, n_embd ** -0.5)
        state[b + "mlp.down_proj.weight"] = matrix(n_embd, n_ff, n_ff ** -0.5)
    state["model.norm.weight"] = norm()
    state["lm_head.weight"] = matrix(shape.n_vocab, n_embd, n_embd ** -0.5)
    config = {"name": f"random llama {n_embd}x{shape.n_layer}", "hidden_size": n_embd,
              "num_hidden_layers": shape.n_layer, "num_attention_heads": shape.n_head,
              "num_key_value_heads": shape.n_head_kv, "intermediate_size": n_ff, "vocab_size": shape.n_vocab,
              "max_position_embeddings": shape.n_ctx_train}
    write_llama_gguf(path, config, state, type=type, vocab=vocab_metadata(shape.n_vocab))
    return Path(path)


def quantize(src: Path, dst: Path, type_name: str, imatrix: Path | None = None) -> Path:
    """`dst`: `src` requantized by llama-quantize to `type_name` (its names: Q4_K_M, IQ2_S, TQ2_0, ...)."""
    tool = llamacpp.require_tools(["llama-quantize"])["llama-quantize"]
    cmd = [str(tool), "--allow-requantize"]
    if imatrix is not None:
        cmd += ["--imatrix", str(imatrix)]
    r = subprocess.run([*cmd, str(src), str(dst), type_name], capture_output=True, text=True)
    if r.returncode != 0:
        raise ArgumentError(f"llama-quantize {type_name} of '{src}' failed (exit {r.returncode}): "
                            f"{r.stderr.strip()[-1500:]}")
    return dst


def _calibration_text(n_words: int, seed: int) -> str:
    """Words of the SPM vocabulary in a seeded random order: llama-imatrix only needs activations of a typical scale."""
    rng = np.random.default_rng(seed)
    words = ("the of and to in a is that for it as was with be by on not he this are or his from at which but "
             "have an they you were her she there been one all we their has would when if so no what up out more "
             "time model layer weight value matrix token number first people water after other called").split()
    return " ".join(words[i] for i in rng.integers(0, len(words), n_words)) + "\n"


def make_imatrix(model: Path, dst: Path, *, n_ctx: int = 128, chunks: int = 8, seed: int = 0) -> Path:
    """`dst`: llama-imatrix's importance matrix of `model` over `chunks` chunks of `n_ctx` tokens of seeded text
    (what llama-quantize needs for IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS and IQ2_S)."""
    tool = llamacpp.require_tools(["llama-imatrix"])["llama-imatrix"]
    text = dst.with_suffix(".txt")
    text.write_text(_calibration_text(n_ctx * chunks * 2, seed))
    cmd = [str(tool), "-m", str(model), "-f", str(text), "-o", str(dst), "-c", str(n_ctx),
           "--chunks", str(chunks), "--no-ppl", "-t", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not dst.exists():
        raise ArgumentError(f"llama-imatrix of '{model}' failed (exit {r.returncode}): {r.stderr.strip()[-1500:]}")
    return dst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyggml.testing.random_llama", description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tinyllama-1.1b")
    parser.add_argument("--layers", type=int, default=None, help="override the shape's layer count")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the F16/F32 file to write")
    parser.add_argument("--type", choices=("f16", "f32"), default="f16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quantize", default="", help="comma-separated llama-quantize types made from the file, "
                                                       "each written beside it as <output stem>-<TYPE>.gguf")
    parser.add_argument("--imatrix", type=Path, default=None, help="importance matrix for --quantize ('auto': "
                                                                    "made by llama-imatrix beside the output)")
    args = parser.parse_args(argv)
    shape = SHAPES[args.shape]
    if args.layers is not None:
        shape = replace(shape, n_layer=args.layers)
    src = write_random_llama(args.output, shape, GGMLType[args.type.upper()], args.seed)
    print(f"wrote {src} ({src.stat().st_size / 2**20:.0f} MiB)", file=sys.stderr)
    imatrix = args.imatrix
    if imatrix is not None and str(imatrix) == "auto":
        imatrix = make_imatrix(src, src.with_name(f"{src.stem}-imatrix.gguf"))
        print(f"wrote {imatrix}", file=sys.stderr)
    for name in filter(None, args.quantize.split(",")):
        dst = quantize(src, src.with_name(f"{src.stem}-{name}.gguf"), name, imatrix)
        print(f"wrote {dst} ({dst.stat().st_size / 2**20:.0f} MiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
