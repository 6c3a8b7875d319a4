"""The op checker's cases (`op_check.OpCase`) of GLU, SET_ROWS, ADD_ID and MUL_MAT_ID, in the spirit of
test-backend-ops' test_glu, test_glu_split, test_swiglu_oai, test_set_rows, test_add_id and test_mul_mat_id:
every GLU function on each type ggml's CPU takes, fused (swapped or not) and split, odd ne0, padded rows;
SET_ROWS into every type with a from_float, I64 and I32 indices, indices broadcast over dims 2 and 3,
permuted values; MUL_MAT_ID on every weight type MUL_MAT takes, src1 broadcast over the used experts."""

from __future__ import annotations

import numpy as np

from pyggml.core.context import Context
from pyggml.core.quants import FROM_FLOAT_TYPES
from pyggml.core.tensor import GLUOp, Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.testing.op_check import (
    ALL_TYPES,
    BF16,
    F16,
    F32,
    I32,
    MAX_NMSE_MUL_MAT,
    Init,
    OpCase,
    _ne,
    _t,
    new,
    op,
    permuted,
    uniform,
)

I64 = GGMLType.I64

# GLU functions and the types of ggml-cpu's kernels (ops.cpp)
GLU_CASE_TYPES: dict[GLUOp, tuple[GGMLType, ...]] = {
    GLUOp.REGLU: (F32, F16, BF16), GLUOp.GEGLU: (F32, F16, BF16), GLUOp.SWIGLU: (F32, F16, BF16),
    GLUOp.SWIGLU_OAI: (F32,), GLUOp.GEGLU_ERF: (F32, F16, BF16), GLUOp.GEGLU_QUICK: (F32, F16, BF16),
    GLUOp.SWIGLU_CLAMP: (F32, F16),
}
OAI_ALPHA, OAI_LIMIT, CLAMP_LIMIT = 1.702, 0.7, 0.6


def _glu_split_call(ctx: Context, g: GLUOp, a: Tensor, b: Tensor) -> Tensor:
    """The split form through ggml's builder of the function (parameters of OAI and CLAMP included)."""
    if g == GLUOp.SWIGLU_OAI:
        return op(ctx, "swiglu_oai")(a, b, OAI_ALPHA, OAI_LIMIT)
    if g == GLUOp.SWIGLU_CLAMP:
        return op(ctx, "swiglu_clamp")(a, b, CLAMP_LIMIT)
    return op(ctx, "glu_split")(a, b, g)


def glu_cases() -> list[OpCase]:
    cases = []
    values = {"a": uniform(-3.0, 3.0), "b": uniform(-3.0, 3.0)}
    for g, types in GLU_CASE_TYPES.items():
        for type in types:
            for ne in ([128, 2, 2, 2], [63, 5, 4, 3], [1, 3, 1, 1]):
                for swapped in (False, True):
                    def fused(ctx: Context, g: GLUOp = g, type: GGMLType = type, ne: list[int] = ne,
                              swapped: bool = swapped) -> Tensor:
                        return op(ctx, "glu")(new(ctx, "a", type, ne), g, swapped)

                    cases.append(OpCase(g.name, f"type={_t(type)},ne_a={_ne(ne)},swapped={int(swapped)}", fused,
                                        values))
            for ne in ([64, 3, 2, 2], [5, 7, 3, 1]):
                def split(ctx: Context, g: GLUOp = g, type: GGMLType = type, ne: list[int] = ne) -> Tensor:
                    return _glu_split_call(ctx, g, new(ctx, "a", type, ne), new(ctx, "b", type, ne))

                cases.append(OpCase(g.name, f"type={_t(type)},ne_a={_ne(ne)},split", split, values))

        def padded(ctx: Context, g: GLUOp = g) -> Tensor:
            # rows of 14 in a tensor of rows of 20: contiguous_1 (rows padded), as ggml accepts
            base = new(ctx, "a", F32, [20, 5, 4, 3])
            nb = base.nb
            v = op(ctx, "view_4d")(base, 14, 5, 4, 3, nb[1], nb[2], nb[3], 8)
            return op(ctx, "glu")(v, g, False)

        cases.append(OpCase(g.name, "type=f32,ne_a=[14,5,4,3],rows padded to 20", padded, values))
    return cases


def distinct_rows(limit: int, dtype: type[np.integer]) -> Init:
    """Distinct indices in [0, limit) in each row of the index tensor (no row written twice)."""
    def init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
        rows = t.nelements() // max(t.ne[0], 1)
        return np.stack([rng.permutation(limit)[: t.ne[0]] for _ in range(rows)]).astype(dtype).ravel()

    return init


# the types a row can be written to: not the lattice types (ggml's CPU has no from_float for them)
SET_ROWS_DST_TYPES = [F32, F16, BF16] + [t for t in ALL_TYPES if TYPE_TRAITS[t].is_quantized and t in FROM_FLOAT_TYPES]


def set_rows_cases() -> list[OpCase]:
    cases = []
    for dst_type in SET_ROWS_DST_TYPES:
        n = 256 if TYPE_TRAITS[dst_type].is_quantized else 7
        src_types = (F32, F16) if dst_type in (F32, F16) else (F32,)
        for src_type in src_types:
            for idx_type in (I64, I32):
                for ne1, r, ne2, ne3, c1, c2 in ((11, 3, 1, 1, 1, 1), (6, 4, 4, 3, 2, 3), (5, 1, 2, 2, 1, 1)):
                    def build(ctx: Context, dst_type: GGMLType = dst_type, src_type: GGMLType = src_type,
                              idx_type: GGMLType = idx_type, n: int = n, ne1: int = ne1, r: int = r, ne2: int = ne2,
                              ne3: int = ne3, c1: int = c1, c2: int = c2) -> Tensor:
                        a = new(ctx, "a", dst_type, [n, ne1, ne2, ne3])
                        b = new(ctx, "b", src_type, [n, r, ne2, ne3])
                        c = new(ctx, "c", idx_type, [r, c1, c2, 1])
                        return op(ctx, "set_rows")(a, b, c)

                    idt = np.int64 if idx_type == I64 else np.int32
                    cases.append(OpCase("SET_ROWS", f"type={_t(dst_type)},type_b={_t(src_type)},"
                                        f"type_idx={_t(idx_type)},ne_a=[{n},{ne1},{ne2},{ne3}],r={r},"
                                        f"ne_c=[{r},{c1},{c2}]", build, {"c": distinct_rows(ne1, idt)}))

    def build_nc(ctx: Context) -> Tensor:
        a = new(ctx, "a", F16, [9, 8, 3, 2])
        b = permuted(ctx, "b", F32, [9, 4, 3, 2], (0, 2, 1, 3))  # rows contiguous, dims 1 and 2 swapped
        c = new(ctx, "c", I64, [4, 3, 2, 1])
        return op(ctx, "set_rows")(a, b, c)

    cases.append(OpCase("SET_ROWS", "type=f16,type_b=f32,type_idx=i64,ne_a=[9,8,3,2],r=4,b permuted", build_nc,
                        {"c": distinct_rows(8, np.int64)}))
    return cases


def experts_per_token(n_expert: int) -> Init:
    """Distinct experts in [0, n_expert) for each token (each row of ids)."""
    return distinct_rows(n_expert, np.int32)


def add_id_cases() -> list[OpCase]:
    cases = []
    for n, n_expert, n_used, n_tok in ((16, 5, 2, 3), (7, 4, 4, 1), (1, 2, 1, 5)):
        def build(ctx: Context, n: int = n, n_expert: int = n_expert, n_used: int = n_used, n_tok: int = n_tok) \
                -> Tensor:
            return op(ctx, "add_id")(new(ctx, "a", F32, [n, n_used, n_tok, 1]), new(ctx, "b", F32, [n, n_expert, 1, 1]),
                                     new(ctx, "ids", I32, [n_used, n_tok, 1, 1]))

        cases.append(OpCase("ADD_ID", f"n={n},n_expert={n_expert},n_used={n_used},n_tokens={n_tok}", build,
                            {"ids": experts_per_token(n_expert)}))

    def build_nc(ctx: Context) -> Tensor:
        a = permuted(ctx, "a", F32, [16, 3, 4, 1], (0, 2, 1, 3))
        return op(ctx, "add_id")(a, new(ctx, "b", F32, [16, 6, 1, 1]), new(ctx, "ids", I32, [3, 4, 1, 1]))

    cases.append(OpCase("ADD_ID", "n=16,n_expert=6,n_used=3,n_tokens=4,a permuted", build_nc,
                        {"ids": experts_per_token(6)}))
    return cases


def mul_mat_id_cases() -> list[OpCase]:
    cases = []
    for type_a in ALL_TYPES:
        k = 256 if TYPE_TRAITS[type_a].is_quantized else 32
        # (n_as, n_used, b_rows, m, n_tokens): few rows per expert (the direct vec_dot path) and, last, many
        # (the grouped BLAS path)
        shapes = ((4, 2, 2, 5, 3), (4, 2, 1, 5, 3), (4, 2, 1, 5, 48)) if TYPE_TRAITS[type_a].is_quantized else \
            ((4, 2, 2, 5, 3), (4, 2, 1, 5, 3), (8, 3, 3, 17, 9), (1, 1, 1, 1, 1), (4, 2, 2, 5, 48))
        for n_as, n_used, b_rows, m, n_tok in shapes:
            def build(ctx: Context, type_a: GGMLType = type_a, k: int = k, n_as: int = n_as, n_used: int = n_used,
                      b_rows: int = b_rows, m: int = m, n_tok: int = n_tok) -> Tensor:
                as_ = new(ctx, "as", type_a, [k, m, n_as, 1])
                b = new(ctx, "b", F32, [k, b_rows, n_tok, 1])
                ids = new(ctx, "ids", I32, [n_used, n_tok, 1, 1])
                return op(ctx, "mul_mat_id")(as_, b, ids)

            cases.append(OpCase("MUL_MAT_ID", f"type_a={_t(type_a)},type_b=f32,n_mats={n_as},n_used={n_used},"
                                f"b_rows={b_rows},m={m},n={n_tok},k={k}", build, {"ids": experts_per_token(n_as)},
                                MAX_NMSE_MUL_MAT))
    for type_a in (F32, F16, GGMLType.Q4_0):
        k = 256 if TYPE_TRAITS[type_a].is_quantized else 32

        def build_nc(ctx: Context, type_a: GGMLType = type_a, k: int = k) -> Tensor:
            as_ = new(ctx, "as", type_a, [k, 5, 4, 1])
            b = permuted(ctx, "b", F32, [k, 2, 3, 1], (0, 2, 1, 3))  # rows contiguous, dims 1 and 2 swapped
            return op(ctx, "mul_mat_id")(as_, b, new(ctx, "ids", I32, [2, 3, 1, 1]))

        cases.append(OpCase("MUL_MAT_ID", f"type_a={_t(type_a)},type_b=f32,n_mats=4,n_used=2,b_rows=2,m=5,n=3,"
                            f"k={k},b permuted", build_nc, {"ids": experts_per_token(4)}, MAX_NMSE_MUL_MAT))
    return cases


def glu_rows_moe_cases() -> list[OpCase]:
    return glu_cases() + set_rows_cases() + add_id_cases() + mul_mat_id_cases()
