"""FLASH_ATTN_EXT: the builder's shapes, op_params words and errors; the CPU kernel against a numpy reference
(softmax(q·k^T * scale + mask) · v, written here in float64); every op checker case against real ggml (skipped
only without a C compiler); and a decode step of SmolLM2-135M's size fast enough."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kernel_helpers import libm_f32, new_ctx, run, tensor

from pyggml.backends.cpu import cpu_init
from pyggml.backends.cpu.kernels import ComputeParams
from pyggml.capi import core as capi
from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError, ShapeError
from pyggml.core.ops.params import FlashAttnExtParams
from pyggml.core.tensor import GGMLOp, Prec, Tensor
from pyggml.core.types import GGMLType, from_float, to_float
from pyggml.ggml_backend import Backend
from pyggml.testing import op_check
from pyggml.testing.cases_flash_attn import flash_attn_ext_cases

F32, F16, BF16, Q8_0, Q4_0 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0
rng = np.random.default_rng(11)


def rand(*shape: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(np.float32)


def stored(type: GGMLType, x: np.ndarray) -> np.ndarray:
    """The values a tensor of `type` holds after storing x (row-wise along the last axis)."""
    return x if type == F32 else to_float(type, from_float(type, x))


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: float,
              max_bias: float = 0.0, softcap: float = 0.0, sinks: np.ndarray | None = None) -> np.ndarray:
    """The definition in float64, numpy order: q (ne3, H, N, D), k/v (ne3, Hkv, KV, D), mask (m3, m2, >=N, KV);
    result (ne3, N, H, Dv) (ggml's permuted result)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    n_head, n = q.shape[1], q.shape[2]
    out = np.zeros((q.shape[0], n, n_head, v.shape[-1]))
    n_log2 = 1 << int(math.floor(math.log2(n_head)))
    for i3 in range(q.shape[0]):
        for h in range(n_head):
            kh, vh = k[i3, h // (n_head // k.shape[1])], v[i3, h // (n_head // v.shape[1])]
            s = q[i3, h] @ kh.T * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            if mask is not None:
                slope = 1.0
                if max_bias > 0:
                    slope = (2 ** (-max_bias / n_log2 * (h + 1)) if h < n_log2
                             else 2 ** (-max_bias / 2 / n_log2 * (2 * (h - n_log2) + 1)))
                m = mask[i3 % mask.shape[0], h % mask.shape[1], :n, : kh.shape[0]].astype(np.float64)
                s = s + slope * m
            logits = s if sinks is None else np.concatenate([s, np.full((n, 1), sinks[h])], axis=1)
            top = logits.max(axis=1, keepdims=True)
            top[np.isneginf(top)] = 0.0
            e = np.exp(logits - top)
            total = e.sum(axis=1, keepdims=True)
            w = e[:, : kh.shape[0]]
            out[i3, :, h] = np.divide(w @ vh, total, out=np.zeros((n, vh.shape[1])), where=total != 0)
    return out


def fa(ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, max_bias: float = 0.0,
       softcap: float = 0.0, sinks: Tensor | None = None) -> Tensor:
    out = ctx.flash_attn_ext(q, k, v, mask, scale, max_bias, softcap)
    if sinks is not None:
        ops.flash_attn_ext_add_sinks(out, sinks)
    return out


def nmse(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.sum((got - want) ** 2) / np.sum(want**2))


# --- builder ---


def test_shape_op_params_and_srcs_as_ggml() -> None:
    ctx = new_ctx()
    q = ctx.new_tensor_4d(F32, 64, 7, 8, 2)
    k = ctx.new_tensor_4d(F16, 64, 33, 2, 2)
    v = ctx.new_tensor_4d(F16, 40, 33, 2, 2)
    m = ctx.new_tensor_4d(F16, 33, 7, 1, 2)
    out = capi.ggml_flash_attn_ext(ctx, q, k, v, m, 0.125, 2.0, 30.0)
    assert out.op == GGMLOp.FLASH_ATTN_EXT and out.type == F32
    assert out.ne == [40, 8, 7, 2]  # [n_embd_v, n_head, n_batch, ne3]: permuted
    assert out.src[:5] == [q, k, v, m, None]
    assert [out.get_op_params_f32(i) for i in range(3)] == [0.125, 2.0, 30.0]
    assert out.get_op_params_i32(3) == 0 and out.get_op_params_i32(4) == 0
    capi.ggml_flash_attn_ext_set_prec(out, capi.GGML_PREC_F32)
    assert out.get_op_params_i32(3) == 10 and capi.ggml_flash_attn_ext_get_prec(out) == Prec.F32
    capi.ggml_flash_attn_ext_set_n_kv_max(out, 16)
    assert out.get_op_params_i32(4) == 16 and out.get_op_params_f32(0) == 0.125  # the other words kept
    assert FlashAttnExtParams.of(out) == FlashAttnExtParams(scale=0.125, max_bias=2.0, logit_softcap=30.0,
                                                            prec=Prec.F32, n_kv_max=16)
    s = ctx.new_tensor_1d(F32, 8)
    capi.ggml_flash_attn_ext_add_sinks(out, s)
    assert out.src[4] is s
    capi.ggml_flash_attn_ext_add_sinks(out, None)
    assert out.src[4] is None
    assert ctx.flash_attn_ext(q, k, v, None, 1.0).src[3] is None


def test_builder_errors_name_the_op() -> None:
    ctx = new_ctx()
    q = ctx.new_tensor_4d(F32, 64, 4, 6, 1)
    k = ctx.new_tensor_4d(F16, 64, 32, 3, 1)
    v = ctx.new_tensor_4d(F16, 64, 32, 3, 1)
    bad = [
        (ShapeError, lambda: ctx.flash_attn_ext(q, ctx.new_tensor_4d(F16, 32, 32, 3, 1), v, None, 1.0)),
        (ShapeError, lambda: ctx.flash_attn_ext(q, ctx.new_tensor_4d(F16, 64, 32, 4, 1), v, None, 1.0)),
        (ShapeError, lambda: ctx.flash_attn_ext(q, k, ctx.new_tensor_4d(F16, 64, 31, 3, 1), None, 1.0)),
        (ShapeError, lambda: ctx.flash_attn_ext(q, k, ctx.new_tensor_4d(F16, 64, 32, 3, 2), None, 1.0)),
        (ShapeError, lambda: ctx.flash_attn_ext(q, k, v, ctx.new_tensor_4d(F32, 32, 4, 1, 1), 1.0)),
        (ShapeError, lambda: ctx.flash_attn_ext(q, k, v, ctx.new_tensor_4d(F16, 32, 4, 4, 1), 1.0)),
        (ShapeError, lambda: ctx.flash_attn_ext(q, k, v, ctx.new_tensor_4d(F16, 32, 3, 1, 1), 1.0)),
        (ArgumentError, lambda: ctx.flash_attn_ext(q, k, v, None, 1.0, 8.0)),
        (ArgumentError, lambda: ctx.flash_attn_ext(q, k, v, None, float("nan"))),
    ]
    for error, build in bad:
        with pytest.raises(error, match="flash_attn_ext"):
            build()
    out = ctx.flash_attn_ext(q, k, v, None, 1.0)
    with pytest.raises(ShapeError, match="flash_attn_ext_add_sinks"):
        ops.flash_attn_ext_add_sinks(out, ctx.new_tensor_1d(F32, 3))
    with pytest.raises(ArgumentError, match="prec"):
        ops.flash_attn_ext_set_prec(out, 7)
    with pytest.raises(ShapeError, match="FLASH_ATTN_EXT"):
        ops.flash_attn_ext_set_prec(q, Prec.F32)


# --- CPU kernel against numpy ---


@pytest.mark.parametrize("type_kv", [F32, F16, BF16, Q8_0, Q4_0])
@pytest.mark.parametrize("n_head, n_head_kv, n_batch", [(4, 4, 1), (6, 2, 5), (3, 1, 64)])
def test_kernel_matches_numpy(type_kv: GGMLType, n_head: int, n_head_kv: int, n_batch: int) -> None:
    ctx = new_ctx(32)
    d, n_kv = 64, 45
    qv, kv_, vv = rand(2, n_head, n_batch, d), rand(2, n_head_kv, n_kv, d), rand(2, n_head_kv, n_kv, d)
    mv = rand(1, 1, n_batch + 3, n_kv)  # more rows than tokens, as a padded mask
    mv[0, 0, 0, 7:20] = -np.inf
    mv[0, 0, -1, :] = -np.inf
    mv = mv.astype(np.float16)
    out = fa(ctx, tensor(ctx, F32, qv), tensor(ctx, type_kv, kv_), tensor(ctx, type_kv, vv), tensor(ctx, F16, mv),
             1 / 8)
    want = reference(qv, stored(type_kv, kv_), stored(type_kv, vv), mv, 1 / 8)
    # ggml rounds q to K's vec_dot_type (f16, bf16, q8_0) before the products: within 5e-4, like test-backend-ops
    assert nmse(run(out), want) < (1e-10 if type_kv == F32 else 1e-4)


@pytest.mark.parametrize("type_kv", [F16, Q8_0])
def test_the_row_walks_share_rows_among_threads_with_the_same_bits(type_kv: GGMLType) -> None:
    # F16 K and V under 64 q rows and any quantized K and V walk row by row: every thread count gives each row
    # the bits of its own walk
    ctx = new_ctx(32)
    qv, kv_, vv = rand(2, 6, 5, 64), rand(2, 2, 45, 64), rand(2, 2, 45, 64)
    mv = rand(1, 1, 8, 45).astype(np.float16)
    out = fa(ctx, tensor(ctx, F32, qv), tensor(ctx, type_kv, kv_), tensor(ctx, type_kv, vv), tensor(ctx, F16, mv),
             1 / 8, sinks=tensor(ctx, F32, rand(6)))
    one = run(out, ComputeParams(n_threads=1))
    assert np.isfinite(one).all()
    for n_threads in (2, 3, 7):
        out.numpy()[...] = np.nan  # a row no thread writes stays NaN
        np.testing.assert_array_equal(run(out, ComputeParams(n_threads=n_threads)), one)


def test_sinks_alibi_softcap_and_empty_rows() -> None:
    ctx = new_ctx()
    n_head, n_kv, d = 5, 30, 32
    qv, kv_, vv = rand(1, n_head, 3, d, lo=-3, hi=3), rand(1, n_head, n_kv, d), rand(1, n_head, n_kv, 48)
    mv = rand(1, 1, 3, n_kv).astype(np.float16)
    mv[0, 0, 1, :] = -np.inf  # nothing to attend to: 0, or only the sink's share (still 0)
    sv = rand(n_head, lo=-4, hi=4)
    args = (tensor(ctx, F32, qv), tensor(ctx, F32, kv_), tensor(ctx, F32, vv), tensor(ctx, F16, mv))
    out = fa(ctx, *args, 0.3, 8.0, 2.5, tensor(ctx, F32, sv))
    got = run(out)
    want = reference(qv, kv_, vv, mv, 0.3, 8.0, 2.5, sv)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not got[0, 1].any()
    no_sinks = run(fa(ctx, *args, 0.3))
    assert np.allclose(no_sinks, reference(qv, kv_, vv, mv, 0.3), rtol=1e-5, atol=1e-6)


def test_no_mask_and_permuted_inputs() -> None:
    ctx = new_ctx()
    qv, kv_, vv = rand(1, 4, 6, 16), rand(1, 2, 9, 16), rand(1, 2, 9, 16)
    # q, k, v stored [d, heads, tokens] and permuted to [d, tokens, heads], as llama.cpp views its caches
    q = ctx.permute(tensor(ctx, F32, qv.transpose(0, 2, 1, 3).copy()), 0, 2, 1, 3)
    k = ctx.permute(tensor(ctx, F16, kv_.transpose(0, 2, 1, 3).copy()), 0, 2, 1, 3)
    v = ctx.permute(tensor(ctx, F16, vv.transpose(0, 2, 1, 3).copy()), 0, 2, 1, 3)
    got = run(fa(ctx, q, k, v, None, 0.25))
    assert nmse(got, reference(qv, stored(F16, kv_), stored(F16, vv), None, 0.25)) < 1e-5


@pytest.mark.parametrize("n_head, n_head_kv, n_batch", [(9, 3, 1), (9, 3, 5), (4, 4, 7)])
def test_f32_cache_gives_the_bits_of_mul_mat_soft_max(n_head: int, n_head_kv: int, n_batch: int) -> None:
    """On F32 K and V the kernel's products are MUL_MAT's and its weights SOFT_MAX's, so flash attention and
    MUL_MAT -> SOFT_MAX_EXT -> MUL_MAT (V transposed, as the non-flash KV cache stores it) agree to the bit: a
    model generates the same tokens with -fa on and off."""
    ctx = new_ctx(32)
    d, n_kv = 64, 256
    qv, kv_, vv = rand(1, n_head, n_batch, d, lo=-3, hi=3), rand(1, n_head_kv, n_kv, d), rand(1, n_head_kv, n_kv, d)
    mv = np.zeros((1, 1, n_batch, n_kv), np.float32)
    mv[..., 40:] = -np.inf  # the cells past the used ones, as the padded KV length leaves them
    mv[0, 0, :, 3] = -np.inf
    q, k = tensor(ctx, F32, qv), tensor(ctx, F32, kv_)
    flash = run(fa(ctx, q, k, tensor(ctx, F32, vv), tensor(ctx, F16, mv.astype(np.float16)), 0.125))
    kq = ctx.mul_mat(k, q)
    weights = ctx.soft_max_ext(kq, tensor(ctx, F32, mv), 0.125, 0.0)
    kqv = ctx.mul_mat(tensor(ctx, F32, vv.swapaxes(-1, -2).copy()), weights)  # [d, N, heads]
    run(kq), run(weights)  # run() computes one node: its sources first
    plain = run(kqv)
    assert np.array_equal(flash, plain.transpose(0, 2, 1, 3))
    assert nmse(flash, reference(qv, kv_, vv, mv, 0.125)) < 1e-10


def test_long_prefill_is_computed_in_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows of q go through in steps that bound the scores' memory: the same result, step by step."""
    from pyggml.backends.cpu.kernels import attention

    monkeypatch.setattr(attention, "_SCORES_PER_STEP", 3 * 4 * 20)  # 3 rows of 4 heads by 20 keys a step
    ctx = new_ctx()
    qv, kv_, vv = rand(1, 4, 10, 32), rand(1, 2, 20, 32), rand(1, 2, 20, 32)
    mv = np.triu(np.full((10, 20), -np.inf), 11).astype(np.float16).reshape(1, 1, 10, 20)  # causal
    got = run(fa(ctx, tensor(ctx, F32, qv), tensor(ctx, F32, kv_), tensor(ctx, F32, vv), tensor(ctx, F16, mv), 0.2))
    assert np.allclose(got, reference(qv, kv_, vv, mv, 0.2), rtol=1e-5, atol=1e-6)


def test_cpu_refuses_what_ggml_cpu_refuses() -> None:
    ctx = new_ctx()
    backend = cpu_init()
    q = ctx.new_tensor_4d(F32, 64, 2, 4, 1)
    k = ctx.new_tensor_4d(F16, 64, 8, 4, 1)
    out = ctx.flash_attn_ext(q, k, k, None, 1.0)
    assert backend.supports_op(out)
    ops.flash_attn_ext_set_prec(out, Prec.F16)  # ggml-cpu aborts on any precision but DEFAULT and F32
    assert not backend.supports_op(out)
    assert not backend.supports_op(ctx.flash_attn_ext(ctx.new_tensor_4d(F16, 64, 2, 4, 1), k, k, None, 1.0))
    backend.free()


# --- against real ggml ---


def test_every_case_against_ggml(ggml_reference: Backend) -> None:
    results = op_check.run_cases(flash_attn_ext_cases(), ggml_reference)
    bad = [(r.case.desc, r.status, r.detail) for r in results if r.status != "OK"]
    assert not bad, bad
    assert len(results) >= 60


# --- the F16 row walk's V sums at each x86 level (AVX512-FP16 sums in half precision) ---

def _f16(x: float) -> np.float32:
    """x (a double, or a float32) rounded once to f16 (numpy's double-to-half conversion), as float32."""
    return np.float32(np.float16(x))


def _one_chunk_row(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, half: int) -> np.ndarray:
    """ggml_compute_forward_flash_attn_ext_f16_one_chunk for one q row of F16 K and V, written with libm's expf
    and fmaf: the scalar dot (float products summed in double); the accumulator's first `half` values scaled and
    summed in half precision (ms, vs rounded to f16; one rounding of the exact result), the rest through f32."""
    expf, fmaf = libm_f32("expf", 1), libm_f32("fmaf", 3)
    S, M = np.float32(0.0), np.float32(-np.inf)
    acc = np.zeros(v.shape[1], np.float32)
    for ic in range(k.shape[0]):
        total = 0.0
        for a, b in zip(k[ic], q, strict=True):
            total += float(np.float32(a * b))
        s = np.float32(np.float32(total) * np.float32(scale))
        ms, vs = np.float32(1.0), np.float32(1.0)
        if s > M:
            ms, M = np.float32(expf(M - s)), s
            acc[:half] = [_f16(a * _f16(ms)) for a in acc[:half]]
            acc[half:] = [_f16(np.float32(a * ms)) for a in acc[half:]]
        else:
            vs = np.float32(expf(s - M))
        vs_half = float(_f16(vs))
        acc[:half] = [_f16(float(x) * vs_half + float(a)) for x, a in zip(v[ic, :half], acc[:half], strict=True)]
        acc[half:] = [_f16(fmaf(x, vs, a)) for x, a in zip(v[ic, half:], acc[half:], strict=True)]
        S = np.float32(fmaf(S, ms, vs))
    return acc * (np.float32(1.0) / S)


@pytest.mark.parametrize(("numerics", "level"), [("ref", "avx2"), ("x86", "avx2"), ("x86", "avx512bf16"),
                                                 ("x86", "avx512fp16")])
def test_f16_row_walk_sums_v_as_each_x86_level(numerics: str, level: str) -> None:
    """The "avx512fp16" level sums V in half precision (the first 128 of 160 values), every other level and ggml's
    scalar code through f32; the scores are the scalar dot's (lanes 0) here."""
    from pyggml.backends.cpu.kernels.attention import _f16_row_settings, flash_attn_rows_f16

    lanes, half_step = _f16_row_settings(ComputeParams(numerics=numerics, x86_level=level))
    assert lanes == {"ref": 0, "avx2": 8}.get(numerics if numerics == "ref" else level, 16)
    assert half_step == (128 if level == "avx512fp16" else 0)

    g = np.random.default_rng(5)
    dk, dv, n_kv, n = 32, 160, 48, 2
    q = g.standard_normal((1, 1, n, dk)).astype(np.float16).astype(np.float32)
    k = g.standard_normal((1, 1, n_kv, dk)).astype(np.float16).astype(np.float32)
    v = (g.standard_normal((1, 1, n_kv, dv)) * 3).astype(np.float16).astype(np.float32)
    out = np.empty((1, 1, n, dv), np.float32)
    empty_mask, no_sinks, slopes = np.zeros((1, 1, 1, 0), np.float32), np.zeros(0, np.float32), np.ones(1, np.float32)
    flash_attn_rows_f16(q, k, v, empty_mask, no_sinks, out, np.float32(0.5), np.float32(0.0), slopes, 0, half_step,
                        np.empty(dv, np.float32), 0, n)
    half = dv - dv % half_step if half_step else 0
    want = np.stack([_one_chunk_row(q[0, 0, i], k[0, 0], v[0, 0], 0.5, half) for i in range(n)])
    np.testing.assert_array_equal(out[0, 0].view(np.uint32), want.view(np.uint32))
    if half_step:  # the level changes the bits: the other setting's walk gives others
        other = np.stack([_one_chunk_row(q[0, 0, i], k[0, 0], v[0, 0], 0.5, 0) for i in range(n)])
        assert np.count_nonzero(other[:, :half] != want[:, :half]) > 0
        np.testing.assert_array_equal(other[:, half:], want[:, half:])


def test_fma_f16_rounds_the_exact_result_once() -> None:
    """ir.fma_f16 against numpy's double-to-half rounding of a * b + c (exact in double for f16 operands), on
    operands of overlapping magnitudes (and ties); double rounding through float32 would differ on some."""
    from numba import njit

    from pyggml.backends.cpu.kernels.vec_dot.ir import fma_f16

    @njit
    def fmas(a: np.ndarray, b: np.ndarray, c: np.ndarray, out: np.ndarray) -> None:
        for i in range(a.size):
            out[i] = fma_f16(a[i], b[i], c[i])

    g = np.random.default_rng(3)
    size = 400_000
    a = (g.standard_normal(size) * 4).astype(np.float16)
    b = np.exp2(g.integers(-14, 2, size)).astype(np.float16) * g.integers(1, 2048, size).astype(np.float16) / 1024
    c = (g.standard_normal(size) * 8).astype(np.float16)
    a, b, c = (x.astype(np.float32) for x in (a, b, c))
    got = np.empty(size, np.float32)
    fmas(a, b, c, got)
    exact = a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)
    want = exact.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    twice = (a * b + c).astype(np.float16).astype(np.float32)  # float32's rounding, then f16's
    assert np.count_nonzero(twice != want) > 0
