"""MUL_MAT_ID of quantized experts against libggml's own, bit for bit, at decode and prompt token counts: experts in
plain host memory (ggml-cpu.c's vec_dot rows, its tiled order for K-quant experts of 8 rows or more) and Q4_K
experts in the CPU_REPACK buffer (repack.cpp's forward_mul_mat_id: the gemv order on every row), as llama.cpp's
default run holds a qwen3moe's expert tensors."""

from __future__ import annotations

import numpy as np
import pytest
from test_repack_q4_K import q4_K_rows, src1_f32

from pyggml.core.context import Context
from pyggml.core.types import TYPE_TRAITS, GGMLType, from_float

N_AS, N_USED, M, K = 8, 3, 64, 512
# 1: a decode step; 5: every expert below ggml's tiled batch (8 rows); 40 and 128: most experts at or above it
TOKENS = [1, 5, 40, 128]


def _ids(rng: np.random.Generator, n_tok: int) -> np.ndarray:
    """Each token's N_USED distinct experts; expert 0 on every other token, so its rows outnumber the rest."""
    ids = np.stack([rng.permutation(N_AS)[:N_USED] for _ in range(n_tok)]).astype(np.int32)
    ids[::2, 0] = np.where(ids[::2, 1:] == 0, ids[::2, 0:1], 0).max(axis=1)  # stays distinct: 0 or what was there
    return ids


def _experts(type: GGMLType, rng: np.random.Generator) -> np.ndarray:
    """Random experts (N_AS, M, row bytes) of `type`: Q4_K from random blocks, others quantized from floats."""
    if type == GGMLType.Q4_K:
        return q4_K_rows(rng, N_AS * M, K // 256).reshape(N_AS, M, -1)
    return from_float(type, rng.standard_normal((N_AS, M, K)).astype(np.float32)).reshape(N_AS, M, -1)


def _ours(type: GGMLType, raw: np.ndarray, x: np.ndarray, ids: np.ndarray, repacked: bool,
          n_threads: int) -> tuple[np.ndarray, bool]:
    """pyggml's MUL_MAT_ID of the experts `raw` (in a CPU_REPACK buffer if `repacked`) on the CPU backend, and
    whether the experts were held repacked."""
    from pyggml.alloc.ctx_tensors import alloc_ctx_tensors_from_buft
    from pyggml.backends.cpu.backend import cpu_init
    from pyggml.backends.cpu.device import cpu_device
    from pyggml.backends.cpu.repack import is_repacked
    from pyggml.ggml_backend.registry import dev_extra_bufts
    from pyggml.ggml_backend.tensor_io import tensor_set

    ctx_w = Context(mem_size=1 << 20, no_alloc=True)
    w = ctx_w.new_tensor_3d(type, K, M, N_AS)
    buft = dev_extra_bufts(cpu_device())[0] if repacked else cpu_device().buffer_type()
    buffer = alloc_ctx_tensors_from_buft(ctx_w, buft)
    ctx = Context(mem_size=x.nbytes + ids.nbytes + 4 * ids.size * M + (1 << 20))
    try:
        tensor_set(w, raw.reshape(-1))
        xt = ctx.new_tensor_3d(GGMLType.F32, K, x.shape[1], x.shape[0])
        xt.numpy()[0] = x
        it = ctx.new_tensor_2d(GGMLType.I32, N_USED, ids.shape[0])
        it.numpy()[0, 0] = ids
        out = ctx.mul_mat_id(w, xt, it)
        g = ctx.new_graph()
        g.build_forward_expand(out)
        with cpu_init(n_threads=n_threads) as backend:
            backend.graph_compute(g)
        return out.numpy()[0].copy(), is_repacked(w)
    finally:
        ctx.free()
        buffer.free()
        ctx_w.free()


@pytest.mark.parametrize("n_tok", TOKENS)
@pytest.mark.parametrize(("type", "buft"), [pytest.param(t, b, id=f"{t.name}-{b}") for t, b in (
    (GGMLType.Q8_0, "CPU"), (GGMLType.Q4_K, "CPU"), (GGMLType.Q6_K, "CPU"), (GGMLType.Q4_K, "CPU_REPACK"))])
def test_mul_mat_id_is_libggml_bit_for_bit(ggml_reference: object, type: GGMLType, buft: str, n_tok: int) -> None:
    """ggml_reference: libggml built and loaded; ggml_c.mul_mat_id_in_buft computes its MUL_MAT_ID."""
    from pyggml.testing import ggml_c

    rng = np.random.default_rng(n_tok + int(type))
    raw = _experts(type, rng)
    assert raw.shape[2] == K // TYPE_TRAITS[type].blck_size * TYPE_TRAITS[type].type_size
    x = src1_f32(rng, n_tok, K).reshape(n_tok, 1, K)  # one src1 row per token, as the gate and up experts
    ids = _ids(rng, n_tok)
    theirs, held = ggml_c.mul_mat_id_in_buft(type, raw, x, ids, buft)
    assert held == (buft == "CPU_REPACK")  # libggml repacked the experts there (block_q4_Kx8: AVX2)
    for n_threads in (1, 2):
        ours, repacked = _ours(type, raw, x, ids, buft == "CPU_REPACK", n_threads)
        assert repacked == held
        assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)), (n_threads, np.abs(ours - theirs).max())
