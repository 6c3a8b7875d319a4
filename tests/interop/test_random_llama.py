"""pyggml.testing.random_llama: a random LLaMA at full width loads in llama.cpp and pyggml alike, F16 and
requantized by llama-quantize, and the two compute the same logits."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import pyggml.models as pm
from pyggml.core.errors import ArgumentError
from pyggml.core.types import GGMLType
from pyggml.testing import tiny_archs
from pyggml.testing.random_llama import SHAPES, quantize, write_random_llama

pytestmark = [pytest.mark.interop, pytest.mark.slow]

IDS = [1, 450, 4996, 17354, 1701, 432, 17204, 975, 278, 17366, 11203, 29889]
MAX_NMSE = 1e-5  # a misplaced or mis-typed tensor gives NMSE near 1


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("random_llama")
    f16 = write_random_llama(root / "w1024.gguf", SHAPES["llama-w1024"])
    return {"F16": f16, "Q4_K_M": quantize(f16, root / "w1024-Q4_K_M.gguf", "Q4_K_M")}


@pytest.mark.parametrize("name", ["F16", "Q4_K_M"])
def test_random_llama_computes_as_llamacpp(files: dict[str, Path], tmp_path: Path, name: str) -> None:
    model = pm.load(files[name], n_ctx=64, progress=False)
    try:
        hp = model.hparams
        assert (hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv, hp.n_vocab) == (1024, 2, 16, 4, 32000)
        types = Counter(model.file.tensor(n).type for n in model.w if len(model.file.tensor(n).ne) == 2)
        if name == "Q4_K_M":  # rows of 1024: llama-quantize's mix without fallbacks
            assert set(types) <= {GGMLType.Q4_K, GGMLType.Q6_K} and types[GGMLType.Q4_K] > types[GGMLType.Q6_K]
        else:
            assert set(types) == {GGMLType.F16}
        ours = model.eval(IDS)
    finally:
        model.free()
    theirs = tiny_archs.llamacpp_logits([(files[name], IDS)], tmp_path)[0]
    nmse = float(np.mean((ours - theirs) ** 2) / np.mean(theirs ** 2))
    assert nmse <= MAX_NMSE, f"{name}: NMSE {nmse:.3g} against llama.cpp"


def test_random_llama_refuses_what_llama_quantize_makes(tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match="F16 or F32.*Q4_0"):
        write_random_llama(tmp_path / "x.gguf", SHAPES["llama-w1024"], GGMLType.Q4_0)


def test_q4_K_m_layer_matrices_are_repacked_and_give_llamacpp_s_default_logits(files: dict[str, Path],
                                                                              tmp_path: Path) -> None:
    """llama.cpp's default run repacks Q4_K on x86 (CPU_REPACK, block_q4_Kx8); pyggml holds the same matrices
    repacked and computes them in the order of ggml's repack gemm (the prompt's columns in fours) and gemv (the
    last two), so the logits are llama.cpp's up to the last bits of the other ops."""
    ids = [*IDS, 1701, 432]  # 14 tokens: 3 fours and a tail of 2
    model = pm.load(files["Q4_K_M"], n_ctx=64, progress=False)
    try:
        held = {n for n, t in model.w.items() if t.buffer is not None and t.buffer.buft is not None
                and t.buffer.buft.name() == "CPU_REPACK"}
        want = {n for n, t in model.w.items() if n.startswith("blk.") and t.type == GGMLType.Q4_K
                and len(model.file.tensor(n).ne) == 2 and t.ne[1] % 8 == 0}
        assert want and held == want
        ours = model.eval(ids)
    finally:
        model.free()
    theirs = tiny_archs.llamacpp_logits([(files["Q4_K_M"], ids)], tmp_path)[0]
    nmse = float(np.mean((ours - theirs) ** 2) / np.mean(theirs ** 2))
    assert nmse < 1e-12, nmse  # measured 7.1e-15 (6.1e-7 with Q4_K in vec_dot's row order, Q6_K by BLAS)
