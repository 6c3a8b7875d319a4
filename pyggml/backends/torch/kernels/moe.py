"""Torch kernels of mixture of experts: MUL_MAT_ID and ADD_ID (ggml_compute_forward_mul_mat_id, _add_id).

MUL_MAT_ID: as [K, M, n_expert], b [K, n_b, n_tokens], ids [n_used, n_tokens] I32 -> dst [M, n_used, n_tokens]
F32: dst[:, e, t] = as[:, :, ids[e, t]] x b[:, e % n_b, t]. The (token, slot) pairs are sorted by expert and
each expert's rows are one GEMM. The weights are converted as MUL_MAT's (the same dtype policy,
pyggml.backends.torch.kernels.matmul), but only the experts the ids pick, each kept in the weight cache on its own.
ADD_ID: dst[:, i1, i2] = a[:, i1, i2] + b[:, ids[i1, i2]], F32 as ggml-cpu's.
The ids are checked on every compute (OutOfBoundsError).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pyggml.backends.torch.kernels import Compute, Kernel, PlanContext, noop
from pyggml.backends.torch.kernels._common import F32, I32, Problem, raise_problem
from pyggml.backends.torch.kernels.matmul import MUL_MAT_TYPES, conversions, product_dtype
from pyggml.core.errors import OutOfBoundsError, ShapeError, UnsupportedTypeError
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import TYPE_TRAITS


def mul_mat_id_problem(node: Tensor) -> Problem:
    """Why this kernel cannot compute the MUL_MAT_ID node (error class and reason), or None."""
    a, b, ids = node.src[0], node.src[1], node.src[2]
    if a is None or b is None or ids is None:
        return ShapeError, "needs as, b and ids"
    if a.type not in MUL_MAT_TYPES or b.type != F32 or ids.type != I32 or node.type != F32:
        return UnsupportedTypeError, (f"types {a.type.name} x {b.type.name} (ids {ids.type.name}) -> "
                                      f"{node.type.name}; takes {'/'.join(t.name for t in MUL_MAT_TYPES)} x F32, "
                                      f"I32 ids, F32 dst")
    if TYPE_TRAITS[a.type].is_quantized and a.nb[0] != TYPE_TRAITS[a.type].type_size:
        return ShapeError, "quantized as rows must be contiguous"
    if (a.ne[0] != b.ne[0] or a.ne[3] != 1 or b.ne[3] != 1 or ids.ne[1] != b.ne[2] or b.ne[1] == 0
            or ids.ne[0] % b.ne[1] or node.ne != [a.ne[1], ids.ne[0], b.ne[2], 1]):
        return ShapeError, f"as ne {a.ne}, b ne {b.ne}, ids ne {ids.ne}, dst ne {node.ne} do not fit"
    return None


def _views(node: Tensor, pc: PlanContext, problem: Problem) -> tuple[Tensor, Tensor, Tensor, list[torch.Tensor]]:
    """(src0, src1, ids) and the views of dst and the three, once the node has no problem."""
    raise_problem(node, problem)
    a_t, b_t, i_t = node.src[0], node.src[1], node.src[2]
    assert a_t is not None and b_t is not None and i_t is not None
    return a_t, b_t, i_t, [pc.view(t) for t in (node, a_t, b_t, i_t)]


def _check_ids(ids: torch.Tensor, n: int, what: str) -> None:
    lo, hi = torch.aminmax(ids)
    if int(lo) < 0 or int(hi) >= n:
        raise OutOfBoundsError(f"{what}: id {int(lo) if int(lo) < 0 else int(hi)} outside [0, {n})")


def mul_mat_id_kernel(node: Tensor, pc: PlanContext) -> Compute:
    a_t, b_t, i_t, (d, a, b, idx) = _views(node, pc, mul_mat_id_problem(node))
    if d.numel() == 0:
        return noop
    n_expert, n_used, n_b, n_tokens = a_t.ne[2], i_t.ne[0], b_t.ne[1], b_t.ne[2]
    m = a_t.ne[1]
    cdt = product_dtype(a_t.type, n_tokens * n_used, pc.backend.matmul_precision)
    convert_w, convert_x = conversions(a_t.type, cdt)
    experts = a[0]  # (n_expert, M, K), or raw rows (n_expert, M, row bytes)
    # only the experts the ids pick are converted, each once while its bytes stay (the weight cache)
    weight: Callable[[int], torch.Tensor] = (
        experts.__getitem__ if convert_w is None else pc.derived_matrices(a_t, cdt, lambda e: convert_w(experts[e])))
    what = f"torch MUL_MAT_ID '{node.name}'"
    f32 = torch.float32
    direct = d[0].is_contiguous()  # dst rows are the (token, slot) pairs' rows: written by index

    def run() -> None:
        ids = idx[0, 0, :, :n_used].reshape(-1).long()  # the (token, slot) pairs' experts, token-major
        _check_ids(ids, n_expert, what)
        # the pairs grouped by expert (a stable sort): one GEMM of each expert's rows, no per-pair work in Python
        order = torch.argsort(ids, stable=True)
        counts = torch.bincount(ids, minlength=n_expert).tolist()
        picked = [e for e in range(n_expert) if counts[e]]
        x = convert_x(b[0][order // n_used, order % n_used % n_b])  # (pairs, K) in expert order
        y = torch.empty((x.shape[0], m), dtype=f32, device=d.device)
        first = 0
        for e in picked:
            last = first + counts[e]
            y[first:last] = torch.mm(x[first:last], weight(e).t())
            first = last
        out = d[0].view(-1, m) if direct else torch.empty_like(y)
        out[order] = y
        if not direct:
            d[0].copy_(out.view(d[0].shape))

    return run


def add_id_problem(node: Tensor) -> Problem:
    a, b, ids = node.src[0], node.src[1], node.src[2]
    if a is None or b is None or ids is None:
        return ShapeError, "needs a, b and ids"
    if a.type != F32 or b.type != F32 or node.type != F32 or ids.type != I32:
        return UnsupportedTypeError, f"types {a.type.name} + {b.type.name} (ids {ids.type.name}); takes F32, I32 ids"
    if a.ne[0] != b.ne[0] or a.ne[1:3] != ids.ne[:2] or node.ne != a.ne or a.ne[3] != 1:
        return ShapeError, f"a ne {a.ne}, b ne {b.ne}, ids ne {ids.ne} do not fit"
    return None


def add_id_kernel(node: Tensor, pc: PlanContext) -> Compute:
    _, b_t, _, (d, a, b, idx) = _views(node, pc, add_id_problem(node))
    if d.numel() == 0:
        return noop
    n_rows, what = b_t.ne[1], f"torch ADD_ID '{node.name}'"

    def run() -> None:
        ids = idx[0, 0].long()  # (ne2, ne1)
        _check_ids(ids, n_rows, what)
        torch.add(a, b[0, 0][ids].unsqueeze(0), out=d)

    return run


KERNELS: dict[GGMLOp, Kernel] = {GGMLOp.MUL_MAT_ID: mul_mat_id_kernel, GGMLOp.ADD_ID: add_id_kernel}


def supports(node: Tensor) -> bool:
    if node.op == GGMLOp.MUL_MAT_ID:
        return mul_mat_id_problem(node) is None
    return node.op == GGMLOp.ADD_ID and add_id_problem(node) is None
