"""The CPU kernels of TQ1_0, TQ2_0, NVFP4, Q1_0 and Q2_0 (vec_dot.low_bit), and GGUF files of these types.

The block sums in every variant the host runs (portable vector IR always, AVX2 and AVX512-VNNI where the CPU has
them) against integer sums in numpy: the weights' values come from the core's dequantizer (bit-exact with ggml) of
the same bytes with a scale of 1, so a wrong field, trit or table entry in any variant fails here, whatever CPU the
tests run on. The rows in ggml's AVX2 order from every variant equal the target's (test_numerics compares those with
libggml bit for bit), and the rows under numerics "ref" follow ggml's generic vec_dot step by step. MUL_MAT, GET_ROWS
and CPY against libggml are in test_iq_types.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from pyggml.backends.cpu.kernels.vec_dot import block_sums, low_bit, quantize_src1, table_lookup
from pyggml.core import quants
from pyggml.core.types import TYPE_TRAITS, GGMLType

T = GGMLType
NB = 64  # blocks of each type
ONE_F16 = np.array([1.0], "<f2").view(np.uint8)
ONE_UE4M3 = 0x40  # ggml_ue4m3_to_fp32(0x40) = 1.0: NVFP4's values are then kvalues_fp4 themselves


def variants() -> dict[str, tuple[Callable, Callable, Callable]]:
    """(unsigned and signed sums with the quads layout, table lookup) of every variant this host runs."""
    out = {"portable": (block_sums.block_sums_unsigned_quads, block_sums.block_sums_quads,
                        table_lookup.lookup16_portable)}
    if block_sums.HAS_AVX2:
        out["avx2"] = (block_sums.block_sums_unsigned_avx2, block_sums.block_sums_avx2, table_lookup.lookup16_avx2)
    if block_sums.HAS_VNNI:
        out["vnni"] = (block_sums.block_sums_unsigned_vnni, block_sums.block_sums_vnni, table_lookup.lookup16_avx2)
    return out


def unit_blocks(t: GGMLType, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(NB random blocks of t with scale 1, their values as int64 (NB, block size)): every byte value occurs."""
    tr = TYPE_TRAITS[t]
    raw = rng.integers(0, 256, (NB, tr.type_size), dtype=np.uint8)
    if t == T.NVFP4:
        raw[:, :4] = ONE_UE4M3
    else:
        off = quants.BLOCK_DTYPES[t].fields["d"][1]
        raw[:, off:off + 2] = ONE_F16
    values = quants.to_float(t, raw)
    assert np.array_equal(values, np.round(values))
    return raw, values.astype(np.int64)


@pytest.fixture(params=list(variants()))
def dots(request: pytest.FixtureRequest) -> low_bit.LowBitDots:
    return low_bit.make_low_bit_dots(*variants()[request.param])


def test_ternary_block_sums(dots: low_bit.LowBitDots, rng: np.random.Generator) -> None:
    """TQ1_0's trits and TQ2_0's fields (value + 1) times a whole Q8_K block of src1."""
    tq1, tq2 = dots.tq1_0, dots.tq2_0

    @njit
    def run(w: np.ndarray, y: np.ndarray, size: int, ternary1: bool, out: np.ndarray) -> None:
        for b in range(out.shape[0]):
            out[b] = tq1(w, size * b, y, 256 * b) if ternary1 else tq2(w, size * b, y, 256 * b)

    for t in (T.TQ1_0, T.TQ2_0):
        raw, values = unit_blocks(t, rng)
        y = rng.integers(-127, 128, (NB, 256), dtype=np.int8)
        got = np.zeros(NB, np.int32)
        run(raw.reshape(-1), y.reshape(-1), TYPE_TRAITS[t].type_size, t == T.TQ1_0, got)
        np.testing.assert_array_equal(got, ((values + 1) * y).sum(axis=1), err_msg=t.name)


def test_q1_0_q2_0_and_nvfp4_block_sums(dots: low_bit.LowBitDots, rng: np.random.Generator) -> None:
    """Q1_0's signs by quarters of 32, Q2_0's values by halves of 32, NVFP4's kvalues_fp4 by sub-blocks of 16."""
    q1, q2, fp4 = dots.q1_0_32, dots.q2_0_32, dots.fp4_pair

    @njit
    def run_q1(w: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
        for b in range(out.shape[0]):
            for k in range(4):
                out[b, k] = q1(w, 18 * b + 2 + 4 * k, y, 128 * b + 32 * k)

    @njit
    def run_q2(w: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
        for b in range(out.shape[0]):
            for k in range(2):
                out[b, k] = q2(w, 18 * b + 2 + 8 * k, y, 64 * b + 32 * k)

    @njit
    def run_fp4(w: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
        for b in range(out.shape[0]):
            for p in range(2):
                out[b, 2 * p], out[b, 2 * p + 1] = fp4(w, 36 * b + 4 + 16 * p, y, 64 * b + 32 * p)

    y = rng.integers(-127, 128, (NB, 128), dtype=np.int8)
    raw, values = unit_blocks(T.Q1_0, rng)
    got = np.zeros((NB, 4), np.int32)
    run_q1(raw.reshape(-1), y.reshape(-1), got)
    np.testing.assert_array_equal(got, (values * y).reshape(NB, 4, 32).sum(axis=2))
    y = y[:, :64].copy()
    raw, values = unit_blocks(T.Q2_0, rng)
    got = np.zeros((NB, 2), np.int32)
    run_q2(raw.reshape(-1), y.reshape(-1), got)
    np.testing.assert_array_equal(got, (values * y).reshape(NB, 2, 32).sum(axis=2))
    raw, values = unit_blocks(T.NVFP4, rng)
    got = np.zeros((NB, 4), np.int32)
    run_fp4(raw.reshape(-1), y.reshape(-1), got)
    np.testing.assert_array_equal(got, (values * y).reshape(NB, 4, 16).sum(axis=2))


def rows_of(dot: Callable) -> Callable:
    """A compiled out[r, m] = dot(weight row m, src1 row r) over all rows, for a row-dot intrinsic."""

    @njit
    def run(w: np.ndarray, row_bytes: int, nb: int, yq: np.ndarray, yd: np.ndarray, yb: np.ndarray,
            out: np.ndarray) -> None:
        for m in range(out.shape[1]):
            for r in range(out.shape[0]):
                out[r, m] = dot(w, m * row_bytes, nb, yq, yd, yb, r)

    return run


X86_ROWS = {T.TQ1_0: "tq1_0_x86", T.TQ2_0: "tq2_0_x86", T.Q1_0: "q1_0_x86", T.NVFP4: "nvfp4_x86"}


@pytest.mark.parametrize("wtype", list(X86_ROWS), ids=lambda t: t.name)
def test_x86_rows_of_every_variant_are_the_target_s(wtype: GGMLType, dots: low_bit.LowBitDots,
                                                    rng: np.random.Generator) -> None:
    """The rows in ggml's AVX2 order (which test_numerics compares with libggml bit for bit on x86 hosts) give the
    same floats from every variant's sums: the integers are exact, the float steps the same."""
    mine, target = (rows_of(getattr(d, X86_ROWS[wtype])) for d in (dots, low_bit.TARGET_DOTS))

    M, K, N = 8, 1024, 3
    raw = quants.from_float(wtype, rng.standard_normal((M, K)).astype(np.float32))
    vdt = TYPE_TRAITS[wtype].vec_dot_type
    qk = TYPE_TRAITS[vdt].blck_size
    x = rng.standard_normal((N, K)).astype(np.float32)
    yq, yd = np.zeros((N, K), np.int8), np.zeros((N, K // qk), np.float32)
    ys, yb = np.zeros((N, K // qk), np.float32), np.zeros((N, K // 16), np.int32)
    quantize_src1.quantize_rows(int(vdt), x, yq, yd, ys, yb, quantize_src1.ROUND_REF)
    nb = K // TYPE_TRAITS[wtype].blck_size
    got, want = np.zeros((N, M), np.float32), np.zeros((N, M), np.float32)
    mine(raw.reshape(-1), raw.shape[1], nb, yq, yd, yb, got)
    target(raw.reshape(-1), raw.shape[1], nb, yq, yd, yb, want)
    np.testing.assert_array_equal(got, want)
    values = quants.to_float(wtype, raw).astype(np.float64)
    y = quants.to_float(vdt, quants.from_float(vdt, x)).astype(np.float64)
    assert np.max(np.abs(got - y @ values.T)) < 1e-4 * np.max(np.abs(y @ values.T))


# per type: (weight values per scale, src1 blocks per weight block) of ggml's generic vec_dot (ggml-cpu/quants.c)
GENERIC = {T.TQ1_0: (256, 1), T.TQ2_0: (256, 1), T.NVFP4: (16, 2), T.Q1_0: (32, 4), T.Q2_0: (32, 2)}


def _scales_and_values(t: GGMLType, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the scales as float32 (M, blocks or sub-blocks), the integer values (M, K)) of rows of t."""
    M = raw.shape[0]
    blocks = raw.reshape(M, -1, TYPE_TRAITS[t].type_size).copy()
    if t == T.NVFP4:
        scales = low_bit.UE4M3[blocks[:, :, :4]].reshape(M, -1)
        blocks[:, :, :4] = ONE_UE4M3
    else:
        off = quants.BLOCK_DTYPES[t].fields["d"][1]
        scales = blocks[:, :, off:off + 2].copy().view("<f2").astype(np.float32)[..., 0]
        blocks[:, :, off:off + 2] = ONE_F16
    return scales, quants.to_float(t, blocks.reshape(M, -1)).astype(np.int64)


@pytest.mark.parametrize("wtype", list(GENERIC), ids=lambda t: t.name)
def test_ref_products_sum_in_ggml_generic_order(wtype: GGMLType, rng: np.random.Generator) -> None:
    """MUL_MAT under numerics "ref": ggml's generic vec_dot in float32, step by step (TQ: sum * (d_x * d_y) per
    block; Q1_0/Q2_0: d_y * sum per Q8_0 block into the block's sum, times d_x; NVFP4: d_y * d_s * sum per
    sub-block)."""
    from kernel_helpers import F32, new_ctx, run, tensor

    from pyggml.backends.cpu.kernels import ComputeParams

    M, N, K = 6, 3, 1024
    raw = quants.from_float(wtype, rng.standard_normal((M, K)).astype(np.float32))
    x = rng.standard_normal((N, K)).astype(np.float32)
    ctx = new_ctx(8)
    w = ctx.new_tensor(wtype, [K, M])
    w.numpy()[...] = raw.reshape(w.numpy().shape)
    got = run(ctx.mul_mat(w, tensor(ctx, F32, x[None, None])), ComputeParams(numerics="ref"))[0, 0]
    vdt = TYPE_TRAITS[wtype].vec_dot_type
    qk = TYPE_TRAITS[vdt].blck_size
    yq, yd = np.zeros((N, K), np.int8), np.zeros((N, K // qk), np.float32)
    ys, yb = np.zeros((N, K // qk), np.float32), np.zeros((N, K // 16), np.int32)
    quantize_src1.quantize_rows(int(vdt), x, yq, yd, ys, yb, quantize_src1.ROUND_REF)
    scales, values = _scales_and_values(wtype, raw)
    per, y_per = GENERIC[wtype]
    want = np.zeros((N, M), np.float32)
    for n in range(N):
        sums = (values * yq[n]).reshape(M, -1, per).sum(axis=-1).astype(np.float32)  # exact, per scale
        for b in range(K // TYPE_TRAITS[wtype].blck_size):
            if wtype in (T.TQ1_0, T.TQ2_0):
                want[n] += sums[:, b] * (scales[:, b] * yd[n, b])
            elif wtype == T.NVFP4:
                for s in range(4):
                    want[n] += (yd[n, 2 * b + s // 2] * scales[:, 4 * b + s]) * sums[:, 4 * b + s]
            else:
                inner = np.zeros(M, np.float32)
                for k in range(y_per):
                    inner += yd[n, y_per * b + k] * sums[:, y_per * b + k]
                want[n] += scales[:, b] * inner
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("wtype", list(GENERIC), ids=lambda t: t.name)
def test_a_gguf_file_of_the_type_loads(wtype: GGMLType, tmp_path: Path, rng: np.random.Generator) -> None:
    """A GGUF file holding a tensor of the type: read as float32, and loaded to the CPU with its bytes, where a
    MUL_MAT by it is supported."""
    from pyggml.backends.cpu import cpu_init
    from pyggml.core.context import Context
    from pyggml.ggml_backend.tensor_io import tensor_get
    from pyggml.gguf.loader import load_tensors
    from pyggml.gguf.reader import read_gguf
    from pyggml.gguf.writer import RawTensor, write_gguf

    K, M = 512, 3
    raw = quants.from_float(wtype, rng.standard_normal((M, K)).astype(np.float32))
    path = tmp_path / "w.gguf"
    if wtype == T.Q2_0:
        # the gguf package's writer has no Q2_0: write the same bytes as Q4_0 (18-byte blocks of 32), then
        # give the tensor info Q2_0's type and element count
        write_gguf(path, "llama", {}, {"w": RawTensor(raw, T.Q4_0, (K // 2, M))})
        info = struct.pack("<Q", 1) + b"w" + struct.pack("<IQQI", 2, K // 2, M, int(T.Q4_0))
        data = path.read_bytes()
        assert data.count(info) == 1
        path.write_bytes(data.replace(info, struct.pack("<Q", 1) + b"w" + struct.pack("<IQQI", 2, K, M, int(wtype))))
    else:
        write_gguf(path, "llama", {}, {"w": RawTensor(raw, wtype, (K, M))})
    gf = read_gguf(path)
    cpu = cpu_init(n_threads=1)
    try:
        assert gf.tensor("w").type == wtype and gf.tensor("w").nbytes == raw.nbytes
        np.testing.assert_array_equal(gf.tensor_float("w").reshape(M, K), quants.to_float(wtype, raw))
        loaded = load_tensors(gf, ["w"], {"w": cpu}, progress=False)
        ctx = Context(mem_size=1 << 20, no_alloc=True)
        try:
            w = loaded.tensors["w"]
            got = np.zeros(raw.size, np.uint8)
            tensor_get(w, got)
            np.testing.assert_array_equal(got, raw.reshape(-1))
            assert cpu.supports_op(ctx.mul_mat(w, ctx.new_tensor(T.F32, [K, 1])))
        finally:
            ctx.free()
            loaded.free()
    finally:
        cpu.free()
        gf.close()


@pytest.mark.parametrize("fused", [False, True], ids=["separate", "fused"])
def test_q2_0_x86_rows_are_the_generic_loop_as_gcc_compiles_it(fused: bool, rng: np.random.Generator) -> None:
    """x86 has no Q2_0 vec_dot: ggml's generic loop serves, with its two multiply-adds (d_y * sum into the block's
    sum, d_x * that into the row's) fused where gcc contracts them (numerics.FMA_CHAINS: not on Zen), else a
    multiply and an add; each against the loop written with libm's fmaf or numpy's float32 steps."""
    from kernel_helpers import libm_f32

    fmaf = libm_f32("fmaf", 3)

    def mad(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
        return np.float32(fmaf(a, b, c)) if fused else np.float32(c + a * b)

    M, K, N = 8, 1024, 3
    raw = quants.from_float(T.Q2_0, rng.standard_normal((M, K)).astype(np.float32))
    x = rng.standard_normal((N, K)).astype(np.float32)
    yq, yd = np.zeros((N, K), np.int8), np.zeros((N, K // 32), np.float32)
    ys, yb = np.zeros((N, K // 32), np.float32), np.zeros((N, K // 16), np.int32)
    quantize_src1.quantize_rows(int(T.Q8_0), x, yq, yd, ys, yb, quantize_src1.ROUND_REF)
    got = np.zeros((N, M), np.float32)
    dot = low_bit.dot_q2_0_fused if fused else low_bit.dot_q2_0
    rows_of(dot)(raw.reshape(-1), raw.shape[1], K // 64, yq, yd, yb, got)
    scales, values = _scales_and_values(T.Q2_0, raw)
    sums = (values[None] * yq[:, None]).reshape(N, M, -1, 32).sum(axis=-1).astype(np.float32)  # exact
    want = np.zeros((N, M), np.float32)
    for n, m in np.ndindex(N, M):
        for b in range(K // 64):
            inner = mad(yd[n, 2 * b], sums[n, m, 2 * b], np.float32(0.0))
            inner = mad(yd[n, 2 * b + 1], sums[n, m, 2 * b + 1], inner)
            want[n, m] = mad(scales[m, b], inner, want[n, m])
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    other = np.zeros((N, M), np.float32)
    rows_of(low_bit.dot_q2_0 if fused else low_bit.dot_q2_0_fused)(raw.reshape(-1), raw.shape[1], K // 64, yq, yd,
                                                                  yb, other)
    assert np.count_nonzero(other != got) > 0  # the setting changes the bits
