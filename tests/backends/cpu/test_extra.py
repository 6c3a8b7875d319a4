"""ROPE_BACK, SAM's WIN_PART, WIN_UNPART, GET_REL_POS, ADD_REL_POS and DeepSeek-V4's LIGHTNING_INDEXER,
DSV4_HC_COMB, DSV4_HC_PRE, DSV4_HC_POST (pyggml.core.ops.extra): builders' shapes,
op_params and errors; CPU kernels against numpy float64 formulas written here (and ggml's loops, literally, where
the order of f32 additions matters); the in-place list of today's ggml-alloc.c computing through the graph
allocator; and every op checker case against real ggml (skipped only without a C compiler)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import bf16_bits, compile_node, new_ctx, run, stored, tensor

from pyggml.alloc import GraphAllocator, TensorAllocator, op_can_inplace
from pyggml.backends.cpu import cpu_init, kernel_supports
from pyggml.capi import core as capi
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError, GGMLError, ShapeError, UnsupportedTypeError
from pyggml.core.tensor import GGML_ROPE_TYPE_NEOX, GGML_ROPE_TYPE_NORMAL, GGMLOp
from pyggml.core.types import GGMLType, to_float
from pyggml.ggml_backend import Backend, tensor_get_numpy, tensor_set_numpy
from pyggml.testing import op_check
from pyggml.testing.cases_extra import extra_cases

F32, F16, BF16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32
NORMAL, NEOX = GGML_ROPE_TYPE_NORMAL, GGML_ROPE_TYPE_NEOX
rng = np.random.default_rng(5)


def rand(*shape: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(np.float32)


def rope_args(n_dims: int, mode: int) -> tuple[object, ...]:
    return (n_dims, mode, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)


# --- builders ---


def test_rope_back_builders_are_rope_nodes_with_rope_back_op() -> None:
    ctx = new_ctx()
    a = ctx.new_tensor_4d(F32, 16, 3, 5, 1)
    pos, pos4 = ctx.new_tensor_1d(I32, 5), ctx.new_tensor_1d(I32, 20)
    args = (16, NEOX, 1024, 20000.0, 0.5, 1.0, 1.0, 32.0, 1.0)
    back = ctx.rope_ext_back(a, pos, None, *args)
    fwd = ctx.rope_ext(a, pos, None, *args)
    assert back.op == GGMLOp.ROPE_BACK and fwd.op == GGMLOp.ROPE
    assert (back.ne, back.type, back.src[:3]) == (a.ne, F32, [a, pos, None]) and back.view_src is None
    assert list(back.op_params) == list(fwd.op_params)
    multi = ctx.rope_multi_back(a, pos4, None, 16, [3, 3, 2, 0], 8, 0, 1e4, 1.0, 0.0, 1.0, 32.0, 1.0)
    assert multi.op == GGMLOp.ROPE_BACK and [multi.get_op_params_i32(i) for i in range(11, 15)] == [3, 3, 2, 0]
    assert capi.ggml_rope_ext_back(ctx, a, pos, None, *args).op == GGMLOp.ROPE_BACK
    assert capi.ggml_rope_set_offset(ctx.rope_ext_back(a, pos, None, *rope_args(8, NEOX)), 4) \
        .get_op_params_i32(15) == 4


def test_sam_builders_shapes_and_params() -> None:
    ctx = new_ctx()
    img = ctx.new_tensor_3d(F32, 8, 10, 7)
    p = ctx.win_part(img, 4)  # 3 windows across (10 -> 12), 2 down (7 -> 8)
    assert (p.op, p.type, p.ne) == (GGMLOp.WIN_PART, F32, [8, 4, 4, 6])
    assert [p.get_op_params_i32(i) for i in range(3)] == [3, 2, 4]
    u = ctx.win_unpart(p, 10, 7, 4)
    assert (u.op, u.ne, u.get_op_params_i32(0)) == (GGMLOp.WIN_UNPART, [8, 10, 7, 1], 4)
    r = ctx.get_rel_pos(ctx.new_tensor_2d(BF16, 6, 9), 5, 5)
    assert (r.op, r.type, r.ne) == (GGMLOp.GET_REL_POS, F16, [6, 5, 5, 1])
    a = ctx.new_tensor_4d(F32, 9, 6, 4, 1)
    pw = ctx.new_tensor_4d(F32, 3, 2, 3, 4)
    add = ctx.add_rel_pos(a, pw, pw)
    assert (add.op, add.ne, add.view_src, add.get_op_params_i32(0)) == (GGMLOp.ADD_REL_POS, a.ne, None, 0)
    assert add.src[:3] == [a, pw, pw]
    inplace = ctx.add_rel_pos_inplace(a, pw, pw)
    assert inplace.view_src is a and inplace.get_op_params_i32(0) == 1


def test_builder_errors_name_the_op() -> None:
    ctx = new_ctx()
    a = ctx.new_tensor_4d(F32, 16, 3, 5, 1)
    pos = ctx.new_tensor_1d(I32, 5)
    with pytest.raises(ArgumentError, match="n_dims=18"):
        ctx.rope_ext_back(a, pos, None, *rope_args(18, NORMAL))
    with pytest.raises(ShapeError, match="b.ne"):
        ctx.rope_ext_back(a, ctx.new_tensor_1d(I32, 4), None, *rope_args(16, NORMAL))
    with pytest.raises(ShapeError, match=r"win_part: a.ne\[3\]=2"):
        ctx.win_part(ctx.new_tensor_4d(F32, 4, 4, 4, 2), 2)
    with pytest.raises(UnsupportedTypeError, match="win_part.*F16"):
        ctx.win_part(ctx.new_tensor_3d(F16, 4, 4, 4), 2)
    with pytest.raises(ArgumentError, match="win_part: window size w=0"):
        ctx.win_part(ctx.new_tensor_3d(F32, 4, 4, 4), 0)
    with pytest.raises(UnsupportedTypeError, match="win_unpart"):
        ctx.win_unpart(ctx.new_tensor_4d(F16, 4, 2, 2, 4), 4, 4, 2)
    with pytest.raises(ArgumentError, match="win_unpart: window size w=-1"):
        ctx.win_unpart(ctx.new_tensor_4d(F32, 4, 2, 2, 4), 4, 4, -1)
    rel = ctx.new_tensor_2d(F16, 4, 9)
    with pytest.raises(ArgumentError, match="get_rel_pos: qh=5 must equal kh=4"):
        ctx.get_rel_pos(rel, 5, 4)
    with pytest.raises(ShapeError, match=r"get_rel_pos: a.ne\[1\]=9"):
        ctx.get_rel_pos(rel, 4, 4)
    a = ctx.new_tensor_4d(F32, 9, 6, 4, 1)
    pw = ctx.new_tensor_4d(F32, 3, 2, 3, 4)
    with pytest.raises(ShapeError, match="add_rel_pos: pw and ph"):
        ctx.add_rel_pos(a, pw, ctx.new_tensor_4d(F32, 3, 3, 2, 4))
    with pytest.raises(ShapeError, match="add_rel_pos_inplace: a, pw and ph must be contiguous"):
        ctx.add_rel_pos_inplace(ctx.transpose(ctx.new_tensor_4d(F32, 6, 9, 4, 1)), pw, pw)
    with pytest.raises(UnsupportedTypeError, match="add_rel_pos.*F16"):
        ctx.add_rel_pos(a, pw, ctx.new_tensor_4d(F16, 3, 2, 3, 4))
    with pytest.raises(ShapeError, match=r"pw.ne\[3\]=4 must equal a.ne\[2\]=3"):
        ctx.add_rel_pos(ctx.new_tensor_4d(F32, 9, 6, 3, 1), pw, pw)
    with pytest.raises(ShapeError, match=r"pw.ne\[0\]\^2=9 must equal a.ne\[0\]=8"):
        ctx.add_rel_pos(ctx.new_tensor_4d(F32, 8, 6, 4, 1), pw, pw)
    with pytest.raises(ShapeError, match=r"pw.ne\[1\]\*pw.ne\[2\]=6 must equal a.ne\[1\]=5"):
        ctx.add_rel_pos(ctx.new_tensor_4d(F32, 9, 5, 4, 1), pw, pw)


# --- kernels against numpy ---


def rope_reference(x: np.ndarray, pos: np.ndarray, n_dims: int, mode: int, sign: float) -> np.ndarray:
    """Plain rope (freq_base 10000, no scaling) in float64: each pair turned by sign * pos * 10000^(-2k/n_dims)."""
    x = x.astype(np.float64)
    k = np.arange(n_dims // 2)
    theta = sign * pos.astype(np.float64)[:, None] * 10000.0 ** (-2.0 * k / n_dims)  # (tokens, pairs)
    c, s = np.cos(theta)[None, :, None, :], np.sin(theta)[None, :, None, :]
    i0, i1 = (2 * k, 2 * k + 1) if mode == NORMAL else (k, k + n_dims // 2)
    out = x.copy()
    out[..., i0] = x[..., i0] * c - x[..., i1] * s
    out[..., i1] = x[..., i0] * s + x[..., i1] * c
    return out


@pytest.mark.parametrize("type", [F32, F16])
@pytest.mark.parametrize(("mode", "n_dims"), [(NORMAL, 16), (NORMAL, 8), (NEOX, 16), (NEOX, 6)])
def test_rope_back_turns_by_minus_theta(type: GGMLType, mode: int, n_dims: int) -> None:
    ctx = new_ctx()
    xv, pv = rand(2, 5, 3, 16), rng.integers(0, 512, 5).astype(np.int32)
    node = ctx.rope_ext_back(tensor(ctx, type, xv), tensor(ctx, I32, pv), None, *rope_args(n_dims, mode))
    want = rope_reference(stored(type, xv), pv, n_dims, mode, -1.0)
    np.testing.assert_allclose(run(node), want, rtol=0, atol=2e-3 if type == F16 else 1e-4)


def test_rope_back_undoes_rope() -> None:
    """The rotation is orthogonal: rope_back(rope(x)) = x, for every mode's pairs and YaRN's scaled angles."""
    ctx = new_ctx()
    xv = rand(1, 4, 2, 32)
    pv = rng.integers(0, 512, 4).astype(np.int32)
    ff = tensor(ctx, F32, rand(8, lo=0.9, hi=1.1))
    x, pos = tensor(ctx, F32, xv), tensor(ctx, I32, pv)
    args = (16, NEOX, 0, 10000.0, 1.4245, 0.7465, 1.0, 1.0, 1.0)
    fwd = ctx.rope_ext(x, pos, ff, *args)
    run(fwd)
    back = ctx.rope_ext_back(fwd, pos, ff, *args)
    mscale = 1.0 + 0.1 * np.log(1.0 / 1.4245)  # YaRN's magnitude scaling, applied both ways
    want = xv.copy()
    want[..., :16] *= mscale**2
    np.testing.assert_allclose(run(back), want, atol=1e-5)
    capi.ggml_rope_set_offset(back, 8)  # an offset window: the first 8 elements and the tail copied
    got = run(back)
    np.testing.assert_array_equal(got[..., :8], run(fwd)[..., :8])


def test_rope_back_is_computed_in_place_by_the_graph_allocator() -> None:
    """ROPE_BACK is in today's ggml_op_can_inplace: on a graph allocator it overwrites its source."""
    assert op_can_inplace(GGMLOp.ROPE_BACK) and op_can_inplace(GGMLOp.SOFT_MAX_BACK)
    assert not op_can_inplace(GGMLOp.ADD_REL_POS)
    backend = cpu_init(n_threads=1)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    x = ctx.new_tensor_3d(F32, 16, 3, 4).set_name("x")
    pos = ctx.new_tensor_1d(I32, 4).set_name("pos")
    dy = ctx.scale(x, 2.0)
    back = ctx.rope_ext_back(dy, pos, None, *rope_args(16, NORMAL))
    out = ctx.scale(back, 1.0)
    gf = ctx.new_graph()
    gf.build_forward_expand(out)
    talloc = TensorAllocator.new_from_backend(backend, 1 << 16)
    xv, pv = rand(4, 3, 16), rng.integers(0, 512, 4).astype(np.int32)
    try:
        for t, v in ((x, xv), (pos, pv)):
            talloc.alloc(t)
            tensor_set_numpy(t, v)
        GraphAllocator().alloc_graph(talloc, gf)
        assert back.data == dy.data  # in place
        backend.graph_compute(gf)
        want = rope_reference(2 * xv[None], pv, 16, NORMAL, -1.0)
        np.testing.assert_allclose(tensor_get_numpy(out).reshape(want.shape), want, atol=1e-4)
    finally:
        talloc.buffer.free()
        backend.free()


@pytest.mark.parametrize(("ne", "w"), [((5, 10, 7), 4), ((3, 1, 1), 2), ((2, 6, 6), 3), ((4, 5, 9), 14)])
def test_win_part_and_unpart(ne: tuple[int, int, int], w: int) -> None:
    c, width, height = ne
    ctx = new_ctx()
    xv = rand(height, width, c)
    parts = ctx.win_part(tensor(ctx, F32, xv), w)
    got = run(parts)
    npx, npy = -(-width // w), -(-height // w)
    want = np.zeros((npx * npy, w, w, c))
    for py, px, i2, i1 in np.ndindex(npy, npx, w, w):  # window py*npx + px; 0 where it passes the image
        if py * w + i2 < height and px * w + i1 < width:
            want[py * npx + px, i2, i1] = xv[py * w + i2, px * w + i1]
    np.testing.assert_array_equal(got, want)
    back = ctx.win_unpart(parts, width, height, w)
    np.testing.assert_array_equal(run(back)[0], xv)


def test_win_unpart_of_given_windows() -> None:
    ctx = new_ctx()
    wv = rand(6, 3, 3, 2)  # 3x2 windows of 3: a 7 wide, 5 high image (the padding dropped)
    got = run(ctx.win_unpart(tensor(ctx, F32, wv), 7, 5, 3))
    want = np.empty((5, 7, 2))
    for y, x in np.ndindex(5, 7):
        want[y, x] = wv[(y // 3) * 3 + x // 3, y % 3, x % 3]
    np.testing.assert_array_equal(got[0], want)


@pytest.mark.parametrize("type", [F16, BF16])
def test_get_rel_pos_copies_the_16_bit_words(type: GGMLType) -> None:
    ctx = new_ctx()
    h, c = 5, 6
    xv = rand(2 * h - 1, c)
    node = ctx.get_rel_pos(tensor(ctx, type, xv), h, h)
    run(node)
    bits = xv.astype(np.float16).view(np.uint16) if type == F16 else bf16_bits(xv)
    want = np.empty((h, h, c), np.uint16)
    for q, k in np.ndindex(h, h):  # query q, key k: the row of relative position q - k, shifted by h - 1
        want[q, k] = bits[q - k + h - 1]
    np.testing.assert_array_equal(node.numpy()[0].view(np.uint16), want)


def add_rel_pos_loops(a: np.ndarray, pw: np.ndarray, ph: np.ndarray) -> np.ndarray:
    """ggml-cpu's loops, literally, in float32 (the order of the two additions to each element matters)."""
    dst = a.astype(np.float32).reshape(-1).copy()
    p1, p2 = pw.astype(np.float32).reshape(-1), ph.astype(np.float32).reshape(-1)
    ne13, ne12, ne11, ne10 = pw.shape
    for i13, i12, i11, i10 in np.ndindex(ne13, ne12, ne11, ne10):
        jp0 = ((i13 * ne12 + i12) * ne11 + i11) * ne10 + i10
        jdh = jp0 * ne10
        jdw = jdh - (ne10 - 1) * i10
        for j in range(ne10):
            dst[jdh + j] += p2[jp0]
            dst[jdw + j * ne10] += p1[jp0]
    return dst.reshape(a.shape)


@pytest.mark.parametrize(("k", "qw", "qh", "heads", "ne3"), [(4, 3, 5, 2, 1), (1, 1, 1, 1, 1), (3, 2, 2, 2, 2)])
@pytest.mark.parametrize("inplace", [False, True])
def test_add_rel_pos(k: int, qw: int, qh: int, heads: int, ne3: int, inplace: bool) -> None:
    ctx = new_ctx()
    av, pwv, phv = rand(ne3, heads, qw * qh, k * k, lo=-1e3, hi=1e3), rand(heads, qh, qw, k), rand(heads, qh, qw, k)
    a = tensor(ctx, F32, av)
    node = (ctx.add_rel_pos_inplace if inplace else ctx.add_rel_pos)(a, tensor(ctx, F32, pwv), tensor(ctx, F32, phv))
    got = run(node)
    np.testing.assert_array_equal(got, add_rel_pos_loops(av, pwv, phv))  # bit for bit
    # SAM's definition in float64: attn[q, kh, kw] + rel_h[q, kh] + rel_w[q, kw] over the first heads*qw*qh rows
    rows = heads * qw * qh
    want = av.astype(np.float64).reshape(-1).copy()
    cells = want[: rows * k * k].reshape(rows, k, k)
    cells += phv.reshape(rows, k, 1) + pwv.reshape(rows, 1, k)
    np.testing.assert_allclose(got.reshape(-1), want, rtol=1e-6, atol=1e-4)
    if not inplace:
        np.testing.assert_array_equal(a.numpy(), av)


def test_kernels_raise_on_bad_input_before_computing() -> None:
    ctx = new_ctx()
    rel = ctx.get_rel_pos(tensor(ctx, F32, rand(9, 4)), 5, 5)  # ggml-cpu aborts on an F32 source
    assert not kernel_supports(rel)
    with pytest.raises(UnsupportedTypeError, match="GET_REL_POS"):
        compile_node(rel)
    few = ctx.win_unpart(tensor(ctx, F32, rand(2, 3, 3, 2)), 7, 5, 3)  # 6 windows needed, 2 given
    with pytest.raises(ShapeError, match="WIN_UNPART.*2x2|WIN_UNPART.*3x2"):
        compile_node(few)
    nc = ctx.win_part(ctx.transpose(tensor(ctx, F32, rand(5, 4))), 2)
    assert not kernel_supports(nc)
    with pytest.raises(ShapeError, match="WIN_PART.*contiguous"):
        compile_node(nc)
    back = ctx.rope_ext_back(tensor(ctx, F32, rand(1, 2, 1, 8)), tensor(ctx, I32, np.zeros(2, np.int32)), None,
                             *rope_args(8, NORMAL))
    back.set_op_params_i32(1, 10)  # n_dims past the row, as a hand-made node could have it
    assert not kernel_supports(back)
    with pytest.raises(GGMLError, match="CPU ROPE_BACK.*n_dims=10"):
        compile_node(back)
    assert all(kernel_supports(c.build(new_ctx())) for c in extra_cases())


# --- DeepSeek-V4 ---


def test_dsv4_builders_shapes_and_params() -> None:
    ctx = new_ctx()
    li = ctx.lightning_indexer(ctx.new_tensor_4d(F32, 32, 3, 5, 2), ctx.new_tensor_4d(GGMLType.Q8_0, 32, 1, 7, 2),
                               ctx.new_tensor_4d(F32, 3, 5, 1, 2), ctx.new_tensor_4d(F16, 7, 5, 1, 1))
    assert (li.op, li.type, li.ne, len([x for x in li.src if x is not None])) == (GGMLOp.LIGHTNING_INDEXER, F32,
                                                                                    [7, 5, 1, 2], 4)
    comb = ctx.dsv4_hc_comb(ctx.new_tensor_2d(F32, 24, 5), ctx.new_tensor_1d(F32, 3), ctx.new_tensor_1d(F32, 24),
                            1e-6, 20)
    assert (comb.op, comb.ne) == (GGMLOp.DSV4_HC_COMB, [4, 4, 5, 1])
    assert comb.get_op_params_f32(0) == pytest.approx(1e-6) and comb.get_op_params_i32(1) == 20
    x = ctx.new_tensor_3d(F32, 6, 3, 5)
    pre = ctx.dsv4_hc_pre(x, ctx.new_tensor_2d(F32, 3, 5))
    assert (pre.op, pre.ne, pre.get_op_params_f32(0), pre.get_op_params_i32(1)) == (GGMLOp.DSV4_HC_PRE, [6, 5, 1, 1],
                                                                                     1.0, 0)
    gated = ctx.dsv4_hc_pre_gated(x, x, 0.25)
    assert (gated.get_op_params_f32(0), gated.get_op_params_i32(1)) == (0.25, 1)
    post = ctx.dsv4_hc_post(ctx.new_tensor_2d(F32, 6, 5), x, ctx.new_tensor_2d(F32, 3, 5), None)
    assert (post.op, post.ne, post.src[3]) == (GGMLOp.DSV4_HC_POST, [6, 3, 5, 1], None)
    assert capi.ggml_dsv4_hc_pre_gated(ctx, x, x, 0.5).get_op_params_f32(0) == 0.5


def test_dsv4_builder_errors_name_the_op() -> None:
    ctx = new_ctx()
    q, k = ctx.new_tensor_4d(F32, 16, 3, 5, 2), ctx.new_tensor_4d(F16, 16, 1, 7, 2)
    w, m = ctx.new_tensor_4d(F32, 3, 5, 1, 2), ctx.new_tensor_4d(F16, 7, 5, 1, 1)
    with pytest.raises(UnsupportedTypeError, match="lightning_indexer: mask"):
        ctx.lightning_indexer(q, k, w, ctx.new_tensor_4d(F32, 7, 5, 1, 1))
    with pytest.raises(ShapeError, match=r"lightning_indexer: q.ne\[0\]=16 must equal k.ne\[0\]=8"):
        ctx.lightning_indexer(q, ctx.new_tensor_4d(F16, 8, 1, 7, 2), w, m)
    with pytest.raises(ShapeError, match=r"weights.ne\[3\]=2 must be a multiple of mask.ne\[3\]=3"):
        ctx.lightning_indexer(q, k, w, ctx.new_tensor_4d(F16, 7, 5, 1, 3))
    mixes, scale, base = ctx.new_tensor_2d(F32, 24, 5), ctx.new_tensor_1d(F32, 3), ctx.new_tensor_1d(F32, 24)
    with pytest.raises(ArgumentError, match="dsv4_hc_comb: n_iter=0"):
        ctx.dsv4_hc_comb(mixes, scale, base, 1e-6, 0)
    with pytest.raises(ShapeError, match=r"dsv4_hc_comb: mixes.ne\[0\]=15 must be \(2 \+ hc\)\*hc with hc = 4"):
        ctx.dsv4_hc_comb(ctx.new_tensor_2d(F32, 15, 5), scale, ctx.new_tensor_1d(F32, 15), 1e-6, 1)
    with pytest.raises(ShapeError, match="dsv4_hc_comb: scale"):
        ctx.dsv4_hc_comb(mixes, ctx.new_tensor_1d(F32, 2), base, 1e-6, 1)
    x = ctx.new_tensor_3d(F32, 6, 3, 5)
    with pytest.raises(ShapeError, match="dsv4_hc_pre: weights must have ne"):
        ctx.dsv4_hc_pre(x, ctx.new_tensor_2d(F32, 5, 3))
    with pytest.raises(ShapeError, match="dsv4_hc_pre_gated: the gate"):
        ctx.dsv4_hc_pre_gated(x, ctx.new_tensor_2d(F32, 3, 5), 1.0)
    with pytest.raises(UnsupportedTypeError, match="dsv4_hc_pre.*F16"):
        ctx.dsv4_hc_pre(ctx.new_tensor_3d(F16, 6, 3, 5), ctx.new_tensor_2d(F32, 3, 5))
    with pytest.raises(ShapeError, match="dsv4_hc_post: comb"):
        ctx.dsv4_hc_post(ctx.new_tensor_2d(F32, 6, 5), x, ctx.new_tensor_2d(F32, 3, 5), ctx.new_tensor_3d(F32, 3, 3, 4))
    with pytest.raises(ShapeError, match="dsv4_hc_post: post"):
        ctx.dsv4_hc_post(ctx.new_tensor_2d(F32, 6, 5), x, ctx.new_tensor_2d(F32, 4, 5), None)


@pytest.mark.parametrize("type_k", [F32, F16, GGMLType.Q8_0])
def test_lightning_indexer(type_k: GGMLType) -> None:
    ctx = new_ctx()
    n_s, n_t, n_h, d, n_kv = 2, 3, 4, 32, 5
    qv, kv, wv = rand(n_s, n_t, n_h, d), rand(n_s, n_kv, 1, d), rand(n_s, 1, n_t, n_h)
    mv = rand(1, 1, n_t, n_kv)
    mv[0, 0, 1, 2] = -np.inf
    k = tensor(ctx, type_k, kv)
    node = ctx.lightning_indexer(tensor(ctx, F32, qv), k, tensor(ctx, F32, wv), tensor(ctx, F16, mv))
    got = run(node)
    kf = kv if type_k == F32 else to_float(type_k, k.numpy())  # K as stored
    want = np.zeros((n_s, 1, n_t, n_kv))
    for s, t, j in np.ndindex(n_s, n_t, n_kv):
        heads = np.maximum(qv[s, t].astype(np.float64) @ kf[s, j, 0].astype(np.float64), 0.0)
        want[s, 0, t, j] = heads @ wv[s, 0, t] + np.float16(mv[0, 0, t, j])
    assert np.isneginf(got[0, 0, 1, 2]) and np.isneginf(got[1, 0, 1, 2])
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-5)


def test_dsv4_hc_comb_is_a_sinkhorn_of_a_softmax() -> None:
    ctx = new_ctx()
    n_t, eps = 6, 1e-6
    mv, sv, bv = rand(n_t, 24, lo=-2, hi=2), rand(3, lo=-0.5, hi=0.5), rand(24, lo=-0.25, hi=0.25)
    for n_iter in (1, 3, 20):
        got = run(ctx.dsv4_hc_comb(tensor(ctx, F32, mv), tensor(ctx, F32, sv), tensor(ctx, F32, bv), eps, n_iter))
        want = np.empty((n_t, 4, 4))
        for t in range(n_t):
            logits = np.array([[mv[t, 8 + d + 4 * s] * sv[2] + bv[8 + d + 4 * s] for d in range(4)] for s in range(4)],
                              np.float64)  # [src, dst]
            c = np.exp(logits - logits.max(axis=1, keepdims=True))
            c = c / c.sum(axis=1, keepdims=True) + eps
            c = c / (eps + c.sum(axis=0))
            for _ in range(n_iter - 1):
                c = c / (eps + c.sum(axis=1, keepdims=True))
                c = c / (eps + c.sum(axis=0))
            want[t] = c
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)
        if n_iter == 20:  # nearly doubly stochastic
            np.testing.assert_allclose(got[0].sum(axis=1), 1.0, atol=1e-4)


@pytest.mark.parametrize(("hc", "gated"), [(4, False), (4, True), (1, False), (65, True)])
def test_dsv4_hc_pre(hc: int, gated: bool) -> None:
    ctx = new_ctx()
    n_e, n_t = 7, 3
    xv = rand(n_t, hc, n_e)
    if gated:
        gv = rand(n_t, hc, n_e, lo=-4, hi=4)
        got = run(ctx.dsv4_hc_pre_gated(tensor(ctx, F32, xv), tensor(ctx, F32, gv), 1.0 / hc))
        want = (xv.astype(np.float64) / (1 + np.exp(-gv.astype(np.float64)))).sum(axis=1) / hc
    else:
        wv = rand(n_t, hc, lo=0, hi=1)
        got = run(ctx.dsv4_hc_pre(tensor(ctx, F32, xv), tensor(ctx, F32, wv)))
        want = np.einsum("thi,th->ti", xv.astype(np.float64), wv)
    np.testing.assert_allclose(got[0, 0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("identity", [False, True])
def test_dsv4_hc_post(identity: bool) -> None:
    ctx = new_ctx()
    n_e, n_t, hc = 9, 4, 4
    xv, rv, pv, cv = rand(n_t, n_e), rand(n_t, hc, n_e), rand(n_t, hc, lo=0, hi=2), rand(n_t, hc, hc, lo=0, hi=1)
    comb = None if identity else tensor(ctx, F32, cv)  # cv[t, src, dst]
    got = run(ctx.dsv4_hc_post(tensor(ctx, F32, xv), tensor(ctx, F32, rv), tensor(ctx, F32, pv), comb))
    want = np.empty((n_t, hc, n_e))
    for t, d in np.ndindex(n_t, hc):
        mixed = rv[t, d] if identity else sum(rv[t, s].astype(np.float64) * cv[t, s, d] for s in range(hc))
        want[t, d] = xv[t] * np.float64(pv[t, d]) + mixed
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)


# --- against real ggml ---


@pytest.mark.parametrize("label", sorted({c.label for c in extra_cases()}))
def test_against_ggml(label: str, ggml_reference: Backend) -> None:
    results = op_check.run_cases([c for c in extra_cases() if c.label == label], ggml_reference)
    bad = [(r.case.desc, r.status, r.detail) for r in results if r.status != "OK"]
    assert not bad, bad
    assert len(results) >= 5
