"""Op cases that are llama.cpp's test-backend-ops' own (0c1e570, `make_test_cases_eval`), every one of them, for
SUM, SUM_ROWS, MEAN, ARGMAX and CONV_2D.

Each case's desc is its `vars()` there, so a line of test-backend-ops' output names the same case; its leafs get
the values its `initialize_tensors` gives (uniform in [-0.9, 1.1] for SUM and MEAN, distinct values in each row
for ARGMAX, uniform in [-1, 1] otherwise) and it is held to its `max_nmse_err` (1e-7; ARGMAX 0, CONV_2D 5e-4).
"""

from __future__ import annotations

from pyggml.core.context import Context
from pyggml.core.ops.conv import calc_conv_output_size
from pyggml.core.tensor import Tensor
from pyggml.core.types import GGMLType
from pyggml.testing.op_check import F16, F32, OpCase, _ne, _t, distinct, new, op, uniform

MAX_NMSE_CONV_2D = 5e-4
_SUM_VALUES = {"a": uniform(-0.9, 1.1)}  # test_sum, test_mean: away from zero, against cancellation


def _sum_case(ne: list[int], axes: tuple[int, int, int, int] | None = None) -> OpCase:
    """test_sum(f32, ne, permute): the sum of a [ne] tensor, or of ggml_permute(a, *axes) of it."""
    def build(ctx: Context) -> Tensor:
        a = new(ctx, "a", F32, ne)
        return op(ctx, "sum")(op(ctx, "permute")(a, *axes) if axes else a)

    desc = f"type=f32,ne={_ne(ne)}" + (f",permute={_ne(list(axes))}" if axes else "")
    return OpCase("SUM", desc, build, dict(_SUM_VALUES))


def _rows_case(label: str, name: str, ne: list[int], permute: bool = False, slice_: bool = False) -> OpCase:
    """test_sum_rows / test_mean(f32, ne, permute, slice): every other plane of all but the first ne[3] block,
    then ggml_permute(a, 0, 2, 3, 1)."""
    def build(ctx: Context) -> Tensor:
        a = new(ctx, "a", F32, ne)
        if slice_:
            a = op(ctx, "view_4d")(a, ne[0], ne[1], ne[2] // 2, ne[3] - 1, a.nb[1], a.nb[2] * 2, a.nb[3], a.nb[3])
        if permute:
            a = op(ctx, "permute")(a, 0, 2, 3, 1)
        return op(ctx, name)(a)

    inits = dict(_SUM_VALUES) if label == "MEAN" else {}
    return OpCase(label, f"type=f32,ne={_ne(ne)},permute={int(permute)},slice={int(slice_)}", build, inits)


def _argmax_case(ne: list[int]) -> OpCase:
    def build(ctx: Context) -> Tensor:
        return op(ctx, "argmax")(new(ctx, "a", F32, ne))

    return OpCase("ARGMAX", f"type=f32,ne={_ne(ne)}", build, {"a": distinct}, 0.0)


def reduce_cases() -> list[OpCase]:
    """test-backend-ops' SUM, SUM_ROWS, MEAN and ARGMAX cases, in its order."""
    cases = [_argmax_case(ne) for ne in ([32, 1, 1, 1], [32, 513, 1, 1], [100, 10, 1, 1], [1024, 10, 1, 1],
                                         [1024, 12, 1, 1], [2000, 10, 1, 1], [5438, 3, 1, 1])]
    cases += [_sum_case([10, 5, 4, 3]), _sum_case([11, 5, 6, 3], (0, 2, 1, 3)), _sum_case([11, 5, 6, 3], (0, 3, 2, 1)),
              _sum_case([11, 5, 6, 3], (0, 1, 3, 2))]
    cases.append(_rows_case("MEAN", "mean", [10, 5, 4, 3]))
    cases += [_rows_case("MEAN", "mean", [n0, n1, 1, 1]) for n0, n1 in ((33, 1), (33, 256), (32769, 1), (32, 1),
                                                                          (32, 256), (32768, 1))]
    cases += [_rows_case("MEAN", "mean", [11, 5, 6, 3], p, s) for p, s in ((True, False), (False, True), (True, True))]
    cases += [_sum_case([33, 1, 1, 1]), _sum_case([33, 1024, 1, 1]), _sum_case([33, 256, 1, 1]),
              _sum_case([33, 256, 1, 1], (1, 0, 2, 3))]
    cases.append(_rows_case("SUM_ROWS", "sum_rows", [10, 5, 4, 3]))
    for ne0 in (11, 16):
        cases += [_rows_case("SUM_ROWS", "sum_rows", [ne0, 5, 6, 3], p, s)
                  for p, s in ((True, False), (False, True), (True, True))]
    cases += [_rows_case("SUM_ROWS", "sum_rows", [33, n1, 1, 1]) for n1 in (1, 1024, 256)]
    return cases


def _conv_2d_case(ne_input: list[int], ne_kernel: list[int], type_kernel: GGMLType, s0: int, s1: int, p0: int,
                  p1: int, d0: int, d1: int, cwhn: bool = False, kernel_offset: int = 0) -> OpCase:
    """test_conv_2d: ggml_conv_2d_direct of a kernel (a view `kernel_offset` elements into a 1-D tensor, if any)
    and an input, both stored channels innermost and permuted back with `cwhn`."""
    def build(ctx: Context) -> Tensor:
        x = new(ctx, "input", F32, ne_input)
        if kernel_offset == 0:
            k = new(ctx, "kernel", type_kernel, ne_kernel)
        else:
            n = ne_kernel[0] * ne_kernel[1] * ne_kernel[2] * ne_kernel[3]
            storage = new(ctx, "kernel", type_kernel, [n + kernel_offset, 1, 1, 1])
            es = storage.nb[0]
            k = op(ctx, "view_4d")(storage, *ne_kernel, ne_kernel[0] * es, ne_kernel[0] * ne_kernel[1] * es,
                                   ne_kernel[0] * ne_kernel[1] * ne_kernel[2] * es, kernel_offset * es)
        if cwhn:
            x = op(ctx, "permute")(op(ctx, "cont")(op(ctx, "permute")(x, 1, 2, 0, 3)), 2, 0, 1, 3)
            k = op(ctx, "permute")(op(ctx, "cont")(op(ctx, "permute")(k, 2, 3, 1, 0)), 3, 2, 0, 1)
        return op(ctx, "conv_2d_direct")(k, x, s0, s1, p0, p1, d0, d1)

    desc = (f"ne_input={_ne(ne_input)},ne_kernel={_ne(ne_kernel)},type_kernel={_t(type_kernel)},stride0={s0},"
            f"stride1={s1},padding0={p0},padding1={p1},dilation0={d0},dilation1={d1},cwhn={int(cwhn)},"
            f"kernel_offset={kernel_offset}")
    return OpCase("CONV_2D", desc, build, max_nmse=MAX_NMSE_CONV_2D)


def conv_2d_cases() -> list[OpCase]:
    """test-backend-ops' CONV_2D cases, in its order: every stride, padding, channel count, kernel and input size
    of its grid whose output is not empty, each kernel type, each layout; a large one; four odd ones."""
    s1, p0, d0, d1 = 5, 5, 2, 4
    cases = []
    for s0 in (1, 3):
        for p1 in (2, 5):
            for cin in (1, 25):
                for cout in (1, 12):
                    for kh in (1, 2, 3, 11):
                        for kw in (1, 2, 3, 11):
                            for h in (1, 133):
                                for w in (1, 141):
                                    if calc_conv_output_size(w, kw, s0, p0, d0) <= 0 or \
                                            calc_conv_output_size(h, kh, s1, p1, d1) <= 0:
                                        continue
                                    for kt in (F32, F16):
                                        for cwhn in (False, True):
                                            cases.append(_conv_2d_case([w, h, cin, 2], [kw, kh, cin, cout], kt, s0,
                                                                       s1, p0, p1, d0, d1, cwhn))
    for kt in (F32, F16):
        for cwhn in (False, True):
            cases.append(_conv_2d_case([256, 256, 192, 1], [3, 3, 192, 96], kt, 1, 1, 1, 1, 1, 1, cwhn))
    cases += [_conv_2d_case([19, 17, 8, 2], [3, 3, 8, 65], F16, 1, 1, 1, 1, 1, 1),
              _conv_2d_case([19, 17, 16, 3], [3, 3, 16, 33], F16, 2, 3, 4, 2, 2, 1),
              _conv_2d_case([13, 11, 16, 3], [1, 1, 16, 33], F16, 1, 1, 0, 0, 1, 1),
              _conv_2d_case([19, 17, 8, 2], [3, 3, 8, 17], F16, 1, 1, 1, 1, 1, 1, False, 1)]
    return cases


def backend_ops_cases() -> list[OpCase]:
    return reduce_cases() + conv_2d_cases()


__all__ = ["MAX_NMSE_CONV_2D", "backend_ops_cases", "conv_2d_cases", "reduce_cases"]
