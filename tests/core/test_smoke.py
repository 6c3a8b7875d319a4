"""The package imports and its basic objects work together."""

import pyggml as gg


def test_mul_mat_graph_has_ggml_shape_and_order() -> None:
    ctx = gg.Context(mem_size=1 << 20)
    a = ctx.new_tensor_2d(gg.GGMLType.F32, 4, 3).set_name("a")
    b = ctx.new_tensor_2d(gg.GGMLType.F32, 4, 2).set_name("b")
    c = ctx.mul_mat(a, b)
    assert c.ne == [3, 2, 1, 1]
    g = ctx.new_graph()
    g.build_forward_expand(c)
    assert g.nodes == [c]
    assert g.leafs == [a, b]
