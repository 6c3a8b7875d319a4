"""The CPU backend's batch-invariant mode: a column's MUL_MAT result and a q row's attention are the bits they
have alone, whatever the other columns, rows and KV cells of their node, and whatever the thread count.

MUL_MAT: for every weight type pyggml serve meets (F32, F16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, Q4_0 and Q4_K held
repacked),
one column alone against the same column at the start, middle and end of 1..130 others (across the direct
kernels' groups of 4, BLAS_MIN_COLS, X8_TILE_MIN_COLS, F32_BLAS_MIN_COLS), on 1 and 2 threads. FLASH_ATTN_EXT: a
sequence's rows over its own cells alone against the same rows beside other sequences' rows, its cells
interleaved with other sequences' (masked) cells in caches of 64..1024 cells; and against a float64 reference.
Plus the option itself: the backend's switch, its registry entry, and plans that follow it."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import backend_mul_mat, compile_node, new_ctx, tensor, values_of
from test_flash_attn_ext import fa, nmse, reference, stored

from pyggml.backends.cpu import cpu_init
from pyggml.backends.cpu.device import cpu_reg
from pyggml.backends.cpu.kernels import ComputeParams, matmul
from pyggml.core.errors import ArgumentTypeError
from pyggml.core.types import GGMLType
from pyggml.ggml_backend.registry import SET_BATCH_INVARIANT, set_batch_invariant

F32, F16, Q8_0, Q4_0 = GGMLType.F32, GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0
WEIGHT_TYPES = [F32, F16, Q8_0, Q4_0, GGMLType.Q4_1, GGMLType.Q4_K, GGMLType.Q6_K]
# other columns beside the one: within a group of 4, past BLAS_MIN_COLS / X8_TILE_MIN_COLS, F32_BLAS_MIN_COLS, more
OTHERS = (1, 3, 17, 40, 130)
K, M = 512, 64  # two K-quant super-blocks a row; whole groups of 8 rows (the tiles' and the repacked loop's)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _columns(rng: np.random.Generator, n: int) -> np.ndarray:
    """src1 columns whose blocks differ in magnitude, so that another summation order rounds differently."""
    x = rng.standard_normal((n, K)).astype(np.float32)
    return x * np.exp(2 * rng.standard_normal((n, K // 32, 1))).astype(np.float32).repeat(32, axis=2).reshape(n, K)


def _product(ctx, w, x: np.ndarray, params: ComputeParams) -> np.ndarray:
    node = ctx.mul_mat(w, tensor(ctx, F32, x))
    compile_node(node, params)()
    return values_of(node)[0, 0]


def _placements(x: np.ndarray, n_others: int) -> list[tuple[int, np.ndarray]]:
    """Column 0 of x placed first, in the middle and last among n_others of x's other columns: (its index, src1)."""
    out = []
    for at in sorted({0, n_others // 2, n_others}):
        out.append((at, np.concatenate([x[1:1 + at], x[:1], x[1 + at:1 + n_others]])))
    return out


@pytest.mark.parametrize("wtype", WEIGHT_TYPES, ids=lambda t: t.name)
def test_a_column_is_its_bits_alone_among_any_columns(wtype: GGMLType) -> None:
    rng = np.random.default_rng(int(wtype) + 1)
    ctx = new_ctx(64)
    try:
        w = tensor(ctx, wtype, rng.standard_normal((M, K)).astype(np.float32))
        x = _columns(rng, 1 + max(OTHERS))
        for n_threads in (1, 2):
            params = ComputeParams(n_threads=n_threads, batch_invariant=True)
            alone = _product(ctx, w, x[:1], params)[0]
            for n_others in OTHERS:
                for at, cols in _placements(x, n_others):
                    got = _product(ctx, w, cols, params)[at]
                    assert np.array_equal(_bits(got), _bits(alone)), (n_threads, n_others, at)
    finally:
        ctx.free()


@pytest.mark.parametrize("wtype", [F32, F16, GGMLType.Q4_1], ids=lambda t: t.name)
def test_without_it_a_prompt_beside_changes_a_column(wtype: GGMLType) -> None:
    """What the mode is for: by default a batch of many columns takes BLAS, whose sums round otherwise."""
    rng = np.random.default_rng(7)
    ctx = new_ctx(64)
    try:
        w = tensor(ctx, wtype, rng.standard_normal((M, K)).astype(np.float32))
        x = _columns(rng, 1 + max(OTHERS))
        params = ComputeParams(n_threads=1)
        alone = _product(ctx, w, x[:1], params)[0]
        assert not np.array_equal(_bits(_product(ctx, w, x, params)[0]), _bits(alone))
    finally:
        ctx.free()


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_K"])
def test_a_repacked_column_is_its_bits_alone(type_name: str) -> None:
    """Q4_0 and Q4_K layer matrices held in CPU_REPACK (the models' default) go through the repacked loops at every
    count; Q4_K's in the order of ggml's gemv for every column (its gemm, on columns in fours, rounds otherwise)."""
    from test_repack import _q4_0_rows, _weights_in_repack_buffer
    from test_repack_q4_K import _in_repack_buffer, q4_K_rows

    rng = np.random.default_rng(5)
    if type_name == "Q4_0":
        ctx, buffer, w, _ = _weights_in_repack_buffer(_q4_0_rows(rng, M, K // 32), K)
    else:
        ctx, buffer, w = _in_repack_buffer(q4_K_rows(rng, M, K // 256), K)
    x = _columns(rng, 1 + max(OTHERS))
    try:
        with cpu_init(n_threads=2, batch_invariant=True) as backend:
            alone = backend_mul_mat(backend, w, x[:1])[0]
            for n_others in OTHERS:
                for at, cols in _placements(x, n_others):
                    assert np.array_equal(_bits(backend_mul_mat(backend, w, cols)[at]), _bits(alone)), (n_others, at)
    finally:
        buffer.free()
        ctx.free()


# --- attention ---

D, HEADS, KV_HEADS, OWN = 64, 9, 3, 37  # SmolLM2's heads; a sequence of 37 cells


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, kv_type: GGMLType,
            n_threads: int = 1) -> np.ndarray:
    """FLASH_ATTN_EXT of q (1, HEADS, N, D) over K and V (1, KV_HEADS, n_kv, D) of `kv_type` with an F16 mask
    (1, 1, N, n_kv), batch-invariant: (N, HEADS, D)."""
    ctx = new_ctx(64)
    try:
        node = fa(ctx, tensor(ctx, F32, q), tensor(ctx, kv_type, k), tensor(ctx, kv_type, v),
                  tensor(ctx, F16, mask.astype(np.float16)), 0.125)
        compile_node(node, ComputeParams(n_threads=n_threads, batch_invariant=True))()
        return values_of(node)[0]
    finally:
        ctx.free()


@pytest.mark.parametrize("kv_type", [F32, F16, Q8_0], ids=lambda t: t.name)
def test_a_sequence_attends_to_its_cells_alone_whatever_is_between_them(kv_type: GGMLType) -> None:
    rng = np.random.default_rng(int(kv_type) + 3)
    k_own, v_own = (rng.standard_normal((1, KV_HEADS, OWN, D)).astype(np.float32) for _ in range(2))
    q_own = rng.standard_normal((1, HEADS, 1, D)).astype(np.float32) * 3
    # alone: cells 0..OWN-1 hold the sequence, the last row of its causal mask sees them all
    alone = _attend(q_own, k_own, v_own, np.zeros((1, 1, 1, OWN), np.float32), kv_type)
    # (1024 cells, one row: the shape ggml splits over its threads, and pyggml vectorizes, without the mode)
    for n_kv, n_rows, n_threads in ((64, 1, 1), (256, 4, 2), (1024, 1, 2), (1024, 7, 2)):
        cells = np.sort(rng.choice(n_kv, OWN, replace=False))  # its cells among other sequences' (and empty ones)
        k, v = (rng.standard_normal((1, KV_HEADS, n_kv, D)).astype(np.float32) * 5 for _ in range(2))
        k[:, :, cells], v[:, :, cells] = k_own, v_own
        q = rng.standard_normal((1, HEADS, n_rows, D)).astype(np.float32) * 3
        at = n_rows // 2  # its row among other sequences' rows, which see cells of their own
        q[:, :, at] = q_own[:, :, 0]
        mask = np.where(rng.random((1, 1, n_rows, n_kv)) < 0.5, 0.0, -np.inf).astype(np.float32)
        mask[:, :, at] = -np.inf
        mask[:, :, at, cells] = 0.0
        got = _attend(q, k, v, mask, kv_type, n_threads)[at]
        assert np.array_equal(_bits(got), _bits(alone[0])), (n_kv, n_rows)


@pytest.mark.parametrize("kv_type", [F32, F16, GGMLType.BF16, Q8_0, Q4_0], ids=lambda t: t.name)
@pytest.mark.parametrize("n_head, n_head_kv, n_batch", [(4, 4, 1), (6, 2, 5), (3, 1, 70)])
def test_batch_invariant_attention_is_attention(kv_type: GGMLType, n_head: int, n_head_kv: int,
                                                n_batch: int) -> None:
    """The same function as the other paths (70 q rows: past ggml's tiled threshold, walked all the same)."""
    rng = np.random.default_rng(n_batch)
    qv = rng.uniform(-1, 1, (2, n_head, n_batch, D)).astype(np.float32)
    kv_, vv = (rng.uniform(-1, 1, (2, n_head_kv, 45, 40 if kv_type == F32 else D)).astype(np.float32)
               for _ in range(2))
    if kv_type == F32:  # a row length with a tail past its last 32 values
        qv = qv[..., :40].copy()
    mv = rng.uniform(-1, 1, (1, 1, n_batch + 3, 45)).astype(np.float32)
    mv[0, 0, 0, 7:20] = -np.inf
    mv[0, 0, -1, :] = -np.inf
    mv = mv.astype(np.float16)
    ctx = new_ctx(32)
    try:
        node = fa(ctx, tensor(ctx, F32, qv), tensor(ctx, kv_type, kv_), tensor(ctx, kv_type, vv),
                  tensor(ctx, F16, mv), 1 / 8)
        compile_node(node, ComputeParams(batch_invariant=True))()
        want = reference(qv, stored(kv_type, kv_), stored(kv_type, vv), mv, 1 / 8)
        # q rounded to K's vec_dot_type (f16, bf16, q8_0) before the products, as ggml does
        assert nmse(values_of(node), want) < (1e-10 if kv_type == F32 else 1e-4)
    finally:
        ctx.free()


def test_batch_invariant_attention_with_sinks_alibi_softcap_and_empty_rows() -> None:
    rng = np.random.default_rng(4)
    n_head, n_kv = 5, 30
    qv = rng.uniform(-3, 3, (1, n_head, 3, 32)).astype(np.float32)
    kv_, vv = rng.uniform(-1, 1, (1, n_head, n_kv, 32)).astype(np.float32), rng.uniform(-1, 1, (1, n_head, n_kv, 48))
    mv = rng.uniform(-1, 1, (1, 1, 3, n_kv)).astype(np.float16)
    mv[0, 0, 1, :] = -np.inf  # nothing to attend to: 0
    sv = rng.uniform(-4, 4, n_head).astype(np.float32)
    ctx = new_ctx()
    try:
        node = fa(ctx, tensor(ctx, F32, qv), tensor(ctx, F32, kv_), tensor(ctx, F32, vv), tensor(ctx, F16, mv),
                  0.3, 8.0, 2.5, tensor(ctx, F32, sv))
        compile_node(node, ComputeParams(batch_invariant=True))()
        got = values_of(node)
        assert np.allclose(got, reference(qv, kv_, vv, mv, 0.3, 8.0, 2.5, sv), rtol=1e-5, atol=1e-6)
        assert not got[0, 1].any()
    finally:
        ctx.free()


# --- the option ---


def test_the_backend_option_and_its_registry_entry() -> None:
    backend = cpu_init()
    try:
        assert backend.batch_invariant is False  # the fastest kernel for each shape by default
        assert cpu_reg().get_proc_address(SET_BATCH_INVARIANT) is not None
        assert set_batch_invariant(backend, True) is True
        assert backend.batch_invariant is True and backend._params(backend.work).batch_invariant is True
        with pytest.raises(ArgumentTypeError, match="batch_invariant must be a bool"):
            set_batch_invariant(backend, 1)  # type: ignore[arg-type]
        assert backend.batch_invariant is True
        set_batch_invariant(backend, False)
        assert backend._params(backend.work).batch_invariant is False
    finally:
        backend.free()


def test_plans_made_after_the_switch_follow_it() -> None:
    """A graph's product computed by the backend: its prompt column takes BLAS by default, the direct kernel
    (the bits it has alone) once the backend is batch-invariant."""
    rng = np.random.default_rng(9)
    ctx = new_ctx(64)
    try:
        w = tensor(ctx, GGMLType.Q4_1, rng.standard_normal((M, K)).astype(np.float32))
        x = _columns(rng, matmul.BLAS_MIN_COLS + 4)
        with cpu_init(n_threads=1) as backend:
            alone = backend_mul_mat(backend, w, x[:1])[0]
            assert not np.array_equal(_bits(backend_mul_mat(backend, w, x)[0]), _bits(alone))
            set_batch_invariant(backend, True)
            assert np.array_equal(_bits(backend_mul_mat(backend, w, x)[0]), _bits(alone))
    finally:
        ctx.free()
