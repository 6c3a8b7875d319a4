"""The mixture-of-experts benchmark model: a random-weight qwen3moe at real-ish shapes (1024 wide, 8 layers, 32
experts of 512 rows with 4 used a token, vocabulary 32000: about 470M parameters, about 70M active a token), F16,
written once beside the llama.cpp build; its weight types are made from it by bench_vs_llamacpp.py with
llama-quantize, as published files are.

    python benchmarks/random_moe_model.py            # writes (once) and prints the F16 file's path
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyggml.testing import llamacpp
from pyggml.testing.random_moe import MoeShape, write_random_qwen3moe


def random_moe_model() -> Path:
    """The F16 file (written on first use, about 0.95 GB)."""
    folder = llamacpp.paths().root / "variants"
    folder.mkdir(parents=True, exist_ok=True)
    shape = MoeShape()
    out = folder / f"random-qwen3moe-{shape.n_embd}x{shape.n_layer}-{shape.n_expert}e{shape.n_expert_used}.gguf"
    if not out.exists():
        print(f"writing {out} ...", file=sys.stderr, flush=True)
        tmp = out.with_suffix(".tmp")
        write_random_qwen3moe(tmp, shape)
        tmp.rename(out)
    return out


if __name__ == "__main__":
    print(random_moe_model())
