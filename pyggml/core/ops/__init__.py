"""Op builders: each makes a result tensor with ggml's shape rule and op fields.

Every builder takes the context first, as in C (`ops.add(ctx, a, b)`), and is
also a method of `Context` through `OpBuilders` (`ctx.add(a, b)`).
"""

from __future__ import annotations

from pyggml.core.ops import elementwise, layout, matmul
from pyggml.core.ops.elementwise import *  # noqa: F403
from pyggml.core.ops.layout import *  # noqa: F403
from pyggml.core.ops.matmul import *  # noqa: F403

_MODULES = [elementwise, layout, matmul]


class OpBuilders:
    """Mixin of `Context`: the op builders as methods (ctx.add(a, b) is ops.add(ctx, a, b))."""

    # layout
    dup = layout.dup
    dup_inplace = layout.dup_inplace
    cpy = layout.cpy
    cont = layout.cont
    cont_1d = layout.cont_1d
    cont_2d = layout.cont_2d
    cont_3d = layout.cont_3d
    cont_4d = layout.cont_4d
    reshape = layout.reshape
    reshape_1d = layout.reshape_1d
    reshape_2d = layout.reshape_2d
    reshape_3d = layout.reshape_3d
    reshape_4d = layout.reshape_4d
    view_1d = layout.view_1d
    view_2d = layout.view_2d
    view_3d = layout.view_3d
    view_4d = layout.view_4d
    permute = layout.permute
    transpose = layout.transpose
    get_rows = layout.get_rows
    repeat = layout.repeat
    concat = layout.concat
    diag = layout.diag
    pad = layout.pad
    upscale = layout.upscale
    # element-wise
    add = elementwise.add
    add_inplace = elementwise.add_inplace
    sub = elementwise.sub
    sub_inplace = elementwise.sub_inplace
    mul = elementwise.mul
    mul_inplace = elementwise.mul_inplace
    div = elementwise.div
    div_inplace = elementwise.div_inplace
    scale = elementwise.scale
    scale_inplace = elementwise.scale_inplace
    unary = elementwise.unary
    unary_inplace = elementwise.unary_inplace
    # matrix products
    mul_mat = matmul.mul_mat
    out_prod = matmul.out_prod
