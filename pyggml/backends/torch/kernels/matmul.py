"""Torch kernel: MUL_MAT, and the policy for the weight types it takes.

MUL_MAT (as ggml_compute_forward_mul_mat): dst[M, N, ne2, ne3] (F32); for
every (i2, i3), dst[n, m] = sum_k src0[m, k] * src1[n, k]; src0 broadcasts
over dims 2 and 3 with i02 = i2 / (ne12/ne02), i03 = i3 / (ne13/ne03) (each
src0 matrix serves consecutive src1 matrices).

Policy by src0's type and the backend's `matmul_precision` P ("f32", "f16"
or "bf16", see `pyggml.backends.torch.precision`); `product_dtype` is the
whole rule, the dtype the product is formed in (the "compute dtype"):

- F32: an f32 matmul of the views as they are, whatever P.
- F16, BF16: src1 is rounded to the weight's type first, as ggml rounds it to
  the vec_dot_type, so the products are those ggml forms. Then either
  * native: the matmul runs in the half type (the output is rounded to it,
    ~3 significant digits, then widened into dst), when P is the weight's
    type, or when P is the other half type and src1 has fewer than
    `HALF_NATIVE_MAX_COLS` columns (decoding: a matrix-vector product is
    memory-bound and reads half the bytes of the widened weight); or
  * widened: the weight is widened to f32 (exact) through the weight cache,
    and the rounded src1 is widened too: an f32 matmul of exactly ggml's
    operands. Always with P = "f32"; never a conversion between the two half
    types (F16 -> BF16 drops 3 mantissa bits, BF16 -> F16 the range).
- quantized (Q8_0, Q4_0 on the device; the other types pyggml converts through
  ggml's to_float on the host, see `quants`): the weight is dequantized
  (exact in f32) into P through the weight cache; src1 is converted to P.
  Documented deviation: ggml quantizes src1 to Q8_0 and sums integer block
  products; here src1 keeps its f32 values, so results differ from ggml's by
  src1's quantization error (NMSE ~1e-5, MUL_MAT's threshold is 5e-4).

The weight cache (pyggml.backends.torch.cache) converts each weight once and
keeps it until its bytes change: a set, a copy into them, or a graph that
writes them. A weight the plan itself writes (a quantized or half KV cache
read right after the CPY into it) is converted on every compute instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from pyggml.backends.torch.kernels import Compute, Kernel, PlanContext, noop
from pyggml.backends.torch.kernels._common import BF16, F16, F32
from pyggml.backends.torch.kernels.quants import DEQUANT_TYPES, dequantize
from pyggml.backends.torch.precision import PRECISION_DTYPES
from pyggml.core.errors import GGMLError, ShapeError, UnsupportedTypeError
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType

MUL_MAT_TYPES = (F32, F16, BF16, *DEQUANT_TYPES)
# below this many src1 columns per matrix, F16/BF16 weights are multiplied in their own type unless the precision
# is f32 (see above): the half matmul reads half the bytes and torch's f32 GEMM is slow at small n; the widened
# f32 GEMM wins at many columns (crossover: benchmarks/README.md)
HALF_NATIVE_MAX_COLS = 12

Problem = tuple[type[GGMLError], str] | None


def mul_mat_problem(node: Tensor) -> Problem:
    """Why these kernels cannot compute this MUL_MAT node (error class and reason), or None."""
    a, b = node.src[0], node.src[1]
    if a is None or b is None:
        return ShapeError, "needs two sources"
    if a.type not in MUL_MAT_TYPES:
        return UnsupportedTypeError, (f"src0 '{a.name}' has type {a.type.name}; the torch backend takes "
                                      f"{', '.join(t.name for t in MUL_MAT_TYPES)}")
    if b.type != F32 and not (a.type in (F16, BF16) and b.type == a.type):
        return UnsupportedTypeError, (f"src1 '{b.name}' has type {b.type.name}; with {a.type.name} weights it must "
                                      f"be F32" + (f" or {a.type.name}" if a.type in (F16, BF16) else ""))
    if node.type != F32:
        return UnsupportedTypeError, f"dst has type {node.type.name}, must be F32"
    if TYPE_TRAITS[a.type].is_quantized and a.nb[0] != TYPE_TRAITS[a.type].type_size:
        return ShapeError, f"quantized src0 rows must be contiguous (nb {a.nb})"
    if a.ne[0] != b.ne[0] or b.ne[2] % max(a.ne[2], 1) != 0 or b.ne[3] % max(a.ne[3], 1) != 0:
        return ShapeError, f"src0 ne {a.ne} and src1 ne {b.ne} do not fit (ne0 equal, src1 ne2/ne3 multiples of src0's)"
    if node.ne != [a.ne[1], b.ne[1], b.ne[2], b.ne[3]]:
        return ShapeError, f"dst ne {node.ne} is not [{a.ne[1]}, {b.ne[1]}, {b.ne[2]}, {b.ne[3]}]"
    return None


def _half_dtype(type: GGMLType) -> torch.dtype:
    return torch.float16 if type == F16 else torch.bfloat16


def product_dtype(wtype: GGMLType, n_cols: int, precision: str) -> torch.dtype:
    """The dtype MUL_MAT forms the products of a `wtype` weight and `n_cols` src1 columns in (module docstring)."""
    if wtype == F32 or precision == "f32":
        return torch.float32
    wanted = PRECISION_DTYPES[precision]
    if wtype in (F16, BF16):
        own = _half_dtype(wtype)
        return own if own == wanted or n_cols < HALF_NATIVE_MAX_COLS else torch.float32
    return wanted  # quantized: dequantized into the precision's dtype


def conversions(wtype: GGMLType, cdt: torch.dtype
                ) -> tuple[Callable[[torch.Tensor], torch.Tensor] | None, Callable[[torch.Tensor], torch.Tensor]]:
    """(weight, input) conversions to the product dtype `cdt` of a `wtype` weight's view and of src1's, as the
    module docstring says; the weight's is None when its view is used as it is."""
    f32 = torch.float32
    if wtype == F32:
        return None, lambda x: x if x.dtype == f32 else x.to(f32)
    if wtype in (F16, BF16):
        half = _half_dtype(wtype)
        # src1 rounded to the weight's type (ggml's vec_dot_type)
        return (None if cdt == half else lambda w: w.to(cdt)), lambda x: x.to(half).to(cdt)
    return lambda w: dequantize(wtype, w).to(cdt), lambda x: x.to(cdt)


def operands(pc: PlanContext, a_t: Tensor, a: torch.Tensor, b: torch.Tensor, n_cols: int
             ) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor], torch.dtype]:
    """(weight, input, dtype) of a product of weight `a_t` (view `a`) and `n_cols` columns of `b`: functions giving
    both converted to the product dtype as the module docstring says (the weight through the weight cache)."""
    cdt = product_dtype(a_t.type, n_cols, pc.backend.matmul_precision)
    convert_w, convert_x = conversions(a_t.type, cdt)
    get_w: Callable[[], torch.Tensor] = (lambda: a) if convert_w is None else pc.derived(
        a_t, cdt, functools.partial(convert_w, a))
    return get_w, functools.partial(convert_x, b), cdt


def mul_mat_kernel(node: Tensor, pc: PlanContext) -> Compute:
    """dst = src1 x src0^T per matrix, with the weight policy of the module docstring."""
    problem = mul_mat_problem(node)
    if problem is not None:
        cls, reason = problem
        a_t, b_t = node.src[0], node.src[1]
        types = f"{a_t.type.name if a_t else None} x {b_t.type.name if b_t else None} -> {node.type.name}"
        raise cls(f"torch MUL_MAT '{node.name}' ({types}): {reason}")
    a_t, b_t = node.src[0], node.src[1]
    assert a_t is not None and b_t is not None
    d, a, b = pc.view(node), pc.view(a_t), pc.view(b_t)
    if d.numel() == 0:
        return noop
    if a_t.ne[0] == 0:
        return d.zero_  # k == 0: empty sums

    get_w, convert_x, cdt = operands(pc, a_t, a, b, b_t.ne[1])
    f32 = torch.float32

    ne02, ne03 = a_t.ne[2], a_t.ne[3]
    ne12, ne13 = b_t.ne[2], b_t.ne[3]
    if ne02 == 1 and ne03 == 1:
        # one weight matrix for all of src1: src1's rows folded into one 2-D GEMM (torch.mm), written
        # straight into dst when dst is contiguous and the product is f32
        ne00, ne01 = a_t.ne[0], a_t.ne[1]
        d2 = d.view(-1, ne01) if d.is_contiguous() else None
        direct = cdt == f32 and d2 is not None

        if direct and b_t.nelements() == ne00:
            # one column (decoding): a matrix-vector product, torch.mv (gemv) beats mm's 1-row GEMM
            d1 = d.view(ne01)

            def run_mv() -> None:
                torch.mv(get_w()[0, 0], convert_x().view(ne00), out=d1)

            return run_mv

        def run_2d() -> None:
            w = get_w()[0, 0]
            x2 = convert_x().reshape(-1, ne00)
            if direct:
                torch.mm(x2, w.t(), out=d2)
            else:
                d.copy_(torch.mm(x2, w.t()).view(d.shape))

        return run_2d

    r2, r3 = ne12 // ne02, ne13 // ne03
    d6 = d.unflatten(1, (ne02, r2)).unflatten(0, (ne03, r3))

    def run_batched() -> None:
        w6 = get_w().unsqueeze(1).unsqueeze(3)  # (ne03, 1, ne02, 1, ne01, ne00)
        x6 = convert_x().unflatten(1, (ne02, r2)).unflatten(0, (ne03, r3))
        d6.copy_(torch.matmul(x6, w6.transpose(-1, -2)))

    return run_batched


KERNELS: dict[GGMLOp, Kernel] = {GGMLOp.MUL_MAT: mul_mat_kernel}


def supports(node: Tensor) -> bool:
    return node.op == GGMLOp.MUL_MAT and mul_mat_problem(node) is None
