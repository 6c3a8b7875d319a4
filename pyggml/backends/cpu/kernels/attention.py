"""FLASH_ATTN_EXT on the CPU, as ggml-cpu's ggml_compute_forward_flash_attn_ext_f16.

F16 K and V on the shapes ggml walks row by row (fewer than GGML_FA_TILE_Q q rows, and not one q row over
GGML_FA_SPLIT_KV or more KV rows, which ggml splits over its threads): `flash_attn_rows_f16` follows ggml's
ggml_compute_forward_flash_attn_ext_f16_one_chunk float for float, its f16 V accumulator included, so that
llama.cpp's default cache (f16) with `-fa on` gives llama.cpp's bits (decoding, and prompts under 64 tokens).

Other types and shapes, vectorized over heads and rows: ggml walks the KV rows one at a time with an online
softmax; here every head's scores are one matrix product
and the softmax is taken whole, which is the same function. The two products are MUL_MAT's F32 products and the
weights SOFT_MAX's rows (V^T laid out as the non-flash KV cache lays it), so on F32 K and V flash attention gives
the bits of MUL_MAT -> SOFT_MAX_EXT -> MUL_MAT: `-fa on` and `-fa off` generate the same tokens. (ggml's own
online softmax differs from its non-flash path in the last bits, which a quantized model's activation rounding
can grow into different greedy tokens.) The numerics follow ggml where they matter:
- q is rounded to K's vec_dot_type before the dot products (F16 for F16 K, BF16 for BF16 K, Q8_0 for Q8_0,
  Q4_0, ...), as ggml's `q_to_vec_dot` does; K and V are read as f32.
- scale is divided by logit_softcap (when not 0) and the scores become softcap * tanh(s * scale).
- the mask (F16) times the ALiBi slope of the head is added; an all -inf row (no sinks) gives 0, as ggml's S == 0.
- sinks: one more logit per head that takes weight but has no value.
Accumulation is f32 here; ggml's tiled (64 or more q rows) and KV-split paths for F16 round in their own
order (the split one per thread count), not reproduced: a deviation well within test-backend-ops' 5e-4.

Batch-invariant (`params.batch_invariant`): every shape is walked row by row, F16 K and V by
`flash_attn_rows_f16`, other types by `flash_attn_rows_f32` (K and V read as f32, ggml's f32 V accumulator). A
q row's result is then a function of its own unmasked cells in their order alone: a cell masked -inf is
skipped, where the vectorized path sums all n_kv cells in vector lanes and other sequences' cells between a
sequence's own shift which lane each of its cells lands in.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numba import njit

from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel
from pyggml.backends.cpu.kernels._common import F32, noop, reshape_view
from pyggml.backends.cpu.kernels.matmul import TEAM, _weight_rows, mul_mat_f32
from pyggml.backends.cpu.kernels.norm import softmax_rows
from pyggml.backends.cpu.kernels.simd_math import host_lanes
from pyggml.backends.cpu.kernels.vec_dot.float_loops import dot_f32_row, mad_f32_row, scale_f32_row
from pyggml.backends.cpu.kernels.vec_dot.ir import fma_f16, fma_f32, load_f16, round_f16
from pyggml.backends.cpu.kernels.vec_dot.to_float import to_f32
from pyggml.backends.cpu.kernels.vec_dot.type_table import CPU_TYPE_TRAITS
from pyggml.core.errors import GGMLError, ShapeError, UnsupportedTypeError
from pyggml.core.ops.params import FlashAttnExtParams
from pyggml.core.quants import from_float_cpu
from pyggml.core.rope import alibi_slopes
from pyggml.core.tensor import GGMLOp, Prec, Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType

_PRECS = (Prec.DEFAULT, Prec.F32)  # ggml-cpu aborts on any other
_SCORES_PER_STEP = 1 << 22  # f32 scores computed at once (16 MiB): bounds the memory of a long prefill
# ggml-cpu's FLASH_ATTN_EXT takes its tiled path from this many q rows (GGML_FA_TILE_Q), and for one q row
# splits the KV rows over its threads from this many KV rows (use_split_kv_path): only below both does it
# walk the rows one by one (ggml_compute_forward_flash_attn_ext_f16_one_chunk)
GGML_FA_TILE_Q = 64
GGML_FA_SPLIT_KV = 512


# GGML_F16_STEP of an AVX512-FP16 build (x86 level "avx512fp16"): ggml_vec_mad_f16 and ggml_vec_scale_f16 then
# compute in half precision (_mm512_fmadd_ph, _mm512_mul_ph) by steps of 128 values, the rest in f32
_F16_HALF_STEP = 128


def _f16_row_settings(params: ComputeParams) -> tuple[int, int]:
    """(f32 lanes of ggml's F16 dot, GGML_F16_DOT_EPR: 8 at x86 level "avx2", else 16; `_F16_HALF_STEP` at level
    "avx512fp16", else 0) for the x86 build of params.x86_level; (0, 0) for ggml's scalar code."""
    if params.numerics != "x86":
        return 0, 0
    return (8 if params.x86_level == "avx2" else 16), (_F16_HALF_STEP if params.x86_level == "avx512fp16" else 0)


@njit(nogil=True, cache=True, inline="always")
def _dot_f16_values(k, q, lanes):
    """ggml_vec_dot_f16 of two rows of f16 values (held as float32): with `lanes` > 0 as ggml's x86 SIMD code
    (4 accumulators of `lanes` float lanes, FMA per 4 * lanes elements, accumulators 0+2 and 1+3 then
    together, lanes summed by halves (AVX512's _mm512_reduce_add_ps) or by hadd (AVX2, 8 lanes); the rest
    added in double), with 0 as its scalar code (products in float, summed in double)."""
    n = k.shape[0]
    step = 4 * lanes
    n_simd = n - n % step if lanes > 0 else 0
    total = 0.0  # ggml_float
    if n_simd > 0:
        acc = np.zeros((4, lanes), np.float32)
        for i in range(0, n_simd, step):
            for j in range(4):
                for t in range(lanes):
                    e = i + j * lanes + t
                    acc[j, t] = fma_f32(k[e], q[e], acc[j, t])  # f16 x f16 is exact in f32: fma or not
        v = np.empty(lanes, np.float32)
        for t in range(lanes):
            v[t] = (acc[0, t] + acc[2, t]) + (acc[1, t] + acc[3, t])
        if lanes == 8:  # GGML_F32x8_REDUCE: low + high halves, then two hadds
            a0, a1, a2, a3 = v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]
            red = (a0 + a1) + (a2 + a3)
        else:  # _mm512_reduce_add_ps: halves, lanes i and i + w/2
            w = lanes
            while w > 1:
                w //= 2
                for t in range(w):
                    v[t] = v[t + w] + v[t]
            red = v[0]
        total = np.float64(red)
    for e in range(n_simd, n):
        total += np.float64(k[e] * q[e])
    return np.float32(total)


@njit(inline="always", cache=True)
def online_softmax_step(M, s):
    """ggml's online softmax meeting score s with running maximum M: (new maximum, the factor the sums so far
    take: expf(M - s) for a new maximum, else 1, the weight of s: 1 for a new maximum, else expf(s - M))."""
    if s > M:
        return s, np.float32(math.exp(M - s)), np.float32(1.0)
    return M, np.float32(1.0), np.float32(math.exp(s - M))


@njit(inline="always", cache=True)
def _cell_step(s, scale, softcap, mv, M):
    """A KV cell's dot product s as ggml scores it (times scale; softcap * tanhf of that when softcap is not 0;
    plus slope * mask `mv`) met by the online softmax of running maximum M (`online_softmax_step`)."""
    s = s * scale
    if softcap != 0.0:
        s = softcap * np.float32(math.tanh(s))
    return online_softmax_step(M, s + mv)


@njit(inline="always", cache=True)
def _row_start(r, n, nh, acc):
    """Q row r's (i3, head, i1) in (ne3, nh, n) order, and the online softmax's start: S = 0, M = -inf, acc = 0."""
    acc[:] = 0.0
    return r // (n * nh), (r // n) % nh, r % n, np.float32(0.0), np.float32(-np.inf)


@njit(nogil=True, cache=True)
def flash_attn_rows_f16(q, k, v, mask, sinks, out, scale, softcap, slopes, lanes, half_step, acc, r0, r1):
    """ggml_compute_forward_flash_attn_ext_f16_one_chunk for F16 K and V, float for float, for the q rows r0..r1
    (row r being (i3, h, i1) in that order).

    q (ne3, nh, N, DK) rounded to f16, k (ne3, nk2, n_kv, DK) and v (ne3, nv2, n_kv, DV) as float32 (f16
    values), mask (nm3, nm2, N, n_kv) float32 or empty, sinks (nh,) or empty, slopes (nh,), out (ne3, nh, N,
    DV), acc (DV,) scratch. Per q row: scores by ggml_vec_dot_f16 (`lanes`, see _dot_f16_values) times scale (softcap *
    tanhf(score) when softcap is not 0) plus slope * mask, KV rows whose mask is -inf skipped; an online
    softmax whose V accumulator is f16 (each rescale `f16(acc * ms)` and each step `f16(fma(v, vs, acc))`,
    as ggml_vec_scale_f16/ggml_vec_mad_f16), S = fma(S, ms, vs) (gcc's contraction), libm's expf; then the
    sink (S * ms + vs, not contracted there: both checked bit for bit against libggml), and the accumulator
    times 1/S. `half_step` > 0 (GGML_F16_STEP of an AVX512-FP16 build): those two compute the accumulator's
    first DV - DV % half_step values in half precision, with ms and vs rounded to f16 (`_F16_HALF_STEP`).
    """
    nh, n = q.shape[1], q.shape[2]
    n_kv = k.shape[2]
    dv = v.shape[3]
    rk2 = nh // k.shape[1]
    rv2 = nh // v.shape[1]
    has_mask = mask.shape[3] > 0
    n_half = dv - dv % half_step if half_step > 0 else 0
    for r in range(r0, r1):
        i3, h, i1, S, M = _row_start(r, n, nh, acc)
        slope = slopes[h]
        qrow = q[i3, h, i1]
        for ic in range(n_kv):
            mv = np.float32(0.0)
            if has_mask:
                mv = slope * mask[i3 % mask.shape[0], h % mask.shape[1], i1, ic]
                if mv == -np.inf:
                    continue
            s = _dot_f16_values(k[i3, h // rk2, ic], qrow, lanes)
            M, ms, vs = _cell_step(s, scale, softcap, mv, M)
            if ms != 1.0:
                ms_half = round_f16(ms)
                for d in range(n_half):
                    acc[d] = round_f16(acc[d] * ms_half)  # f16 x f16 is exact in f32: one rounding
                for d in range(n_half, dv):
                    acc[d] = round_f16(acc[d] * ms)
            vrow = v[i3, h // rv2, ic]
            vs_half = round_f16(vs)
            for d in range(n_half):
                acc[d] = fma_f16(vrow[d], vs_half, acc[d])
            for d in range(n_half, dv):
                acc[d] = round_f16(fma_f32(vrow[d], vs, acc[d]))
            S = fma_f32(S, ms, vs)
        if sinks.shape[0] > 0:
            M, ms, vs = online_softmax_step(M, sinks[h])
            if ms != 1.0:
                for d in range(dv):
                    acc[d] = acc[d] * ms
            S = S * ms + vs
        s_inv = np.float32(0.0) if S == 0.0 else np.float32(1.0) / S
        for d in range(dv):
            out[i3, h, i1, d] = acc[d] * s_inv


@njit(nogil=True, cache=True)
def flash_attn_rows_f32(qf, nh, n, dk, kb, kf, k_off, vf, v_off, mb, m_off, n_kv, nk2, nv2, nm3, nm2, sinks, of,
                        scale, softcap, slopes, acc, r0, r1):
    """The walk of ggml_compute_forward_flash_attn_ext_f16_one_chunk over K and V read as f32 (its f32 V
    accumulator) for the q rows r0..r1 of qf, q (ne3, nh, n, dk) flat, row r being (i3, h, i1) in that order.

    K rows start at byte offsets k_off of kb (kf: the same memory as float32) in (i3, KV head, cell) order, V
    rows at float offsets v_off of vf likewise (nk2 and nv2 KV heads, n_kv cells); F16 mask rows at byte
    offsets m_off of mb in (i3 % nm3, h % nm2, i1) order (m_off empty: no mask); sinks (nh,) or empty; out
    of, out (ne3, n, nh, DV) flat; acc (DV,) scratch. Per row the cells go in order and a cell whose mask is -inf is
    skipped, so cells of other sequences between a row's own change nothing: the score q.k in 32 lanes
    (vec_dot's dot_f32_row; a tail past the last 32 one by one) times scale (softcap * tanhf(s) when softcap is
    not 0) plus slope * mask; an online softmax (a new maximum scales acc by expf(old - new), else the cell
    weighs expf(s - M)); acc = fma(v, weight, acc) and S = fma(S, ms, vs); the sink; out = acc * 1/S (0 if S
    is 0)."""
    dv = acc.shape[0]
    dk32 = dk - dk % 32
    rk2 = nh // nk2
    rv2 = nh // nv2
    has_mask = m_off.shape[0] > 0
    for r in range(r0, r1):
        i3, h, i1, S, M = _row_start(r, n, nh, acc)
        qo = r * dk
        k_row0 = (i3 * nk2 + h // rk2) * n_kv
        v_row0 = (i3 * nv2 + h // rv2) * n_kv
        mo = m_off[((i3 % nm3) * nm2 + h % nm2) * n + i1] if has_mask else 0
        slope = slopes[h]
        for ic in range(n_kv):
            mv = np.float32(0.0)
            if has_mask:
                mv = slope * load_f16(mb, mo + 2 * ic)
                if mv == -np.inf:
                    continue
            ko = k_off[k_row0 + ic]
            s = dot_f32_row(kb, ko, qf, qo, dk32)
            kfo = ko // 4
            for e in range(dk32, dk):
                s += kf[kfo + e] * qf[qo + e]
            M, ms, vs = _cell_step(s, scale, softcap, mv, M)
            if ms != 1.0:
                scale_f32_row(acc, 0, ms, dv)
            mad_f32_row(vf, v_off[v_row0 + ic], vs, acc, 0, dv)
            S = fma_f32(S, ms, vs)
        if sinks.shape[0] > 0:
            M, ms, vs = online_softmax_step(M, sinks[h])
            if ms != 1.0:
                scale_f32_row(acc, 0, ms, dv)
            S = S * ms + vs
        s_inv = np.float32(0.0) if S == 0.0 else np.float32(1.0) / S
        oo = ((i3 * n + i1) * nh + h) * dv
        for d in range(dv):
            of[oo + d] = acc[d] * s_inv


_FLOAT_KV = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)  # K and V types computed by products when not walked


def _kv_type_ok(t: GGMLType, vec_dot: bool) -> bool:
    """Whether K (vec_dot: q is converted to its vec_dot_type) or V rows of type `t` can be read."""
    row = CPU_TYPE_TRAITS.get(t)
    return row is not None and (not vec_dot or row.vec_dot_type is not None)


def _rows_contiguous(t: Tensor) -> bool:
    return t.nb[0] == TYPE_TRAITS[t.type].type_size


def supports(node: Tensor) -> bool:
    """q F32, K and V F32/F16/BF16 or a quantized type pyggml converts, mask F16, sinks F32, rows contiguous."""
    q, k, v, mask, sinks = node.src[:5]
    if q is None or k is None or v is None or node.type != GGMLType.F32:
        return False
    if q.type != GGMLType.F32 or not _kv_type_ok(k.type, True) or not _kv_type_ok(v.type, False):
        return False
    if mask is not None and mask.type != GGMLType.F16:
        return False
    if sinks is not None and sinks.type != GGMLType.F32:
        return False
    if not all(_rows_contiguous(t) for t in (q, k, v, mask) if t is not None):
        return False
    try:
        return FlashAttnExtParams.of(node).prec in _PRECS
    except GGMLError:  # a prec word that is no ggml_prec
        return False


def _to_vec_dot(q: np.ndarray, k_type: GGMLType, simd: bool) -> np.ndarray:
    """q (f32 rows) as ggml's q_to_vec_dot leaves it: rounded to K's vec_dot_type by the CPU's from_float (`simd`:
    Q8_0 by ggml's SIMD row), read back as f32."""
    vdt = CPU_TYPE_TRAITS[k_type].vec_dot_type
    if vdt == GGMLType.F32:
        return q
    return to_f32(vdt, from_float_cpu(vdt, q, simd))


def _as_f32(t: GGMLType, raw: np.ndarray) -> np.ndarray:
    """K or V rows as f32 (a view for F32; else a C-contiguous copy: a converted cache of a zero row stride kept
    its order, rows innermost, which the row walks cannot read as rows of bytes)."""
    return raw if t == GGMLType.F32 else to_f32(t, raw)


def _grouped(a: np.ndarray, n_kv_head: int) -> np.ndarray:
    """(ne3, n_head, N, X) -> (ne3, n_kv_head, n_head/n_kv_head * N, X): the q heads that share a KV head
    (q head h reads KV head h // (n_head/n_kv_head)) stacked as rows of one matrix product."""
    ne3, nh, n, x = a.shape
    return a.reshape(ne3, n_kv_head, nh // n_kv_head * n, x)


def _mask_of(mask: np.ndarray, ne3: int, nh: int, n: int, n_kv: int, slopes: np.ndarray | None) -> np.ndarray:
    """The mask at the scores' shape (ne3, nh, N, n_kv) in f32 (broadcastable): mask row i1 for q row i1, its
    dims 2 and 3 tiled (i % ne), times the head's ALiBi slope."""
    m = mask[:, :, :n, :n_kv].astype(F32)
    nm3, nm2 = m.shape[0], m.shape[1]
    if nm2 not in (1, nh):
        m = m[:, np.arange(nh) % nm2]
    if nm3 not in (1, ne3):
        m = m[np.arange(ne3) % nm3]
    if slopes is not None:
        m = m * slopes.reshape(1, nh, 1, 1)
    return m


def _rows_on_threads(n_rows: int, dv: int, params: ComputeParams,
                     walk: Callable[[np.ndarray, int, int], object]) -> None:
    """walk(acc, r0, r1) over the q rows 0..n_rows in chunks that params.n_threads threads share (TEAM), each
    thread with its own accumulator acc (dv,): a row's result is its own walk's, whichever thread takes it."""
    n_threads = max(1, min(params.n_threads, n_rows))
    accs = np.empty((n_threads, dv), F32)
    chunk = max(1, -(-n_rows // (4 * n_threads)))  # a few chunks a thread: a busier core takes fewer
    TEAM.run(lambda slot, i: walk(accs[slot], i * chunk, min(n_rows, (i + 1) * chunk)), -(-n_rows // chunk),
             n_threads)


def _walk_f32(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, k_type: GGMLType,
              v_type: GGMLType, dv: int, dst: np.ndarray, scale: np.float32, softcap: np.float32,
              slopes: np.ndarray | None, sink4: np.ndarray | None, simd: bool, params: ComputeParams) -> Compute:
    """FLASH_ATTN_EXT by `flash_attn_rows_f32`: K and V (raw, `dv` values a V row) read as f32 (F32 ones in
    place), q rounded to K's vec_dot_type, the q rows shared by the threads (`_rows_on_threads`)."""
    ne3, nh, n, dk = q.shape
    n_kv, nk2, nv2 = k.shape[2], k.shape[1], v.shape[1]
    out = reshape_view(dst, (-1,))
    if out is None:
        raise ShapeError(f"CPU FLASH_ATTN_EXT: dst with shape {dst.shape} and strides {dst.strides} is not contiguous")
    slopes_f = (slopes if slopes is not None else np.ones(nh)).astype(F32)
    sinks_f = (sink4.reshape(-1) if sink4 is not None else np.zeros(0)).astype(F32)
    if mask is not None:
        mb, m_off = _weight_rows(mask[:, :, :n, :n_kv])
        nm3, nm2 = mask.shape[0], mask.shape[1]
    else:
        mb, m_off, nm3, nm2 = np.zeros(0, np.uint8), np.zeros(0, np.int64), 1, 1

    def operands() -> tuple[np.ndarray, ...]:
        """K's memory as bytes and as float32 and its rows' byte offsets; V's as float32 and its rows' offsets."""
        kb, k_off = _weight_rows(_as_f32(k_type, k))
        vb, v_off = _weight_rows(_as_f32(v_type, v))
        return kb, kb.view(F32), k_off, vb.view(F32), v_off // 4

    in_place = operands() if k_type == v_type == GGMLType.F32 else None  # the cache's own memory

    def run() -> None:
        kb, kf, k_off, vf, v_off = in_place if in_place is not None else operands()
        qv = np.ascontiguousarray(_to_vec_dot(q, k_type, simd), dtype=F32).reshape(-1)

        def walk(acc: np.ndarray, r0: int, r1: int) -> None:
            flash_attn_rows_f32(qv, nh, n, dk, kb, kf, k_off, vf, v_off, mb, m_off, n_kv, nk2, nv2, nm3, nm2, sinks_f,
                                out, scale, softcap, slopes_f, acc, r0, r1)

        _rows_on_threads(ne3 * nh * n, dv, params, walk)

    return run


def flash_attn_ext_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                          params: ComputeParams) -> Compute:
    """dst[i3, i1, h] = softmax(softcap(q·K^T * scale) + slope * mask + [sink]) · V for KV head h // (n_head/n_kv)."""
    if not supports(node):
        raise UnsupportedTypeError(f"CPU FLASH_ATTN_EXT '{node.name}': types "
                                   f"{[None if s is None else s.type.name for s in node.src[:5]]} or layout not "
                                   "supported (q F32, K/V F32/F16/BF16/quantized, mask F16, sinks F32, rows "
                                   "contiguous, prec DEFAULT or F32)")
    q_t, k_t, v_t, m_t, s_t = node.src[:5]
    assert q_t is not None and k_t is not None and v_t is not None
    q, k, v, mask = srcs[0], srcs[1], srcs[2], srcs[3]
    sinks = srcs[4] if len(srcs) > 4 else None
    assert q is not None and k is not None and v is not None
    p = FlashAttnExtParams.of(node)
    ne3, nh, n, dk = q.shape
    nk2, n_kv = k_t.ne[2], k_t.ne[1]
    nv2, dv = v_t.ne[2], v_t.ne[0]
    if (k_t.ne[0] != dk or v_t.ne[1] != n_kv or min(nk2, nv2) < 1 or nh % nk2 or nh % nv2 or k_t.ne[3] != ne3
            or v_t.ne[3] != ne3 or dst.shape != (ne3, n, nh, dv)):
        raise ShapeError(f"CPU FLASH_ATTN_EXT '{node.name}': q {q_t.ne}, k {k_t.ne}, v {v_t.ne}, dst {node.ne} "
                         "do not fit")
    # the row walks read the mask's rows and the sinks unchecked: a mask row per q row, a cell per KV cell
    if m_t is not None and (m_t.ne[0] < n_kv or m_t.ne[1] < n or 0 in m_t.ne[2:]):
        raise ShapeError(f"CPU FLASH_ATTN_EXT '{node.name}': mask {m_t.ne} for {n} q rows over {n_kv} KV cells")
    if s_t is not None and (s_t.ne[0] < nh or 0 in s_t.ne[1:]):
        raise ShapeError(f"CPU FLASH_ATTN_EXT '{node.name}': sinks {s_t.ne} for {nh} heads")
    if dst.size == 0:
        return noop
    out = dst.transpose(0, 2, 1, 3)  # (ne3, nh, N, DV): the result is permuted (heads before tokens)
    if n_kv == 0:
        def zero() -> None:
            out[...] = 0.0

        return zero
    scale = np.float32(p.scale)
    softcap = np.float32(p.logit_softcap)
    if softcap != 0.0:
        scale = np.float32(scale / softcap)
    slopes = alibi_slopes(nh, p.max_bias) if p.max_bias > 0.0 else None
    sink4 = None
    if s_t is not None and sinks is not None:
        sink4 = sinks.reshape(-1)[:nh].astype(F32).reshape(1, nh, 1, 1)
    k_type, v_type = k_t.type, v_t.type

    # rows of q per step: the scores of a step (ne3 * nh * rows * n_kv f32) stay near _SCORES_PER_STEP
    step = max(1, min(n, _SCORES_PER_STEP // max(1, ne3 * nh * n_kv)))

    def attend(qv: np.ndarray, kf: np.ndarray, vt: np.ndarray, rows: slice) -> None:
        """out[:, :, rows] from q's rows `rows` (qv: those rows, in K's vec_dot_type; vt: V^T)."""
        s = np.empty((ne3, nh, qv.shape[2], n_kv), F32)
        mul_mat_f32(s, kf, qv, params)()
        s *= scale
        if softcap != 0.0:
            np.tanh(s, out=s)
            s *= softcap
        m = _mask_of(mask[:, :, rows], ne3, nh, s.shape[2], n_kv, slopes) if mask is not None else None
        softmax_rows(s, m, sink4, s, lanes_exp, empty_rows_zero=True)
        mul_mat_f32(out[:, :, rows], vt, s, params)()

    # the shapes ggml walks row by row (one_chunk), and every shape when batch-invariant: a row's result then
    # depends on its own cells only, in their order, whatever the other rows and cells
    walk = params.batch_invariant or (n < GGML_FA_TILE_Q and not (n == 1 and ne3 == 1 and n_kv >= GGML_FA_SPLIT_KV))
    if k_type == v_type == GGMLType.F16 and walk:
        # ggml's arithmetic, f16 V accumulator included
        lanes, half_step = _f16_row_settings(params)
        slopes_f = (slopes if slopes is not None else np.ones(nh)).astype(F32)
        sinks_f = (sink4.reshape(-1) if sink4 is not None else np.zeros(0)).astype(F32)
        mask_view = mask[:, :, :n, :n_kv] if mask is not None else None

        def run_rows() -> None:
            qh = q.astype(np.float16).astype(F32)  # ggml's q_to_vec_dot for F16 K (round to nearest even)
            mf = mask_view.astype(F32) if mask_view is not None else np.zeros((1, 1, 1, 0), F32)
            kf, vf = k.astype(F32), v.astype(F32)

            def walk(acc: np.ndarray, r0: int, r1: int) -> None:
                flash_attn_rows_f16(qh, kf, vf, mf, sinks_f, out, np.float32(scale), np.float32(softcap), slopes_f,
                                    lanes, half_step, acc, r0, r1)

            _rows_on_threads(ne3 * nh * n, dv, params, walk)

        return run_rows
    simd = params.numerics == "x86"
    if params.batch_invariant or not (k_type == v_type and k_type in _FLOAT_KV):
        # a quantized K or V, or two types: ggml walks every shape row by row (one_chunk), f32 V accumulator
        return _walk_f32(q, k, v, mask, k_type, v_type, dv, dst, scale, softcap, slopes, sink4, simd, params)

    lanes_exp = host_lanes(params.numerics)  # SOFT_MAX's exp: the same bits as MUL_MAT -> SOFT_MAX -> MUL_MAT

    def run() -> None:
        kf = _as_f32(k_type, k)
        # V^T in rows, as the KV cache lays V out for MUL_MAT: the product then has MUL_MAT's bits
        vt = np.ascontiguousarray(_as_f32(v_type, v).swapaxes(-1, -2))
        with np.errstate(all="ignore"):  # C float semantics: -inf logits and 0 * inf without warnings
            for i in range(0, n, step):
                rows = slice(i, min(i + step, n))
                attend(_to_vec_dot(q[:, :, rows], k_type, simd), kf, vt, rows)

    return run


KERNELS: dict[GGMLOp, Kernel] = {GGMLOp.FLASH_ATTN_EXT: flash_attn_ext_kernel}
