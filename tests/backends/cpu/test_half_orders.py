"""F32, F16 and BF16 MUL_MAT in ggml-cpu's float orders (vec_dot.half_orders): src1 rounded to the weight type,
decode rows in ggml_vec_dot_f32/f16/bf16's order and prompts in llamafile tinyBLAS's (src1 contiguous), at the x86
level libggml is built for, against libggml's product bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import bf16_bits, libm_f32, new_ctx, run, tensor
from test_kernels_matmul import weight_tensor

from pyggml.backends.cpu.kernels import ComputeParams
from pyggml.core.types import GGMLType

HALF_TYPES = (GGMLType.F16, GGMLType.BF16)
FLOAT_TYPES = (GGMLType.F32, *HALF_TYPES)


def half_rows(rng: np.random.Generator, wtype: GGMLType, rows: int, k: int) -> np.ndarray:
    """Random weight rows of `wtype` (F32 values, else uint16 bits) whose magnitudes differ row to row."""
    v = (rng.standard_normal((rows, k)) * np.exp(rng.standard_normal((rows, 1)))).astype(np.float32)
    if wtype == GGMLType.F32:
        return v
    return v.astype(np.float16).view(np.uint16) if wtype == GGMLType.F16 else bf16_bits(v)


def src1_rows(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    return (rng.standard_normal((n, k)) * np.exp(rng.standard_normal((n, 1)))).astype(np.float32)


# (M, K): rows a multiple of tinyBLAS's 4 or not; K a multiple of every step, of 16 only, of neither (F32's tail
# of 6 and of 16 + 8 + 5: gcc fuses the last K % 8 where numerics.FMA_CHAINS); and rows whose work items span
# several panels of rows (mul_mat_job.PANEL_BYTES), the last one short
SHAPES = [(64, 256), (40, 832), (30, 96), (20, 200), (12, 70), (12, 93), (520, 2048)]


@pytest.mark.parametrize("wtype", FLOAT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("n", [1, 7, 8, 20, 128])
def test_half_products_are_libggml_s_bit_for_bit(ggml_reference: object, wtype: GGMLType, shape: tuple[int, int],
                                                 n: int) -> None:
    """ggml_reference: libggml built; its x86 level is the level forced here."""
    from pyggml.testing import ggml_c

    level = ggml_c.x86_level()
    rng = np.random.default_rng(n * 1000 + shape[1])
    M, K = shape
    raw = half_rows(rng, wtype, M, K)
    x = src1_rows(rng, n, K)
    ctx = new_ctx(64)
    try:
        w = weight_tensor(ctx, wtype, (raw.view(np.float16) if wtype == GGMLType.F16 else raw)[None, None])
        node = ctx.mul_mat(w, tensor(ctx, GGMLType.F32, x[None, None]))
        want = ggml_c.compute_like(node).reshape(n, M)
        got = run(node, ComputeParams(n_threads=2, numerics="x86", x86_level=level)).reshape(n, M)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), \
            f"{level}: {np.count_nonzero(got != want)} of {got.size} differ"
    finally:
        ctx.free()


@pytest.mark.parametrize("wtype", HALF_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 8])
def test_denormal_operands_are_libggml_s(ggml_reference: object, wtype: GGMLType, n: int) -> None:
    """Weights and src1 near and below the smallest normal float: AVX512_BF16's dpbf16 reads denormals as zero
    and flushes its results (DAZ, FTZ), the other orders keep them."""
    from pyggml.testing import ggml_c

    rng = np.random.default_rng(7 + n)
    M, K = 16, 128
    f16 = wtype == GGMLType.F16  # F16: its own denormals (below 2**-14) in both operands
    w_exp, x_exp = ((-20, -12), (-24, -12)) if f16 else ((-70, -50), (-90, -60))
    w = (rng.standard_normal((M, K)) * np.exp2(rng.integers(*w_exp, (M, K)))).astype(np.float32)
    raw = w.astype(np.float16).view(np.uint16) if f16 else bf16_bits(w)
    x = (rng.standard_normal((n, K)) * np.exp2(rng.integers(*x_exp, (n, K)))).astype(np.float32)
    ctx = new_ctx(16)
    try:
        wt = weight_tensor(ctx, wtype, (raw.view(np.float16) if wtype == GGMLType.F16 else raw)[None, None])
        node = ctx.mul_mat(wt, tensor(ctx, GGMLType.F32, x[None, None]))
        want = ggml_c.compute_like(node).reshape(n, M)
        got = run(node, ComputeParams(numerics="x86", x86_level=ggml_c.x86_level())).reshape(n, M)
        assert np.any(want != 0)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    finally:
        ctx.free()


# (weight type, order): every vec_dot order and the dpbf16 tinyBLAS one, src1 packed or not
PACKED_ORDERS = [(GGMLType.BF16, "vec_dot_bf16_avx512bf16"), (GGMLType.BF16, "tinyblas_avx512bf16"),
                 (GGMLType.BF16, "vec_dot_bf16_avx512"), (GGMLType.BF16, "vec_dot_bf16_avx2"),
                 (GGMLType.BF16, "generic"), (GGMLType.F16, "vec_dot_f16_avx512"),
                 (GGMLType.F16, "vec_dot_f16_avx2"), (GGMLType.F16, "generic")]


@pytest.mark.parametrize(("wtype", "name"), PACKED_ORDERS, ids=lambda v: getattr(v, "name", v))
def test_packed_src1_loops_agree_with_float_src1(wtype: GGMLType, name: str) -> None:
    """The loops read src1 as float32 values or packed as the bits of the weights' type (MUL_MAT and MUL_MAT_ID
    pack bf16 pairs, flushed, for the dpbf16 orders: half_orders.src1_bits); the dpbf16 orders also run vdpbf16ps
    itself where the host has AVX512_BF16: every variant gives the same bits (for dpbf16, the emulation's: FMAs of
    the odd then the even products, denormals flushed), denormal operands and results included."""
    from numba import njit

    from pyggml.backends.cpu.kernels.vec_dot import half_orders, kinds, quantize_src1

    order = half_orders.HALF_ORDERS[[o.name for o in half_orders.HALF_ORDERS].index(name)]
    kind = int(wtype)
    assert half_orders.src1_bits(half_orders.order_kind(kind, name)) == (kinds.BF16 if order.pairs else 0)
    rng = np.random.default_rng(3)
    M, K, n = 13, 352, 4  # K: vec_dot's 64-element steps and a tail
    low = -70 if wtype == GGMLType.BF16 else -20  # magnitudes down to the type's denormals
    w = (rng.standard_normal((M, K)) * np.exp2(rng.integers(low, 0, (M, K)))).astype(np.float32)
    raw = (bf16_bits(w) if wtype == GGMLType.BF16 else w.astype(np.float16).view(np.uint16)).view(np.uint8)
    x = (rng.standard_normal((n, K)) * np.exp2(rng.integers(low - 20, 0, (n, K)))).astype(np.float32)
    packed_x = x.copy()
    quantize_src1.round_rows(kind, x)
    if order.pairs:  # as MUL_MAT hands them src1: rounded, flushed, packed
        quantize_src1.pack_bf16_pairs(packed_x, packed_x)
    else:  # the loops take any type's bits (MUL_MAT packs only the pairs')
        bits = x.view(np.uint32) >> 16 if wtype == GGMLType.BF16 else x.astype(np.float16).view(np.uint16)
        packed_x.view(np.uint16).reshape(n, 2 * K)[:, :K] = bits
    w_off = np.arange(M, dtype=np.int64) * 2 * K
    outs = []
    for native in (False, True) if order.pairs and half_orders.HOST_DPBF16 else (False,):
        for packed in (False, True):
            loop = half_orders.make_half_cols(kind, order, native, kind if packed else 0)

            @njit
            def product(w, w_off, x, out, loop=loop):
                loop(w, w_off, 0, 0, w_off.shape[0], x, 0, x.shape[0], out)

            out = np.zeros((n, M), np.float32)
            product(raw.reshape(-1), w_off, packed_x if packed else x, out)
            outs.append(out)
    assert np.any(outs[0] != 0)
    for out in outs[1:]:
        assert np.array_equal(outs[0].view(np.uint32), out.view(np.uint32))


def test_packed_rows_are_the_rounded_values_bits() -> None:
    """pack_bf16_pairs writes each row's values rounded as round_rows rounds them to bf16, denormals zeroed keeping
    their sign, as bf16 bits in the row's first half, in place or into another array; half_rows_in_place packs or
    rounds as asked."""
    from pyggml.backends.cpu.kernels.vec_dot import kinds, quantize_src1

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 100)) * np.exp2(rng.integers(-140, 20, (3, 100)))).astype(np.float32)
    x[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    rounded = x.copy()
    quantize_src1.round_rows(kinds.BF16, rounded)
    want = (rounded.view(np.uint32) >> 16).astype(np.uint16)
    assert np.any(((want & 0x7F80) == 0) & ((want & 0x7F) != 0))  # the data has bf16 denormals to zero
    expect = np.where((want & 0x7F80) == 0, want & 0x8000, want)
    into, inplace, helper = np.zeros_like(x), x.copy(), x.copy()
    quantize_src1.pack_bf16_pairs(x, into)
    quantize_src1.pack_bf16_pairs(inplace, inplace)
    quantize_src1.half_rows_in_place(kinds.F16, True, helper)
    for got in (into, inplace, helper):
        bits = got.view(np.uint16).reshape(3, 200)[:, :100]
        assert np.array_equal(bits[:, 1:], expect[:, 1:])
        assert (bits[0, 0] & 0x7FFF) > 0x7F80  # NaN stays NaN
    for kind in (kinds.F16, kinds.BF16, quantize_src1.NO_ROUNDING):
        got, want_values = x.copy(), x.copy()
        quantize_src1.half_rows_in_place(kind, False, got)
        if kind != quantize_src1.NO_ROUNDING:
            quantize_src1.round_rows(kind, want_values)
        assert np.array_equal(got.view(np.uint32), want_values.view(np.uint32)), kind


@pytest.mark.parametrize("n", [1, 10, 40])
def test_attention_s_f32_products_are_libggml_s_bit_for_bit(ggml_reference: object, n: int) -> None:
    """KQ as llama.cpp's graph has it with an f32 cache: a view of K's cells times the permuted Q of 4 heads sharing
    one KV head (src1 not contiguous: ggml's vec_dot_f32 rows at every column count), then KQ's softmax-sized
    result times V transposed (contiguous: tinyBLAS from 2 columns)."""
    from pyggml.testing import ggml_c

    rng = np.random.default_rng(n)
    D, n_kv, H = 256, 96, 4
    ctx = new_ctx(64)
    try:
        k = tensor(ctx, GGMLType.F32, rng.standard_normal((1, 1, n_kv, D)).astype(np.float32))
        q = tensor(ctx, GGMLType.F32, rng.standard_normal((1, n, H, D)).astype(np.float32))
        kq = ctx.mul_mat(k, ctx.permute(q, 0, 2, 1, 3))
        v = tensor(ctx, GGMLType.F32, rng.standard_normal((1, 1, D, n_kv)).astype(np.float32))
        w = tensor(ctx, GGMLType.F32, rng.standard_normal((1, H, n, n_kv)).astype(np.float32))
        kqv = ctx.mul_mat(v, w)
        for node in (kq, kqv):
            want = ggml_c.compute_like(node)
            got = run(node, ComputeParams(n_threads=2, numerics="x86", x86_level=ggml_c.x86_level()))
            assert np.array_equal(got.reshape(want.shape).view(np.uint32), want.view(np.uint32)), \
                f"{node.op.name}: {np.count_nonzero(got.reshape(want.shape) != want)} of {want.size} differ"
    finally:
        ctx.free()


@pytest.mark.parametrize("wtype", HALF_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize(("numerics", "level"), [("x86", "avx2"), ("x86", "avx512"), ("x86", "avx512bf16"),
                                                 ("x86", "avx512fp16"), ("ref", "avx2")])
def test_expert_rows_take_mul_mat_s_order(wtype: GGMLType, numerics: str, level: str) -> None:
    """MUL_MAT_ID's F16/BF16 experts are summed in the order MUL_MAT's decode rows take at the same numerics and
    x86 level (ggml_vec_dot_f16/bf16; ggml's MUL_MAT_ID takes no llamafile): each (token, slot) row is, bit for
    bit, the MUL_MAT of its expert and the token's src1 row."""
    rng = np.random.default_rng(11)
    n_as, M, K, n_tok, n_used = 4, 24, 352, 5, 2
    raw = half_rows(rng, wtype, n_as * M, K).reshape(1, n_as, M, K)
    x = src1_rows(rng, n_tok, K)
    ids = np.stack([rng.permutation(n_as)[:n_used] for _ in range(n_tok)]).astype(np.int32)
    params = ComputeParams(n_threads=2, numerics=numerics, x86_level=level)
    half = (lambda a: a.view(np.float16)) if wtype == GGMLType.F16 else (lambda a: a)
    ctx = new_ctx(32)
    try:
        w = weight_tensor(ctx, wtype, half(raw))
        node = ctx.mul_mat_id(w, tensor(ctx, GGMLType.F32, x.reshape(1, n_tok, 1, K)),
                              tensor(ctx, GGMLType.I32, ids.reshape(1, 1, n_tok, n_used)))
        got = run(node, params).reshape(n_tok, n_used, M)
        assert np.any(got != 0)
        for t in range(n_tok):
            for j in range(n_used):
                expert = weight_tensor(ctx, wtype, half(raw[:, ids[t, j]][None]), name=f"e{t}{j}")
                want = run(ctx.mul_mat(expert, tensor(ctx, GGMLType.F32, x[t].reshape(1, 1, 1, K))), params)
                assert np.array_equal(got[t, j].view(np.uint32), want.reshape(M).view(np.uint32)), (t, j)
    finally:
        ctx.free()


@pytest.mark.parametrize("fma_chains", [False, True], ids=["separate", "fused"])
def test_f32_vec_dot_tail_fuses_its_last_k_mod_8_as_the_setting_says(fma_chains: bool) -> None:
    """ggml_vec_dot_f32 of fewer than 64 values is its tail alone: gcc takes it by 8 (products, then adds in
    order) and fuses the last K % 8 where it contracts loop chains (numerics.FMA_CHAINS); each setting against
    that loop written with numpy's float32 steps and libm's fmaf."""
    from numba import njit

    from pyggml.backends.cpu.kernels.vec_dot import half_orders as ho

    fmaf = libm_f32("fmaf", 3)
    loop = ho.make_half_cols(GGMLType.F32, ho.HALF_ORDERS[ho._ORDER["vec_dot_f32_avx512"]], fma_chains=fma_chains)

    @njit
    def rows(w: np.ndarray, w_off: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
        loop(w, w_off, 0, 0, w_off.size, x, 0, x.shape[0], out)

    rng = np.random.default_rng(13)
    M, K, n = 6, 29, 3  # 24 values by 8, then 5
    w = rng.standard_normal((M, K)).astype(np.float32)
    x = rng.standard_normal((n, K)).astype(np.float32)
    got = np.zeros((n, M), np.float32)
    rows(w.view(np.uint8).reshape(-1), np.arange(M, dtype=np.int64) * 4 * K, x, got)
    want = np.zeros((n, M), np.float32)
    for c, m in np.ndindex(n, M):
        total = np.float32(0.0)
        for k in range(K):
            fused = fma_chains and k >= K - K % 8
            total = np.float32(fmaf(w[m, k], x[c, k], total)) if fused else np.float32(total + w[m, k] * x[c, k])
        want[c, m] = total
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
