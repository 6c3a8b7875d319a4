"""The MUL_MAT direct kernels' multi-column loops (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, IQ4_NL, MXFP4, F16,
BF16): a weight row dotted with up to `ir.COLS` src1 columns in one pass must give every column the
bits the one-column loop gives it.

Checked three ways: (1) through the kernel, an N-column product (N = 1..15: whole groups of COLS and every
remainder) against the N one-column products of its columns, on the calling thread and on 2 and 3
threads (the shared chunk counter), and with src1 split over broadcast slices; (2) the multi-column
intrinsics themselves against the one-column ones, with the portable block sums and with the target's
(AVX2's byte multiply-add where the host has it), and for IQ4_NL and MXFP4 the portable table lookup too,
so the result does not depend on the host's choice; (3) the K-quants' loops (Q4_K, Q6_K) against the numba
loops they replaced, on blocks of random bytes (every scale and bit pattern), to the bit;
F16 and BF16 rows also with lengths that are not multiples of 32 (a tail added element by element).
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import pytest
from kernel_helpers import BF16, F16, F32, compile_node, new_ctx, tensor
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels import ComputeParams, atomics, matmul
from pyggml.backends.cpu.kernels.vec_dot import (
    block_sums,
    float_loops,
    kinds,
    kquant_loops,
    mul_mat_job,
    quant_loops,
    quantize_src1,
    reference_dots,
    table_lookup,
)
from pyggml.backends.cpu.kernels.vec_dot import ir as vd_ir
from pyggml.core.types import TYPE_TRAITS, GGMLType

# the weight types with a multi-column loop, and the arguments of their row-loop generator
SPECS: dict[GGMLType, dict] = {
    GGMLType.Q4_0: quant_loops.Q4_0_SPEC,
    GGMLType.Q4_1: quant_loops.Q4_1_SPEC,
    GGMLType.Q5_0: quant_loops.Q5_0_SPEC,
    GGMLType.Q8_0: quant_loops.Q8_0_SPEC,
    GGMLType.IQ4_NL: quant_loops.IQ4_NL_SPEC,
    GGMLType.MXFP4: quant_loops.MXFP4_SPEC,
}
HALF_TYPES = (F16, BF16)
# the K-quants with a multi-column loop (kquant_loops.make_dot_k_row), and their row length here
K_SPECS: dict[GGMLType, dict] = {GGMLType.Q2_K: kquant_loops.Q2_K_SPEC, GGMLType.Q4_K: kquant_loops.Q4_K_SPEC,
                                  GGMLType.Q5_K: kquant_loops.Q5_K_SPEC, GGMLType.Q6_K: kquant_loops.Q6_K_SPEC}
# ggml's AVX2 order
K_X86: dict[GGMLType, tuple] = {GGMLType.Q2_K: kquant_loops.Q2_K_X86, GGMLType.Q4_K: kquant_loops.Q4_K_X86,
                                GGMLType.Q5_K: kquant_loops.Q5_K_X86, GGMLType.Q6_K: kquant_loops.Q6_K_X86}
K_LEN = 768  # 3 super-blocks
# the types whose "ref" rows sum one scalar in ggml's reference order (vec_dot.quant_loops.make_dot_q_serial)
SERIAL_TYPES = (GGMLType.Q5_0,)
MAX_N = 15  # below BLAS_MIN_COLS: every column count the direct kernels see
K = 224  # 7 blocks of 32: the 4-block unrolled loop and its 3-block tail
M = 37


def _src1_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Normal values with a random magnitude per 32-value block: block products of far apart exponents,
    whose float sums round (with similar magnitudes MXFP4's power-of-two scales sum exactly in any order, and
    a changed order would go unseen)."""
    k = shape[-1]
    padded = shape[:-1] + (-(-k // 32) * 32,)
    x = rng.standard_normal(padded).astype(np.float32)
    scale = np.exp(3 * rng.standard_normal(padded[:-1] + (padded[-1] // 32, 1))).astype(np.float32)
    return np.ascontiguousarray((x.reshape(scale.shape[:-1] + (32,)) * scale).reshape(padded)[..., :k])


def _product(ctx, w, x: np.ndarray, n_threads: int, numerics: str = "ref") -> np.ndarray:
    node = ctx.mul_mat(w, tensor(ctx, F32, x))
    compile_node(node, ComputeParams(n_threads=n_threads, numerics=numerics))()
    return node.numpy().copy()


@pytest.mark.parametrize(("wtype", "k"), [(t, K) for t in SPECS] + [(t, k) for t in HALF_TYPES for k in (K, 250)]
                         + [(t, K_LEN) for t in K_SPECS])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("numerics", ["ref", "x86"])
@pytest.mark.slow
def test_columns_equal_one_column_products(wtype: GGMLType, k: int, n_threads: int, numerics: str,
                                           rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """k 250 (F16, BF16): 7 lane blocks of 32 and 26 elements added one by one."""
    assert matmul.BLAS_MIN_COLS > MAX_N
    # threads from the smallest product up, or none at all
    monkeypatch.setattr(matmul, "PARALLEL_MIN_WORK", 0 if n_threads > 1 else 1 << 62)
    ctx = new_ctx(8)
    w = tensor(ctx, wtype, rng.standard_normal((M, k)).astype(np.float32))
    x = _src1_values(rng, (MAX_N, k))
    one = np.concatenate([_product(ctx, w, x[c:c + 1], n_threads, numerics)[0, 0] for c in range(MAX_N)])
    assert np.all(np.isfinite(one)) and np.any(one != 0)
    # K-quants under "x86": from TILED_MIN_COLS columns ggml-cpu's tiled order, each column's the same in any batch
    tiled = numerics == "x86" and int(wtype) in matmul.TILED_KINDS
    last = _product(ctx, w, x, n_threads, numerics)[0, 0]
    for n in range(1, MAX_N + 1):
        got = _product(ctx, w, x[:n], n_threads, numerics)[0, 0]
        assert np.array_equal(got, (last if tiled and n >= matmul.TILED_MIN_COLS else one)[:n]), n
    assert not tiled or not np.array_equal(last, one)


@pytest.mark.parametrize("wtype", [GGMLType.Q4_1, GGMLType.Q8_0, F16])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_columns_per_slice(wtype: GGMLType, n_threads: int, rng: np.random.Generator,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    """src1 of 2x4 matrices of 6 columns over 2 weight matrices (broadcast in dim 2): groups stay in a slice."""
    monkeypatch.setattr(matmul, "PARALLEL_MIN_WORK", 0 if n_threads > 1 else 1 << 62)
    ctx = new_ctx(8)
    w = tensor(ctx, wtype, rng.standard_normal((1, 2, M, K)).astype(np.float32))
    x = _src1_values(rng, (2, 4, 6, K))
    got = _product(ctx, w, x, n_threads)
    for c in range(6):
        want = _product(ctx, w, np.ascontiguousarray(x[:, :, c:c + 1]), n_threads)
        assert np.array_equal(got[:, :, c], want[:, :, 0]), c


def _sums(unsigned: bool) -> list:
    """Every block-sum variant the host can run: portable vector IR always; AVX2's vpmaddubsw + vpmaddwd
    and AVX512-VNNI's vpdpbusd only on CPUs that have them (a hardware condition, not a choice)."""
    names = ["portable"] + (["avx2"] if block_sums.HAS_AVX2 else []) + (["vnni"] if block_sums.HAS_VNNI else [])
    return [getattr(block_sums, f"block_sums{'_unsigned' if unsigned else ''}_{name}") for name in names]


def _settings(wtype: GGMLType, spec: dict) -> list[tuple[dict, str]]:
    """The generator spec of wtype with each block-sum variant the host runs (unsigned values: Q4_0's "ref"
    rows, Q4_1), and for the table types also the portable table lookup (the target's is vpshufb on AVX2)."""
    sums = _sums(bool(spec.get("minus_8") or spec.get("mins")))
    out = [(dict(spec, block_sums=s), s.__name__) for s in sums]
    if wtype in (GGMLType.IQ4_NL, GGMLType.MXFP4):
        table = kinds.KVALUES[int(wtype)]

        def portable(builder, p):
            return table_lookup.lookup16_portable(builder, table, block_sums.q4_0_nibbles(builder, p))

        out += [(dict(spec, block_sums=s, values=portable), s.__name__ + " + portable lookup") for s in sums]
    return out


def _src1(vdt: GGMLType, x: np.ndarray,
          rounding: int = quantize_src1.ROUND_REF) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x quantized to vdt (Q8_0 or Q8_1), as the arrays the row loops read: values, scales, and Q8_0's
    16-value sums or Q8_1's block sums s."""
    n, k = x.shape
    yq, yd, ys = np.zeros((n, k), np.int8), np.zeros((n, k // 32), np.float32), np.zeros((n, k // 32), np.float32)
    yb = np.zeros((n, k // 16), np.int32)
    quantize_src1.quantize_rows(int(vdt), x, yq, yd, ys, yb, rounding)
    return yq, yd, ys if vdt == GGMLType.Q8_1 else yb


def _loops(spec: dict, row_bytes: int, nb: int, layout: dict, serial: bool = False):
    """Two kernels over all weight rows and src1 rows: one with the row loop per column, one with the
    multi-column loop (with the `layout` options) in groups of n (`serial`: the generator of the
    reference-order rows, which has no layout options)."""
    if serial:
        return _kernels(quant_loops.make_dot_q_serial(**spec), quant_loops.make_dot_q_serial(**spec, ncols=vd_ir.COLS),
                        row_bytes, nb)
    return _kernels(quant_loops.make_dot_q_row(**spec), quant_loops.make_dot_q_row(**spec, **layout, ncols=vd_ir.COLS),
                    row_bytes, nb)


def _kernels(row, cols, row_bytes: int, nb: int):
    """The kernels of _loops from a generator's one-column and multi-column intrinsics."""

    @njit
    def by_rows(w, yq, yd, yb, out):
        for m in range(out.shape[1]):
            for r in range(out.shape[0]):
                out[r, m] = row(w, m * row_bytes, nb, yq, r * yq.shape[1], yd, r * yd.shape[1], yb, r * yb.shape[1])

    @njit
    def by_cols(w, yq, yd, yb, out, n):
        w_off = np.arange(out.shape[1]) * row_bytes
        for r in range(0, out.shape[0], n):
            cols(w, w_off, 0, 0, out.shape[1], nb, yq, yd, yb, r, min(n, out.shape[0] - r), out)

    return by_rows, by_cols


# the x86 numerics' row loops (ggml's AVX2 float order: one FMA accumulator) exist for these; the spec of
# those that read their values otherwise than their "ref" rows
X86_TYPES = (GGMLType.Q8_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q4_0)
X86_SPECS: dict[GGMLType, dict] = {GGMLType.Q4_0: quant_loops.Q4_0_X86_SPEC}


# the multi-column loops' options (make_dot_q_row's gather_min, signed_vnni_min, split_rows): the defaults
# (scales gathered per block from 2 columns on; signed values with VNNI's biased sums from 2 columns on,
# where the sums are VNNI's; two rows a pass for 1 to 3 or 4 columns); gathered, biased sums and two rows a
# pass for every count; none of them (M = 37 rows: an odd one after the pairs)
LAYOUTS: list[dict] = [{}, {"gather_min": 1, "signed_vnni_min": 1, "split_rows": tuple(range(1, vd_ir.COLS + 1))},
                       {"gather_min": vd_ir.COLS + 1, "signed_vnni_min": vd_ir.COLS + 1, "split_rows": ()}]


# (type, x86, layout): every layout of make_dot_q_row's loops; the serial rows (Q5_0's "ref") have none
LOOP_CASES = [(t, x86, layout) for t, x86 in [(t, False) for t in SPECS] + [(t, True) for t in X86_TYPES]
              for layout in range(len(LAYOUTS)) if layout == 0 or x86 or t not in SERIAL_TYPES]


@pytest.mark.parametrize(("wtype", "x86", "layout"), LOOP_CASES)
@pytest.mark.slow
def test_column_loops_equal_row_loop(wtype: GGMLType, x86: bool, layout: int, rng: np.random.Generator) -> None:
    """Each column of the multi-column loops equals the one-column loop's result, for every block-sum variant
    the host runs (and the tables' portable lookup) in the default layout, and for the host's own sums in the
    other layouts (the layout options do not touch the sums)."""
    nb = 9  # two unrolled iterations and a 1-block tail
    n_cols = 2 * vd_ir.COLS + 1
    raw = tensor(new_ctx(1), wtype, rng.standard_normal((M, 32 * nb)).astype(np.float32)).numpy()
    w = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    rounding = quantize_src1.ROUND_X86 if x86 else quantize_src1.ROUND_REF
    yq, yd, yb = _src1(TYPE_TRAITS[wtype].vec_dot_type, _src1_values(rng, (n_cols, 32 * nb)), rounding)
    serial = wtype in SERIAL_TYPES and not x86
    settings = _settings(wtype, X86_SPECS.get(wtype, SPECS[wtype]) if x86 else SPECS[wtype])
    if layout:
        settings = [(spec, setting) for spec, setting in settings if "portable lookup" not in setting
                    and spec["block_sums"] in (block_sums.target_block_sums, block_sums.target_block_sums_unsigned)]
        assert len(settings) == 1
    for spec, setting in settings:
        spec = spec if serial else dict(spec, x86=x86)
        by_rows, by_cols = _loops(spec, nb * TYPE_TRAITS[wtype].type_size, nb, LAYOUTS[layout], serial)
        want = np.zeros((n_cols, M), np.float32)
        by_rows(w, yq, yd, yb, want)
        assert np.all(np.isfinite(want)) and np.any(want != 0)
        for n in range(1, vd_ir.COLS + 1):  # groups of n, then what remains
            got = np.full((n_cols, M), np.nan, np.float32)
            by_cols(w, yq, yd, yb, got, n)
            assert np.array_equal(got, want), (setting, n)


def _half_loops(kind: int, k: int):
    """As _loops for F32/F16/BF16 weight rows of k elements: the row loop then the tail one by one (the
    one-column kernel's order), and the multi-column loop."""
    row = float_loops.make_dot_half_row(kind)
    cols = float_loops.make_dot_half_row(kind, vd_ir.COLS)
    k32 = k // 32 * 32
    size = 4 if kind == kinds.F32 else 2
    load = vd_ir.load_f16 if kind == kinds.F16 else vd_ir.load_bf16
    f32 = kind == kinds.F32

    @njit
    def by_rows(w, x, out):
        wf = w.view(np.float32)
        for m in range(out.shape[1]):
            for r in range(out.shape[0]):
                s = row(w, size * k * m, x, r * k, k32)
                for j in range(k32, k):
                    s += (wf[k * m + j] if f32 else load(w, 2 * (k * m + j))) * x[r, j]
                out[r, m] = s

    @njit
    def by_cols(w, x, out, n):
        w_off = np.arange(out.shape[1]) * size * k
        for r in range(0, out.shape[0], n):
            cols(w, w_off, 0, 0, out.shape[1], x, r, min(n, out.shape[0] - r), out)

    return by_rows, by_cols


@pytest.mark.parametrize("wtype", (F32, *HALF_TYPES))
@pytest.mark.parametrize("k", [64, 96, 250])
@pytest.mark.slow
def test_half_column_loops_equal_row_loop(wtype: GGMLType, k: int, rng: np.random.Generator) -> None:
    """Every column count gives each (row, column) the one-column loop's bits (k 64: attention's rows)."""
    n_cols = 2 * vd_ir.COLS + 1
    w = tensor(new_ctx(1), wtype, rng.standard_normal((M, k)).astype(np.float32)).numpy()
    w = np.ascontiguousarray(w).reshape(-1).view(np.uint8)
    x = _src1_values(rng, (n_cols, k))
    by_rows, by_cols = _half_loops(int(wtype), k)
    want = np.zeros((n_cols, M), np.float32)
    by_rows(w, x, want)
    assert np.all(np.isfinite(want)) and np.any(want != 0)
    for n in range(1, vd_ir.COLS + 1):
        got = np.full((n_cols, M), np.nan, np.float32)
        by_cols(w, x, got, n)
        assert np.array_equal(got, want), n


def _block_sums_kernel(fn):
    """A kernel writing fn's 8 int32 lane sums of two 32-byte int8 vectors."""
    @intrinsic
    def sums(typingctx, a, b, out):
        sig = types.void(a, b, out)

        def codegen(context, builder, signature, args):
            zero = ir.Constant(ir.IntType(64), 0)
            pa, pb, po = (atomics.element_pointer(context, builder, t, v, zero)
                          for t, v in zip(signature.args, args, strict=True))
            v = fn(builder, vd_ir.load_vector(builder, pa, vd_ir.IR_I8, 32),
                   vd_ir.load_vector(builder, pb, vd_ir.IR_I8, 32))
            builder.store(v, builder.bitcast(po, ir.VectorType(vd_ir.IR_I32, 8).as_pointer()), align=1)
            return context.get_dummy_value()

        return sig, codegen

    @njit
    def run(a, b, out):
        sums(a, b, out)

    return run


@pytest.mark.parametrize("unsigned", [False, True])
@pytest.mark.slow
def test_block_sums_are_ggml_lanes(unsigned: bool, rng: np.random.Generator) -> None:
    """Every variant the host runs gives the exact sums, in ggml's AVX2 lanes (lane i: products 4i..4i+3)
    where it claims them (all but the portable pairs-then-halves); weight values at the extremes the
    variants must take: -128..127 (Q8_0, tables), 0..128 unsigned (nibbles; vpmaddubsw's pairs stay below
    2^15), src1 -127..127 (q8)."""
    for trial in range(20):
        w = rng.integers(0, 129, 32) if unsigned else rng.integers(-128, 128, 32)
        if trial == 0:
            w[:] = 128 if unsigned else -128
        y = rng.integers(-127, 128, 32)
        if trial == 0:
            y[::2], y[1::2] = 127, -127
        prod = (w * y).astype(np.int64)
        quads = prod.reshape(8, 4).sum(1)
        pairs = prod.reshape(16, 2).sum(1)
        halves = pairs[:8] + pairs[8:]
        wb, yb = w.astype(np.uint8).view(np.int8), y.astype(np.int8)
        for fn in _sums(unsigned):
            out = np.zeros(8, np.int32)
            _block_sums_kernel(fn)(wb, yb, out)
            want = halves if fn.__name__.endswith("_portable") else quads
            assert np.array_equal(out, want), (fn.__name__, trial)


def test_block_sums_by_hardware() -> None:
    """VNNI's vpdpbusd where the target has it, AVX2's vpmaddubsw + vpmaddwd on AVX2-only CPUs, portable IR
    elsewhere; the host's pick is the default of every generator."""
    bs = block_sums
    assert bs.choose_block_sums(True, True) == (bs.block_sums_vnni, bs.block_sums_unsigned_vnni)
    assert bs.choose_block_sums(True, False) == (bs.block_sums_avx2, bs.block_sums_unsigned_avx2)
    assert bs.choose_block_sums(False, False) == (bs.block_sums_portable, bs.block_sums_unsigned_portable)
    assert (bs.target_block_sums, bs.target_block_sums_unsigned) == bs.choose_block_sums(bs.HAS_AVX2, bs.HAS_VNNI)


# --- K-quants ---


def _k_loops(spec: dict, row_bytes: int, nb: int):
    """As _loops for a K-quant's generator (make_dot_k_row)."""
    return _kernels(kquant_loops.make_dot_k_row(**spec), kquant_loops.make_dot_k_row(**spec, ncols=vd_ir.COLS),
                    row_bytes, nb)


def _q8_K(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n, k = x.shape
    yq, yd, ys = np.zeros((n, k), np.int8), np.zeros((n, k // 256), np.float32), np.zeros((n, 0), np.float32)
    yb = np.zeros((n, k // 16), np.int32)
    quantize_src1.quantize_rows(kinds.Q8_K, x, yq, yd, ys, yb, quantize_src1.ROUND_REF)
    return yq, yd, yb


# the f16 fields (d, dmin) of each K-quant block: random bytes elsewhere, sane scales here
K_SCALE_FIELDS = {GGMLType.Q2_K: (80, 82), GGMLType.Q3_K: (108,), GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2),
                  GGMLType.Q6_K: (208,)}


def _random_k_rows(wtype: GGMLType, rng: np.random.Generator, m: int, nb: int) -> np.ndarray:
    """m rows of nb blocks of random bytes (every scale, min and quant bit pattern) with f16 scales of
    about 1e-3 (the bytes would make infinities and NaNs)."""
    size = TYPE_TRAITS[wtype].type_size
    raw = rng.integers(0, 256, (m, nb, size), dtype=np.uint8)
    for at in K_SCALE_FIELDS[wtype]:
        d = rng.uniform(1e-4, 1e-2, (m, nb)).astype(np.float16)
        raw[:, :, at:at + 2] = d.view(np.uint8).reshape(m, nb, 2)
    return raw.reshape(-1)


@pytest.mark.parametrize("wtype", list(K_SPECS))
@pytest.mark.parametrize("x86", [False, True])
@pytest.mark.slow
def test_k_column_loops_equal_row_loop(wtype: GGMLType, x86: bool, rng: np.random.Generator) -> None:
    nb = K_LEN // 256
    n_cols = 2 * vd_ir.COLS + 1
    w = _random_k_rows(wtype, rng, M, nb)
    yq, yd, yb = _q8_K(_src1_values(rng, (n_cols, K_LEN)))
    for sums in (kquant_loops.scaled_sums_portable, kquant_loops.target_scaled_sums):
        spec = dict(K_SPECS[wtype], scaled_sums=sums, x86=K_X86[wtype] if x86 else None)
        by_rows, by_cols = _k_loops(spec, nb * TYPE_TRAITS[wtype].type_size, nb)
        want = np.zeros((n_cols, M), np.float32)
        by_rows(w, yq, yd, yb, want)
        assert np.all(np.isfinite(want)) and np.any(want != 0)
        for n in range(1, vd_ir.COLS + 1):
            got = np.full((n_cols, M), np.nan, np.float32)
            by_cols(w, yq, yd, yb, got, n)
            assert np.array_equal(got, want), (sums.__name__, n)


# the numba loops the K-quant row loops replaced (the former _dot_q4_K, _dot_q6_K, reference_dots.dot_q3_K and
# dot_q5_K; Q4_K's and Q5_K's in one, Q3_K's and Q6_K's in one): ggml's reference arithmetic per super-block,
# whose bits the row loops keep (Q2_K's share Q4_K's finish; their integers are checked against libggml,
# test_kquant_tiled)


@njit
def _old_dot_q45_K(w, o, nb, yq, yd, yb, r, q5):
    # block_q4_K: d, dmin, scales[12], qs[128]; block_q5_K (q5): qh[32] before qs, the fifth bit of element
    # 64k+32h+l bit 2k+h of qh[l]; 32-element sub-blocks
    sumf = np.float32(0.0)
    yo = r * yq.shape[1]
    size, at = (176, 48) if q5 else (144, 16)
    for b in range(nb):
        ob = o + size * b
        j0 = yo + 256 * b
        isum = 0
        summs = 0
        for k in range(4):
            for h in range(2):
                sc, mn = reference_dots.scale_min_k4(w, ob + 4, 2 * k + h)
                j = j0 + 64 * k + 32 * h
                if q5:
                    isum += sc * vd_ir.dot_fields32(w, ob + at + 32 * k, 4 * h, 15, ob + 16, 2 * k + h, 1, 16, yq, j)
                else:
                    isum += sc * vd_ir.dot_bits32(w, ob + at + 32 * k, 4 * h, 15, yq, j)
                g = 16 * b + 4 * k + 2 * h
                summs += mn * (yb[r, g] + yb[r, g + 1])
        d = vd_ir.load_f16(w, ob) * yd[r, b]
        dmin = vd_ir.load_f16(w, ob + 2) * yd[r, b]
        sumf += d * np.float32(isum) - dmin * np.float32(summs)
    return sumf


@njit
def _old_dot_q36_K(w, o, nb, yq, yd, yb, r, q3):
    # block_q6_K: ql[128], qh[64], scales[16] (int8), d; value = (low4 | high2 << 4) - 32
    # block_q3_K (q3): hmask[32], qs[64], scales[12], d; value = low2 - (high bit ? 0 : 4)
    sumf = np.float32(0.0)
    yo = r * yq.shape[1]
    size, at_d, offset = (110, 108, 4) if q3 else (210, 208, 32)
    for b in range(nb):
        ob = o + size * b
        j0 = yo + 256 * b
        isum = 0
        for n in range(2):
            for q in range(4):
                for t in range(2):
                    sub = 8 * n + 2 * q + t
                    j = j0 + 128 * n + 32 * q + 16 * t
                    if q3:
                        v = vd_ir.dot_fields16(w, ob + 32 + 32 * n + 16 * t, 2 * q, 3, ob + 16 * t, 4 * n + q, 1, 4,
                                               yq, j)
                        sc = reference_dots.q3_K_scale(w, ob + 96, sub)
                    else:
                        v = vd_ir.dot_fields16(w, ob + 64 * n + 32 * (q & 1) + 16 * t, 4 * (q >> 1), 15,
                                               ob + 128 + 32 * n + 16 * t, 2 * q, 3, 16, yq, j)
                        sc = reference_dots.i8(np.int64(w[ob + 192 + sub]))
                    isum += sc * (v - offset * yb[r, 16 * b + sub])
        sumf += (vd_ir.load_f16(w, ob + at_d) * yd[r, b]) * np.float32(isum)
    return sumf


@pytest.mark.parametrize("wtype", [GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_k_rows_equal_the_numba_loops_they_replace(wtype: GGMLType, n_threads: int, rng: np.random.Generator,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the kernel (one thread / shared by threads), 1..9 columns, on random blocks."""
    monkeypatch.setattr(matmul, "PARALLEL_MIN_WORK", 0 if n_threads > 1 else 1 << 62)
    nb = K_LEN // 256
    size = TYPE_TRAITS[wtype].type_size
    w = _random_k_rows(wtype, rng, M, nb)
    x = _src1_values(rng, (9, K_LEN))
    yq, yd, yb = _q8_K(x)
    def old(m: int, r: int) -> float:
        if wtype in (GGMLType.Q3_K, GGMLType.Q6_K):
            return _old_dot_q36_K(w, m * nb * size, nb, yq, yd, yb, r, wtype == GGMLType.Q3_K)
        return _old_dot_q45_K(w, m * nb * size, nb, yq, yd, yb, r, wtype == GGMLType.Q5_K)

    want = np.array([[old(m, r) for m in range(M)] for r in range(9)], np.float32)
    assert np.all(np.isfinite(want)) and np.any(want != 0)
    ctx = new_ctx(8)
    wt = ctx.new_tensor(wtype, [K_LEN, M])
    wt.numpy()[...] = w.reshape(wt.numpy().shape)
    for n in (1, 2, 3, 4, 5, 9):
        got = _product(ctx, wt, x[:n], n_threads)[0, 0]
        assert np.array_equal(got, want[:n]), n



def _guarded(nbytes: int) -> tuple[np.ndarray, object]:
    """A uint8 array of nbytes that ends where an inaccessible page begins (a read past it faults)."""
    page = mmap.PAGESIZE
    size = -(-nbytes // page) * page
    mem = mmap.mmap(-1, size + page)
    libc = ctypes.CDLL(None, use_errno=True)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mem))
    assert libc.mprotect(ctypes.c_void_p(base + size), ctypes.c_size_t(page), 0) == 0  # PROT_NONE
    return np.frombuffer(mem, np.uint8, count=nbytes, offset=size - nbytes), mem


@pytest.mark.parametrize("wtype", [t for t in SPECS] + list(K_SPECS))
@pytest.mark.parametrize("rounding", [quantize_src1.ROUND_REF, quantize_src1.ROUND_X86])
def test_row_loops_read_no_byte_past_the_weights(wtype: GGMLType, rounding: int, rng: np.random.Generator) -> None:
    """The loops load a block's scales as wider vectors (a vcvtph2ps of 8 bytes): weights whose last block
    ends at an inaccessible page must compute without a fault, and equal the same weights elsewhere."""
    k = K_LEN if wtype in K_SPECS else K
    raw = tensor(new_ctx(1), wtype, rng.standard_normal((M, k)).astype(np.float32)).numpy()
    raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    w, mem = _guarded(raw.size)
    w[...] = raw
    nb = k // TYPE_TRAITS[wtype].blck_size
    w_off = np.arange(M, dtype=np.int64) * (raw.size // M)
    vdt = TYPE_TRAITS[wtype].vec_dot_type
    n = vd_ir.COLS + 1
    yq, yd, ys, yb = (np.zeros((n, k), np.int8), np.zeros((n, k // 32), np.float32), np.zeros((n, k // 32), np.float32),
                      np.zeros((n, k // 16), np.int32))
    quantize_src1.quantize_rows(int(vdt), _src1_values(rng, (n, k)), yq, yd, ys, yb, rounding)
    outs = []
    for weights in (w, raw):
        out = np.zeros((n, M), np.float32)
        desc = mul_mat_job.mul_mat_desc(int(wtype), weights, w_off, nb, np.zeros((0, 0), np.float32), yq, yd, ys, yb,
                                        n, np.zeros(1, np.int64), out, 0, np.zeros(2, np.int64), rounding)
        mul_mat_job.mul_mat_job(desc, False)
        outs.append(out)
    assert np.array_equal(outs[0], outs[1]) and np.any(outs[0] != 0)
    del w
    mem.close()
