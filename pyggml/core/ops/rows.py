"""SET_ROWS: write rows of b into a at the row indices c (the KV-cache write of llama.cpp's graphs).

GET_ROWS lives with the other layout builders (`layout.get_rows`); SET_ROWS is here with its own rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.errors import UnsupportedTypeError
from pyggml.core.ops._build import require, set_op
from pyggml.core.tensor import GGMLOp, Tensor, divides
from pyggml.core.types import TYPE_TRAITS, GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context

SET_ROWS_SRC_TYPES = (GGMLType.F32, GGMLType.F16)
ROW_INDEX_TYPES = (GGMLType.I64, GGMLType.I32)


def is_contiguous_rows(t: Tensor) -> bool:
    """ggml_is_contiguous_rows: the elements of each row are contiguous."""
    tr = TYPE_TRAITS[t.type]
    return t.ne[0] == tr.blck_size or t.nb[0] == tr.type_size


def set_rows(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """ggml_set_rows: a[:, c[i, i2 % c.ne1, i3 % c.ne2], i2, i3] = b[:, i, i2, i3], converted to a's type.

    The result is a view of a (ggml_view_tensor): computing it writes into a's memory. Sources as ggml orders
    them: src[0] = b, src[1] = c, src[2] = a.
    """
    op = "set_rows"
    require(a.ne[0] == b.ne[0] and a.ne[2] == b.ne[2] and a.ne[3] == b.ne[3], op,
            "a.ne[0], ne[2], ne[3] must equal b's", a, b)
    require(b.ne[1] == c.ne[0], op, "b.ne[1] (rows) must equal c.ne[0] (indices)", b, c)
    require(divides(c.ne[1], b.ne[2]) and divides(c.ne[2], b.ne[3]) and c.ne[3] == 1, op,
            "b.ne[2], b.ne[3] must be multiples of c.ne[1], c.ne[2], and c.ne[3] == 1", b, c)
    if b.type not in SET_ROWS_SRC_TYPES:
        raise UnsupportedTypeError(f"{op}: b '{b.name}' has type {b.type.name}; it must be F32 or F16")
    if c.type not in ROW_INDEX_TYPES:
        raise UnsupportedTypeError(f"{op}: c '{c.name}' has type {c.type.name}; row indices must be I64 or I32")
    require(is_contiguous_rows(a), op, "a's rows must be contiguous", a)
    require(is_contiguous_rows(b), op, "b's rows must be contiguous", b)
    result = ctx.view_tensor(a)
    return set_op(result, GGMLOp.SET_ROWS, b, c, a)


__all__ = ["ROW_INDEX_TYPES", "SET_ROWS_SRC_TYPES", "is_contiguous_rows", "set_rows"]
