"""CPU kernels of the copy/layout ops against numpy references written here from ggml's definitions."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import (
    BF16,
    F16,
    F32,
    bf16_bits,
    build,
    compile_node,
    new_ctx,
    permuted,
    run,
    stored,
    tensor,
    transposed,
    values_of,
)

from pyggml.backends.cpu.kernels import ComputeParams, layout
from pyggml.core import quants
from pyggml.core.errors import GGMLError, OutOfBoundsError, UnsupportedTypeError
from pyggml.core.quants import FROM_FLOAT_TYPES, IMPLEMENTED_TYPES
from pyggml.core.tensor import GGMLOp, ScaleFlag, ScaleMode
from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.testing.random_blocks import random_blocks

TYPES = [F32, F16]
CONVERTIBLE = [F32, F16, BF16]
# the quantized types pyggml converts (the others are refused with an error naming the type), and those it writes
# too (not the lattice IQ types: ggml's CPU has no from_float for them; their blocks here are random bytes)
QUANTIZED = [t for t in GGMLType if TYPE_TRAITS[t].is_quantized and t in IMPLEMENTED_TYPES]
WRITTEN = [t for t in QUANTIZED if t in FROM_FLOAT_TYPES]


def row_major(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """ggml's dup order: elements in row-major order of the source, laid out row-major in `shape`."""
    return np.asarray(values).reshape(-1).reshape(shape)


# --- DUP / CONT / CPY between F32, F16, BF16 ---


@pytest.mark.parametrize("type", TYPES + [BF16])
@pytest.mark.parametrize("layout_", ["contiguous", "transposed", "permuted"])
def test_dup_and_cont(type: GGMLType, layout_: str, rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    ctx = new_ctx()
    make = {"contiguous": tensor, "transposed": transposed, "permuted": permuted}[layout_]
    t = make(ctx, type, x)
    for node in (ctx.dup(t), ctx.cont(t)):
        got = run(node)
        assert node.is_contiguous()
        np.testing.assert_array_equal(got, stored(type, x))


@pytest.mark.parametrize("src_type", CONVERTIBLE)
@pytest.mark.parametrize("dst_type", CONVERTIBLE)
@pytest.mark.parametrize("layout_", ["contiguous", "transposed"])
def test_cpy_converts_in_row_major_order(src_type: GGMLType, dst_type: GGMLType, layout_: str,
                                         rng: np.random.Generator) -> None:
    x = rng.standard_normal((3, 4, 6)).astype(np.float32)
    ctx = new_ctx()
    src = tensor(ctx, src_type, x) if layout_ == "contiguous" else transposed(ctx, src_type, x)
    dst = tensor(ctx, dst_type, np.zeros((8, 9), np.float32))  # same count, other shape
    node = ctx.cpy(src, dst)
    got = run(node)
    want = stored(dst_type, row_major(stored(src_type, x), (1, 1, 8, 9)))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(values_of(dst), want)  # the result is a view of dst


def test_cpy_into_non_contiguous_dst(rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 6)).astype(np.float32)
    ctx = new_ctx()
    base = tensor(ctx, F16, np.zeros((6, 4), np.float32))
    dst = ctx.transpose(base)  # ne [6, 4]... numpy (4, 6), strided
    node = ctx.cpy(tensor(ctx, F32, x), dst)
    run(node)
    np.testing.assert_array_equal(values_of(base)[0, 0].T, stored(F16, x))


@pytest.mark.parametrize("type", TYPES)
def test_cont_4d_reshapes(type: GGMLType, rng: np.random.Generator) -> None:
    x = rng.standard_normal((3, 8)).astype(np.float32)
    ctx = new_ctx()
    node = ctx.cont_4d(transposed(ctx, type, x), 2, 2, 3, 2)
    np.testing.assert_array_equal(run(node), row_major(stored(type, x), (2, 3, 2, 2)))


def test_bf16_rounds_to_nearest_even() -> None:
    ctx = new_ctx()
    # 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0)
    x = np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -2.5, 65504.0, 1e-30], np.float32)
    node = ctx.cpy(tensor(ctx, F32, x), ctx.new_tensor_1d(BF16, 5))
    run(node)
    np.testing.assert_array_equal(node.numpy()[0, 0, 0], bf16_bits(x))
    assert node.numpy()[0, 0, 0, 0] == 0x3F80


# --- CPY with quantized types ---


@pytest.mark.parametrize("qtype", QUANTIZED)
def test_cpy_f32_to_quantized_and_back(qtype: GGMLType, rng: np.random.Generator) -> None:
    bs = TYPE_TRAITS[qtype].blck_size
    x = rng.standard_normal((2, 2 * bs)).astype(np.float32)
    ctx = new_ctx()
    simd = ComputeParams().numerics == "x86"  # the CPU backend converts as ggml-cpu does on this host
    q = ctx.new_tensor_2d(qtype, 2 * bs, 2)
    if qtype in WRITTEN:
        want_bytes = quants.from_float_cpu(qtype, x, simd)
        # the source is transposed: the kernel must gather it in row-major order first
        run(ctx.cpy(transposed(ctx, F32, x), q))
        np.testing.assert_array_equal(q.numpy()[0, 0], want_bytes)
    else:  # ggml's CPU does not write it: neither does pyggml's
        with pytest.raises(UnsupportedTypeError, match=rf"cannot convert F32 .* to {qtype.name}"):
            run(ctx.cpy(transposed(ctx, F32, x), q))
        want_bytes = random_blocks(qtype, x.shape, rng)
        q.numpy()[0, 0] = want_bytes
    want_back = quants.to_float(qtype, want_bytes)
    # quantized -> F32, F16, BF16
    for dt in CONVERTIBLE:
        out = ctx.new_tensor_2d(dt, bs, 4)  # other shape, same count
        run(ctx.cpy(q, out))
        np.testing.assert_array_equal(values_of(out), stored(dt, row_major(want_back, (1, 1, 4, bs))))
    # quantized -> same type copies the blocks; -> another type converts through f32
    same = ctx.new_tensor_2d(qtype, 2 * bs, 2)
    run(ctx.cpy(q, same))
    np.testing.assert_array_equal(same.numpy(), q.numpy())
    other = GGMLType.Q8_0 if qtype != GGMLType.Q8_0 else GGMLType.Q4_0
    if bs % TYPE_TRAITS[other].blck_size == 0:
        o = ctx.new_tensor_2d(other, 2 * bs, 2)
        run(ctx.cpy(q, o))
        np.testing.assert_array_equal(o.numpy()[0, 0], quants.from_float_cpu(other, want_back, simd))


# --- GET_ROWS ---


@pytest.mark.parametrize("type", TYPES + [BF16, GGMLType.I32])
def test_get_rows_plain_types(type: GGMLType, rng: np.random.Generator) -> None:
    x = rng.standard_normal((10, 6)).astype(np.float32)
    if type == GGMLType.I32:
        x = rng.integers(-100, 100, (10, 6)).astype(np.int32)
    ids = np.array([3, 0, 9, 3], np.int32)
    ctx = new_ctx()
    node = ctx.get_rows(tensor(ctx, type, x), tensor(ctx, GGMLType.I32, ids))
    want = stored(type, x)[ids] if type != GGMLType.I32 else x[ids]
    np.testing.assert_array_equal(run(node)[0, 0], want)


@pytest.mark.parametrize("type", TYPES)
def test_get_rows_batched(type: GGMLType, rng: np.random.Generator) -> None:
    # rows [ne0=5, ne1=7, ne2=3, ne3=2], indices [ne0=4, ne1=3, ne2=2]
    x = rng.standard_normal((2, 3, 7, 5)).astype(np.float32)
    ids = rng.integers(0, 7, (2, 3, 4)).astype(np.int32)
    ctx = new_ctx()
    node = ctx.get_rows(permuted(ctx, type, x), tensor(ctx, GGMLType.I32, ids))
    assert node.ne == [5, 4, 3, 2]
    xs = stored(type, x)
    want = np.zeros((2, 3, 4, 5), np.float32)
    for i12 in range(2):
        for i11 in range(3):
            for i10 in range(4):
                want[i12, i11, i10] = xs[i12, i11, ids[i12, i11, i10]]
    np.testing.assert_array_equal(run(node), want)


@pytest.mark.parametrize("qtype", QUANTIZED)
def test_get_rows_quantized(qtype: GGMLType, rng: np.random.Generator) -> None:
    bs = TYPE_TRAITS[qtype].blck_size
    x = rng.standard_normal((6, bs)).astype(np.float32)
    ctx = new_ctx()
    # the reference: all rows dequantized, then picked
    raw = quants.from_float(qtype, x) if qtype in WRITTEN else random_blocks(qtype, x.shape, rng)
    all_rows = quants.to_float(qtype, raw)
    a = ctx.new_tensor_2d(qtype, bs, 6)
    a.numpy()[0, 0] = raw
    ids = np.array([5, 1, 1, 0], np.int32)
    node = ctx.get_rows(a, tensor(ctx, GGMLType.I32, ids))
    np.testing.assert_array_equal(run(node)[0, 0], all_rows[ids])


def test_get_rows_index_out_of_range_raises(rng: np.random.Generator) -> None:
    ctx = new_ctx()
    a = tensor(ctx, F32, rng.standard_normal((4, 3)).astype(np.float32))
    for bad in (4, -1):
        node = ctx.get_rows(a, tensor(ctx, GGMLType.I32, np.array([0, bad], np.int32)))
        with pytest.raises(OutOfBoundsError):
            run(node)


# --- REPEAT, CONCAT, DIAG, PAD, UPSCALE, SET ---


@pytest.mark.parametrize("type", TYPES)
@pytest.mark.parametrize("shapes", [((1, 1, 1, 4), (2, 3, 4, 8)), ((1, 3, 2, 4), (2, 3, 4, 4)),
                                    ((2, 1, 3, 1), (2, 2, 6, 5))])
def test_repeat(type: GGMLType, shapes: tuple, rng: np.random.Generator) -> None:
    small, big = shapes
    x = rng.standard_normal(small).astype(np.float32)
    ctx = new_ctx()
    src = permuted(ctx, type, x)
    node = ctx.repeat(src, ctx.new_tensor(type, list(big[::-1])))
    reps = tuple(b // s for b, s in zip(big, small, strict=True))
    np.testing.assert_array_equal(run(node), np.tile(stored(type, x), reps))


@pytest.mark.parametrize("type", TYPES)
def test_concat(type: GGMLType, rng: np.random.Generator) -> None:
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = rng.standard_normal((2, 2, 4, 5)).astype(np.float32)
    ctx = new_ctx()
    node = ctx.concat(permuted(ctx, type, a), tensor(ctx, type, b), 2)
    want = np.zeros((2, 5, 4, 5), np.float32)
    for i3 in range(2):
        for i2 in range(5):
            want[i3, i2] = stored(type, a)[i3, i2] if i2 < 3 else stored(type, b)[i3, i2 - 3]
    np.testing.assert_array_equal(run(node), want)


@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_concat_along_each_dim(dim: int, rng: np.random.Generator) -> None:
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    shape_b = [2, 3, 4, 5]
    shape_b[3 - dim] = 1
    b = rng.standard_normal(shape_b).astype(np.float32)
    ctx = new_ctx()
    node = ctx.concat(tensor(ctx, F32, a), transposed(ctx, F32, b), dim)
    np.testing.assert_array_equal(run(node), np.concatenate([a, b], axis=3 - dim))


@pytest.mark.parametrize("qtype", [GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K])
@pytest.mark.parametrize("dim", [0, 1, 3])
def test_concat_quantized_joins_blocks(qtype: GGMLType, dim: int, rng: np.random.Generator) -> None:
    """As ggml's concat_any: rows of blocks copied as bytes, along dim 0 src1's blocks after src0's."""
    ctx = new_ctx()
    a = tensor(ctx, qtype, rng.standard_normal((2, 1, 3, 256)).astype(np.float32))
    shape_b = [2, 1, 3, 256]
    shape_b[3 - dim] = 512 if dim == 0 else 1
    b = tensor(ctx, qtype, rng.standard_normal(shape_b).astype(np.float32))
    node = ctx.concat(a, b, dim)
    assert layout.supports(node)
    run(node)
    np.testing.assert_array_equal(node.numpy(), np.concatenate([a.numpy(), b.numpy()], axis=3 - dim))


@pytest.mark.parametrize("type", TYPES)
def test_diag(type: GGMLType, rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, 3, 1, 4)).astype(np.float32)
    ctx = new_ctx()
    node = ctx.diag(tensor(ctx, type, x))
    want = np.zeros((2, 3, 4, 4), np.float32)
    for i3 in range(2):
        for i2 in range(3):
            for i in range(4):
                want[i3, i2, i, i] = stored(type, x)[i3, i2, 0, i]
    got = np.full((2, 3, 4, 4), 7.0, np.float32)
    node.numpy()[...] = got  # garbage in dst must be overwritten
    np.testing.assert_array_equal(run(node), want)


@pytest.mark.parametrize("type", TYPES)
def test_pad(type: GGMLType, rng: np.random.Generator) -> None:
    x = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    ctx = new_ctx()
    node = ctx.pad(transposed(ctx, type, x), 2, 1, 0, 1)
    node.numpy()[...] = 5.0
    want = np.zeros((2, 2, 4, 6), np.float32)
    want[:1, :2, :3, :4] = stored(type, x)
    np.testing.assert_array_equal(run(node), want)


def test_pad_ext_and_circular(rng: np.random.Generator) -> None:
    x = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    ctx = new_ctx()
    node = ctx.pad_ext(transposed(ctx, F32, x), 1, 2, 0, 1, 3, 0, 0, 1)  # lp/rp of dims 0..3
    node.numpy()[...] = 5.0
    want = np.zeros((2, 5, 4, 7), np.float32)
    want[:1, 3:5, 0:3, 1:5] = x
    np.testing.assert_array_equal(run(node), want)
    wrap = ctx.pad_ext_circular(tensor(ctx, F32, x), 1, 2, 0, 1, 0, 0, 0, 0)
    idx = np.ix_([0], [0, 1], [0, 1, 2, 0], [3, 0, 1, 2, 3, 0, 1])  # (i - lp) % n
    np.testing.assert_array_equal(run(wrap), x[idx])


def test_upscale(rng: np.random.Generator) -> None:
    type = F32  # ggml's interpolate takes F32 only
    x = rng.standard_normal((2, 2, 3, 4)).astype(np.float32)
    ctx = new_ctx()
    node = ctx.upscale(permuted(ctx, type, x), 3)
    want = np.zeros((2, 2, 9, 12), np.float32)
    for i1 in range(9):
        for i0 in range(12):
            want[:, :, i1, i0] = stored(type, x)[:, :, i1 // 3, i0 // 3]
    np.testing.assert_array_equal(run(node), want)


def antialias_ref(x: np.ndarray, n1: int, n0: int) -> np.ndarray:
    """ggml's BILINEAR | ANTIALIAS over dims 0 and 1, its loops as written (2-D weights, their sum divided
    out), in float64."""
    s1, s0 = x.shape[-2:]
    sf1, sf0 = n1 / s1, n0 / s0
    sup1, sup0 = max(1.0, 1.0 / sf1), max(1.0, 1.0 / sf0)
    out = np.zeros(x.shape[:-2] + (n1, n0))
    for i1 in range(n1):
        y = (i1 + 0.5) / sf1
        for i0 in range(n0):
            c = (i0 + 0.5) / sf0
            val, total = np.zeros(x.shape[:-2]), 0.0
            for sy in range(max(int(y - sup1 + 0.5), 0), min(int(y + sup1 + 0.5), s1)):
                wy = max(1.0 - abs((sy - y + 0.5) / sup1), 0.0)
                for sx in range(max(int(c - sup0 + 0.5), 0), min(int(c + sup0 + 0.5), s0)):
                    w = max(1.0 - abs((sx - c + 0.5) / sup0), 0.0) * wy
                    if w > 0:
                        val += x[..., sy, sx] * w
                        total += w
            out[..., i1, i0] = val / total if total > 0 else val
    return out


@pytest.mark.parametrize("shape", [(3, 4), (5, 17), (9, 12)])
def test_upscale_bilinear_antialias(shape: tuple[int, int], rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, 3, 7, 11)).astype(np.float32)
    ctx = new_ctx()
    mode = int(ScaleMode.BILINEAR) | int(ScaleFlag.ANTIALIAS)
    node = ctx.interpolate(transposed(ctx, F32, x), shape[1], shape[0], 3, 2, mode)
    assert layout.supports(node)
    np.testing.assert_allclose(run(node), antialias_ref(x, *shape), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("type", TYPES)
def test_set(type: GGMLType, rng: np.random.Generator) -> None:
    a = rng.standard_normal((3, 4, 6)).astype(np.float32)
    b = rng.standard_normal((2, 2, 3)).astype(np.float32)
    es = 4 if type == F32 else 2
    nb1, nb2, nb3 = 6 * es, 24 * es, 72 * es
    offset = (1 * 24 + 2 * 6 + 1) * es  # [i2=1, i1=2, i0=1]
    ctx = new_ctx()
    ta, tb = tensor(ctx, type, a), transposed(ctx, type, b)
    node = build(ctx, "set", ta, tb, nb1, nb2, nb3, offset, op=GGMLOp.SET, params=[nb1, nb2, nb3, offset, 0])
    want = stored(type, a).copy()
    want[1:3, 2:4, 1:4] = stored(type, b)
    np.testing.assert_array_equal(run(node)[0], want)
    np.testing.assert_array_equal(values_of(ta)[0], stored(type, a))


def test_set_inplace_writes_src0(rng: np.random.Generator) -> None:
    a = np.zeros((4, 4), np.float32)
    b = np.ones((2, 2), np.float32)
    ctx = new_ctx()
    ta = tensor(ctx, F32, a)
    node = ctx.view_tensor(ta)
    node.op, node.src[0], node.src[1] = GGMLOp.SET, ta, tensor(ctx, F32, b)
    node.set_op_params([16, 64, 64, 4 * 5, 1])
    run(node)
    want = a.copy()
    want[1:3, 1:3] = 1.0
    np.testing.assert_array_equal(ta.numpy()[0, 0], want)


def test_supports() -> None:
    ctx = new_ctx()
    q = ctx.new_tensor_2d(GGMLType.Q4_0, 32, 4)
    f = ctx.new_tensor_2d(F32, 32, 4)
    i = tensor(ctx, GGMLType.I32, np.array([0, 1], np.int32))
    assert layout.supports(ctx.get_rows(q, i))
    assert layout.supports(ctx.cpy(f, q)) and layout.supports(ctx.cpy(q, ctx.new_tensor_2d(BF16, 32, 4)))
    assert not layout.supports(ctx.repeat(q, q))
    assert layout.supports(ctx.cpy(ctx.new_tensor_1d(GGMLType.I32, 128), f))  # ggml's dup: I32 to F32 only
    bad = ctx.cpy(ctx.new_tensor_1d(GGMLType.I32, 128), ctx.new_tensor_2d(GGMLType.F16, 32, 4))
    assert not layout.supports(bad)
    with pytest.raises(GGMLError, match="CPY"):
        compile_node(bad)


@pytest.mark.parametrize("qtype", [GGMLType.Q4_0, GGMLType.Q6_K])
def test_quantized_non_contiguous_source_and_batched_get_rows(qtype: GGMLType, rng: np.random.Generator) -> None:
    bs = TYPE_TRAITS[qtype].blck_size
    x = rng.standard_normal((2, 3, 4, bs)).astype(np.float32)  # rows [bs, 4, 3, 2]
    ctx = new_ctx()
    base = ctx.new_tensor_4d(qtype, bs, 3, 4, 2)  # holds x with dims 1 and 2 swapped
    base.numpy()[...] = quants.from_float(qtype, np.swapaxes(x, 1, 2))
    rows = ctx.permute(base, 0, 2, 1, 3)  # logical [bs, 4, 3, 2], strided rows
    assert rows.ne == [bs, 4, 3, 2] and not rows.is_contiguous()
    deq = quants.to_float(qtype, quants.from_float(qtype, x))  # the values each row holds
    out = ctx.new_tensor_2d(F32, bs * 4, 6)
    run(ctx.cpy(rows, out))
    np.testing.assert_array_equal(values_of(out), row_major(deq, (1, 1, 6, bs * 4)))
    ids = rng.integers(0, 4, (2, 3, 5)).astype(np.int32)
    node = ctx.get_rows(rows, tensor(ctx, GGMLType.I32, ids))
    want = np.zeros((2, 3, 5, bs), np.float32)
    for i12 in range(2):
        for i11 in range(3):
            for i10 in range(5):
                want[i12, i11, i10] = deq[i12, i11, ids[i12, i11, i10]]
    np.testing.assert_array_equal(run(node), want)
