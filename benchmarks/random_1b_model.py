"""The 1B-class benchmark model: a random-weight LLaMA at TinyLlama-1.1B's shapes (2048 wide, 22 layers, FFN 5632,
vocabulary 32000), F16, written once beside the llama.cpp build; its weight types are made from it
by bench_vs_llamacpp.py with llama-quantize, as published files are.

    python benchmarks/random_1b_model.py            # writes (once) and prints the F16 file's path
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyggml.testing import llamacpp
from pyggml.testing.random_llama import SHAPES, write_random_llama

SHAPE = "tinyllama-1.1b"


def random_1b_model() -> Path:
    """The F16 file (written on first use, about 2.1 GB)."""
    folder = llamacpp.paths().root / "variants"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"random-{SHAPE}.gguf"
    if not out.exists():
        print(f"writing {out} ...", file=sys.stderr, flush=True)
        tmp = out.with_suffix(".tmp")
        write_random_llama(tmp, SHAPES[SHAPE])
        tmp.rename(out)
    return out


if __name__ == "__main__":
    print(random_1b_model())
