"""pyggml.testing.random_llama: a random LLaMA at full width loads in llama.cpp and pyggml alike, F16 and
requantized by llama-quantize (the IQ and TQ types with an importance matrix from llama-imatrix), and the two
compute the same logits."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import pyggml.models as pm
from pyggml.core.errors import ArgumentError
from pyggml.core.types import GGMLType
from pyggml.testing import tiny_archs
from pyggml.testing.random_llama import SHAPES, make_imatrix, quantize, write_random_llama

pytestmark = [pytest.mark.interop, pytest.mark.slow]

IDS = [1, 450, 4996, 17354, 1701, 432, 17204, 975, 278, 17366, 11203, 29889]
MAX_NMSE = 1e-5  # a misplaced or mis-typed tensor gives NMSE near 1
MAX_NMSE_IQ = 1e-4  # the bar of the every-type issue for files of the IQ and TQ types
# llama-quantize's type name -> the types its mix has at rows of 1024 besides the K-quants (every IQ and TQ type
# appears in one file)
IQ_FILES: dict[str, set[GGMLType]] = {
    "IQ4_XS": {GGMLType.IQ4_XS},
    "IQ3_S": {GGMLType.IQ3_S},
    "IQ3_XXS": {GGMLType.IQ3_XXS, GGMLType.IQ2_S, GGMLType.IQ3_S},
    "IQ2_S": {GGMLType.IQ2_XS, GGMLType.IQ3_S},
    "IQ1_M": {GGMLType.IQ1_M, GGMLType.IQ2_XXS},
    "IQ1_S": {GGMLType.IQ1_S, GGMLType.IQ2_XXS},
    "TQ2_0": {GGMLType.TQ2_0},
    "TQ1_0": {GGMLType.TQ1_0},
}
K_QUANTS = {GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("random_llama")
    f16 = write_random_llama(root / "w1024.gguf", SHAPES["llama-w1024"])
    return {"F16": f16, "Q4_K_M": quantize(f16, root / "w1024-Q4_K_M.gguf", "Q4_K_M")}


@pytest.fixture(scope="module")
def iq_files(files: dict[str, Path]) -> dict[str, Path]:
    f16 = files["F16"]
    imatrix = make_imatrix(f16, f16.with_name("w1024-imatrix.gguf"))
    return {name: quantize(f16, f16.with_name(f"w1024-{name}.gguf"), name, imatrix) for name in IQ_FILES}


def _logits_nmse(path: Path, tmp_path: Path) -> tuple[float, Counter[GGMLType]]:
    """NMSE of pyggml's logits of IDS against llama.cpp's on the file, and the file's matrix types."""
    model = pm.load(path, n_ctx=64, progress=False)
    try:
        types = Counter(model.file.tensor(n).type for n in model.w if len(model.file.tensor(n).ne) == 2)
        ours = model.eval(IDS)
    finally:
        model.free()
    theirs = tiny_archs.llamacpp_logits([(path, IDS)], tmp_path)[0]
    return float(np.mean((ours - theirs) ** 2) / np.mean(theirs ** 2)), types


@pytest.mark.parametrize("name", ["F16", "Q4_K_M"])
def test_random_llama_computes_as_llamacpp(files: dict[str, Path], tmp_path: Path, name: str) -> None:
    model = pm.load(files[name], n_ctx=64, progress=False)
    try:
        hp = model.hparams
        assert (hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv, hp.n_vocab) == (1024, 2, 16, 4, 32000)
    finally:
        model.free()
    nmse, types = _logits_nmse(files[name], tmp_path)
    if name == "Q4_K_M":  # rows of 1024: llama-quantize's mix without fallbacks
        assert set(types) <= {GGMLType.Q4_K, GGMLType.Q6_K} and types[GGMLType.Q4_K] > types[GGMLType.Q6_K]
    else:
        assert set(types) == {GGMLType.F16}
    assert nmse <= MAX_NMSE, f"{name}: NMSE {nmse:.3g} against llama.cpp"


@pytest.mark.parametrize("name", list(IQ_FILES))
def test_iq_and_tq_files_compute_as_llamacpp(iq_files: dict[str, Path], tmp_path: Path, name: str) -> None:
    nmse, types = _logits_nmse(iq_files[name], tmp_path)
    assert IQ_FILES[name] <= set(types) <= IQ_FILES[name] | K_QUANTS, f"{name}: the file's types {dict(types)}"
    assert nmse <= MAX_NMSE_IQ, f"{name}: NMSE {nmse:.3g} against llama.cpp"


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
