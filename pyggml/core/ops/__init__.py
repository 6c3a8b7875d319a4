"""Op builders: each makes a result tensor with ggml's shape rule and op fields.

Every builder takes the context first, as in C (`ops.add(ctx, a, b)`), and is
also a method of `Context` through `OpBuilders` (`ctx.add(a, b)`).

Every builder's arguments are checked against its annotations before it runs
(`_build.checked_builder`: an int where a Tensor is expected, 2.5 for an int
raise ArgumentTypeError naming the op and the argument). The check is put on
each module's builders once, here, before they are re-exported.
"""

from __future__ import annotations

import inspect
from types import ModuleType

from pyggml.core.ops import (
    attention,
    conv,
    conv_back,
    custom,
    elementwise,
    extra,
    layout,
    matmul,
    misc,
    moe,
    rows,
    ssm,
    train,
)
from pyggml.core.ops import glu as glu_ops  # `glu` itself is a builder
from pyggml.core.ops import norm as norm_ops  # `norm` itself is the op builder below
from pyggml.core.ops import reduce as reduce_ops
from pyggml.core.ops._build import checked_builder
from pyggml.core.ops.attention import *
from pyggml.core.ops.conv import *
from pyggml.core.ops.conv_back import *
from pyggml.core.ops.custom import *
from pyggml.core.ops.elementwise import *
from pyggml.core.ops.extra import *
from pyggml.core.ops.glu import *
from pyggml.core.ops.layout import *
from pyggml.core.ops.matmul import *
from pyggml.core.ops.misc import *
from pyggml.core.ops.moe import *
from pyggml.core.ops.norm import *
from pyggml.core.ops.reduce import *
from pyggml.core.ops.rows import *
from pyggml.core.ops.ssm import *
from pyggml.core.ops.train import *

_MODULES = [elementwise, layout, matmul, reduce_ops, norm_ops, conv, custom, misc, train]
_MODULES += [glu_ops, rows, moe]
_MODULES += [attention]
_MODULES += [conv_back]
_MODULES += [ssm]
_MODULES += [extra]


def _check_builders(modules: list[ModuleType], exported: dict[str, object]) -> None:
    """Replace each public builder (a function of a module taking `ctx` first) by its checked version,
    in its module and among the names re-exported here (`exported`)."""
    for module in modules:
        for name, fn in list(vars(module).items()):
            if not (inspect.isfunction(fn) and fn.__module__ == module.__name__ and not name.startswith("_")):
                continue
            params = list(inspect.signature(fn).parameters)
            if params and params[0] == "ctx":
                checked = checked_builder(fn)
                setattr(module, name, checked)
                if exported.get(name) is fn:
                    exported[name] = checked


_check_builders(_MODULES, globals())


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
    pad_ext = layout.pad_ext
    pad_circular = layout.pad_circular
    pad_ext_circular = layout.pad_ext_circular
    upscale = layout.upscale
    upscale_ext = layout.upscale_ext
    interpolate = layout.interpolate
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
    scale_bias = elementwise.scale_bias
    scale_bias_inplace = elementwise.scale_bias_inplace
    unary = elementwise.unary
    unary_inplace = elementwise.unary_inplace
    add1 = elementwise.add1
    add1_inplace = elementwise.add1_inplace
    acc = elementwise.acc
    acc_inplace = elementwise.acc_inplace
    set = elementwise.set
    set_inplace = elementwise.set_inplace
    set_1d = elementwise.set_1d
    set_1d_inplace = elementwise.set_1d_inplace
    set_2d = elementwise.set_2d
    set_2d_inplace = elementwise.set_2d_inplace
    sqr = elementwise.sqr
    sqr_inplace = elementwise.sqr_inplace
    sqrt = elementwise.sqrt
    sqrt_inplace = elementwise.sqrt_inplace
    log = elementwise.log
    log_inplace = elementwise.log_inplace
    clamp = elementwise.clamp
    clamp_inplace = elementwise.clamp_inplace
    leaky_relu = elementwise.leaky_relu
    abs = elementwise.abs
    abs_inplace = elementwise.abs_inplace
    sgn = elementwise.sgn
    sgn_inplace = elementwise.sgn_inplace
    neg = elementwise.neg
    neg_inplace = elementwise.neg_inplace
    step = elementwise.step
    step_inplace = elementwise.step_inplace
    tanh = elementwise.tanh
    tanh_inplace = elementwise.tanh_inplace
    elu = elementwise.elu
    elu_inplace = elementwise.elu_inplace
    relu = elementwise.relu
    relu_inplace = elementwise.relu_inplace
    gelu = elementwise.gelu
    gelu_inplace = elementwise.gelu_inplace
    gelu_quick = elementwise.gelu_quick
    gelu_quick_inplace = elementwise.gelu_quick_inplace
    silu = elementwise.silu
    silu_inplace = elementwise.silu_inplace
    hardswish = elementwise.hardswish
    hardswish_inplace = elementwise.hardswish_inplace
    hardsigmoid = elementwise.hardsigmoid
    hardsigmoid_inplace = elementwise.hardsigmoid_inplace
    sigmoid = elementwise.sigmoid
    sigmoid_inplace = elementwise.sigmoid_inplace
    gelu_erf = elementwise.gelu_erf
    gelu_erf_inplace = elementwise.gelu_erf_inplace
    exp = elementwise.exp
    exp_inplace = elementwise.exp_inplace
    expm1 = elementwise.expm1
    expm1_inplace = elementwise.expm1_inplace
    softplus = elementwise.softplus
    softplus_inplace = elementwise.softplus_inplace
    floor = elementwise.floor
    floor_inplace = elementwise.floor_inplace
    ceil = elementwise.ceil
    ceil_inplace = elementwise.ceil_inplace
    round = elementwise.round
    round_inplace = elementwise.round_inplace
    trunc = elementwise.trunc
    trunc_inplace = elementwise.trunc_inplace
    xielu = elementwise.xielu
    # matrix products
    mul_mat = matmul.mul_mat
    out_prod = matmul.out_prod
    # reductions and sorting
    sum = reduce_ops.sum
    sum_rows = reduce_ops.sum_rows
    mean = reduce_ops.mean
    argmax = reduce_ops.argmax
    argsort = reduce_ops.argsort
    argsort_top_k = reduce_ops.argsort_top_k
    top_k = reduce_ops.top_k
    # norms, soft_max, masks, positions
    norm = norm_ops.norm
    norm_inplace = norm_ops.norm_inplace
    rms_norm = norm_ops.rms_norm
    rms_norm_inplace = norm_ops.rms_norm_inplace
    group_norm = norm_ops.group_norm
    group_norm_inplace = norm_ops.group_norm_inplace
    soft_max = norm_ops.soft_max
    soft_max_inplace = norm_ops.soft_max_inplace
    soft_max_ext = norm_ops.soft_max_ext
    soft_max_ext_inplace = norm_ops.soft_max_ext_inplace
    diag_mask_inf = norm_ops.diag_mask_inf
    diag_mask_inf_inplace = norm_ops.diag_mask_inf_inplace
    diag_mask_zero = norm_ops.diag_mask_zero
    diag_mask_zero_inplace = norm_ops.diag_mask_zero_inplace
    rope = norm_ops.rope
    rope_inplace = norm_ops.rope_inplace
    rope_custom = norm_ops.rope_custom
    rope_custom_inplace = norm_ops.rope_custom_inplace
    rope_ext = norm_ops.rope_ext
    rope_ext_inplace = norm_ops.rope_ext_inplace
    rope_multi = norm_ops.rope_multi
    rope_multi_inplace = norm_ops.rope_multi_inplace
    # convolution and pooling
    im2col = conv.im2col
    conv_1d = conv.conv_1d
    conv_1d_ph = conv.conv_1d_ph
    conv_2d = conv.conv_2d
    conv_2d_sk_p0 = conv.conv_2d_sk_p0
    conv_2d_s1_ph = conv.conv_2d_s1_ph
    conv_transpose_1d = conv.conv_transpose_1d
    pool_1d = conv.pool_1d
    pool_2d = conv.pool_2d
    # custom ops (Python callables)
    map_custom1 = custom.map_custom1
    map_custom1_inplace = custom.map_custom1_inplace
    map_custom2 = custom.map_custom2
    map_custom2_inplace = custom.map_custom2_inplace
    map_custom3 = custom.map_custom3
    map_custom3_inplace = custom.map_custom3_inplace
    custom_4d = custom.custom_4d
    custom_inplace = custom.custom_inplace
    # small ops (misc)
    sin = misc.sin
    sin_inplace = misc.sin_inplace
    cos = misc.cos
    cos_inplace = misc.cos_inplace
    fill = misc.fill
    fill_inplace = misc.fill_inplace
    arange = misc.arange
    timestep_embedding = misc.timestep_embedding
    tri = misc.tri
    cumsum = misc.cumsum
    count_equal = misc.count_equal
    l2_norm = misc.l2_norm
    l2_norm_inplace = misc.l2_norm_inplace
    roll = misc.roll
    pad_reflect_1d = misc.pad_reflect_1d
    repeat_back = misc.repeat_back
    solve_tri = misc.solve_tri
    conv_2d_direct = misc.conv_2d_direct
    conv_2d_dw_direct = misc.conv_2d_dw_direct
    conv_transpose_2d_p0 = misc.conv_transpose_2d_p0
    # training (train)
    silu_back = train.silu_back
    rms_norm_back = train.rms_norm_back
    soft_max_ext_back = train.soft_max_ext_back
    soft_max_ext_back_inplace = train.soft_max_ext_back_inplace
    get_rows_back = train.get_rows_back
    cross_entropy_loss = train.cross_entropy_loss
    cross_entropy_loss_back = train.cross_entropy_loss_back
    opt_step_adamw = train.opt_step_adamw
    opt_step_sgd = train.opt_step_sgd
    # GLU, SET_ROWS, mixture of experts
    glu = glu_ops.glu
    glu_split = glu_ops.glu_split
    reglu = glu_ops.reglu
    reglu_swapped = glu_ops.reglu_swapped
    reglu_split = glu_ops.reglu_split
    geglu = glu_ops.geglu
    geglu_swapped = glu_ops.geglu_swapped
    geglu_split = glu_ops.geglu_split
    swiglu = glu_ops.swiglu
    swiglu_swapped = glu_ops.swiglu_swapped
    swiglu_split = glu_ops.swiglu_split
    geglu_erf = glu_ops.geglu_erf
    geglu_erf_swapped = glu_ops.geglu_erf_swapped
    geglu_erf_split = glu_ops.geglu_erf_split
    geglu_quick = glu_ops.geglu_quick
    geglu_quick_swapped = glu_ops.geglu_quick_swapped
    geglu_quick_split = glu_ops.geglu_quick_split
    swiglu_oai = glu_ops.swiglu_oai
    swiglu_clamp = glu_ops.swiglu_clamp
    set_rows = rows.set_rows
    add_id = moe.add_id
    mul_mat_id = moe.mul_mat_id
    flash_attn_ext = attention.flash_attn_ext
    # IM2COL_BACK, IM2COL_3D, COL2IM_1D, CONV_3D, POOL_2D_BACK (conv_back)
    im2col_back = conv_back.im2col_back
    im2col_3d = conv_back.im2col_3d
    conv_3d = conv_back.conv_3d
    conv_3d_direct = conv_back.conv_3d_direct
    col2im_1d = conv_back.col2im_1d
    pool_2d_back = conv_back.pool_2d_back
    # recurrent-state ops (ssm)
    ssm_conv = ssm.ssm_conv
    ssm_scan = ssm.ssm_scan
    rwkv_wkv6 = ssm.rwkv_wkv6
    gated_linear_attn = ssm.gated_linear_attn
    rwkv_wkv7 = ssm.rwkv_wkv7
    gated_delta_net = ssm.gated_delta_net
    # ROPE_BACK and SAM's ops (extra)
    rope_ext_back = extra.rope_ext_back
    rope_multi_back = extra.rope_multi_back
    win_part = extra.win_part
    win_unpart = extra.win_unpart
    get_rel_pos = extra.get_rel_pos
    add_rel_pos = extra.add_rel_pos
    add_rel_pos_inplace = extra.add_rel_pos_inplace
    lightning_indexer = extra.lightning_indexer
    dsv4_hc_comb = extra.dsv4_hc_comb
    dsv4_hc_pre = extra.dsv4_hc_pre
    dsv4_hc_pre_gated = extra.dsv4_hc_pre_gated
    dsv4_hc_post = extra.dsv4_hc_post
