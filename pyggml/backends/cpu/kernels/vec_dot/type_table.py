"""The CPU's per-type table (ggml's `type_traits_cpu`): the dispatch and every CPU type list derive from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyggml.backends.cpu.kernels.vec_dot import dequantize as dq
from pyggml.backends.cpu.kernels.vec_dot import float_loops as fl
from pyggml.backends.cpu.kernels.vec_dot import kquant_loops as kl
from pyggml.backends.cpu.kernels.vec_dot import kquant_tiles as kt
from pyggml.backends.cpu.kernels.vec_dot import kquant_x8 as kx8
from pyggml.backends.cpu.kernels.vec_dot import lattice as lat
from pyggml.backends.cpu.kernels.vec_dot import low_bit as lb
from pyggml.backends.cpu.kernels.vec_dot import quant_loops as ql
from pyggml.backends.cpu.kernels.vec_dot import reference_dots as rd
from pyggml.backends.cpu.kernels.vec_dot import tiles_x8 as x8
from pyggml.backends.cpu.kernels.vec_dot.kinds import TILED, X8_GEMV, X8_REPACKED, X8_TILE
from pyggml.backends.cpu.numerics import FMA_CHAINS
from pyggml.core.types import TYPE_TRAITS, GGMLType

Kernel = Callable[..., Any]
FLOAT_VEC_DOT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)


@dataclass(frozen=True)
class CPUTypeTraits:
    """One type's row: `cols` the row loop against up to COLS src1 columns (`cols_x86` in ggml's AVX2 order),
    `reference_dot` one row's dot for a type without `cols` (`reference_dot_x86` in ggml's AVX2 order), `x8` the
    loop over 8 interleaved rows (`repack`: the repack buffer type holds it so; `x8_gemv` for the last n % 4
    columns of a src1 matrix, which ggml's repack kernels compute by their gemv in another order), `tiled` the rows of
    a work item in the order of ggml-cpu's tiled matmul (x86: prompts of plain K-quant matrices), `to_float`
    dequantize_row_<type> (given `to_float_arg` if set). `vec_dot_type` None: not a MUL_MAT weight type (Q8_1,
    Q8_K). `from_float` False: ggml's CPU cannot convert float32 to the type (the lattice IQ types), so CPY and
    SET_ROWS do not write it."""

    type: GGMLType
    vec_dot_type: GGMLType | None
    to_float: Kernel
    cols: Kernel | None = None
    cols_x86: Kernel | None = None
    tiled: Kernel | None = None
    reference_dot: Kernel | None = None
    reference_dot_x86: Kernel | None = None
    x8: Kernel | None = None
    x8_gemv: Kernel | None = None
    repack: bool = False
    to_float_arg: int | None = None
    from_float: bool = True

    @property
    def block_bytes(self) -> int:
        return TYPE_TRAITS[self.type].type_size

    @property
    def block_size(self) -> int:
        return TYPE_TRAITS[self.type].blck_size

    @property
    def float_src1(self) -> bool:
        """Whether src1 stays float32 (rounded to the vec_dot type)."""
        return self.vec_dot_type in FLOAT_VEC_DOT_TYPES

    def cols_for(self, x86: bool) -> Kernel | None:
        """The row loop for numerics "x86" (`x86`) or "ref"."""
        return self.cols_x86 if x86 and self.cols_x86 is not None else self.cols

    def dot_for(self, x86: bool) -> Kernel | None:
        """The one-row dot for numerics "x86" (`x86`) or "ref"."""
        return self.reference_dot_x86 if x86 and self.reference_dot_x86 is not None else self.reference_dot


_T = GGMLType
# in ggml's enum order
CPU_TYPE_TRAITS: dict[GGMLType, CPUTypeTraits] = {row.type: row for row in (
    CPUTypeTraits(_T.F32, _T.F32, dq.f32_row_to_f32, cols=fl.dot_f32_cols),
    CPUTypeTraits(_T.F16, _T.F16, dq.half_row_to_f32, cols=fl.dot_f16_cols, to_float_arg=int(_T.F16)),
    CPUTypeTraits(_T.Q4_0, _T.Q8_0, dq.dequantize_row_q4_0, cols=ql.dot_q4_0_cols, cols_x86=ql.dot_q4_0_cols_x86,
                  x8=x8.dot_q4_0_x8_cols, repack=True),
    CPUTypeTraits(_T.Q4_1, _T.Q8_1, dq.dequantize_row_q4_1, cols=ql.dot_q4_1_cols, cols_x86=ql.dot_q4_1_cols_x86),
    CPUTypeTraits(_T.Q5_0, _T.Q8_0, dq.dequantize_row_q5, cols=ql.dot_q5_0_cols, cols_x86=ql.dot_q5_0_cols_x86,
                  x8=x8.dot_q5_0_x8_cols, to_float_arg=0),
    CPUTypeTraits(_T.Q5_1, _T.Q8_1, dq.dequantize_row_q5, reference_dot=rd.dot_q5_1, to_float_arg=1),
    CPUTypeTraits(_T.Q8_0, _T.Q8_0, dq.dequantize_row_q8_0, cols=ql.dot_q8_0_cols, cols_x86=ql.dot_q8_0_cols_x86,
                  x8=x8.dot_q8_0_x8_cols),
    CPUTypeTraits(_T.Q8_1, None, dq.dequantize_row_q8, to_float_arg=0),
    CPUTypeTraits(_T.Q2_K, _T.Q8_K, dq.dequantize_row_q2_K, **kl.Q2_K_LOOPS._asdict(),
                  tiled=kt.TILED_ROWS["Q2_K"]),
    CPUTypeTraits(_T.Q3_K, _T.Q8_K, dq.dequantize_row_q3_K, **kl.Q3_K_LOOPS._asdict(),
                  tiled=kt.TILED_ROWS["Q3_K"]),
    CPUTypeTraits(_T.Q4_K, _T.Q8_K, dq.dequantize_row_q45_K, **kl.Q4_K_LOOPS._asdict(),
                  tiled=kt.TILED_ROWS["Q4_K"], x8=kx8.dot_q4_K_x8_cols,
                  x8_gemv=kx8.dot_q4_K_x8_gemv_cols, repack=True, to_float_arg=0),
    CPUTypeTraits(_T.Q5_K, _T.Q8_K, dq.dequantize_row_q45_K, **kl.Q5_K_LOOPS._asdict(),
                  tiled=kt.TILED_ROWS["Q5_K"], to_float_arg=1),
    CPUTypeTraits(_T.Q6_K, _T.Q8_K, dq.dequantize_row_q6_K, **kl.Q6_K_LOOPS._asdict(),
                  tiled=kt.TILED_ROWS["Q6_K"]),
    CPUTypeTraits(_T.Q8_K, None, dq.dequantize_row_q8, to_float_arg=1),
    CPUTypeTraits(_T.IQ2_XXS, _T.Q8_K, lat.dequantize_row_iq2_xxs, reference_dot=lat.dot_iq2_xxs,
                  from_float=False),
    CPUTypeTraits(_T.IQ2_XS, _T.Q8_K, lat.dequantize_row_iq2_xs, reference_dot=lat.dot_iq2_xs,
                  from_float=False),
    CPUTypeTraits(_T.IQ3_XXS, _T.Q8_K, lat.dequantize_row_iq3_xxs, reference_dot=lat.dot_iq3_xxs,
                  from_float=False),
    CPUTypeTraits(_T.IQ1_S, _T.Q8_K, lat.dequantize_row_iq1_s, reference_dot=lat.dot_iq1_s,
                  from_float=False),
    CPUTypeTraits(_T.IQ4_NL, _T.Q8_0, dq.dequantize_row_iq4_nl, cols=ql.dot_iq4_nl_cols),
    CPUTypeTraits(_T.IQ3_S, _T.Q8_K, lat.dequantize_row_iq3_s, reference_dot=lat.dot_iq3_s,
                  from_float=False),
    CPUTypeTraits(_T.IQ2_S, _T.Q8_K, lat.dequantize_row_iq2_s, reference_dot=lat.dot_iq2_s,
                  from_float=False),
    CPUTypeTraits(_T.IQ4_XS, _T.Q8_K, dq.dequantize_row_iq4_xs, reference_dot=rd.dot_iq4_xs),
    CPUTypeTraits(_T.IQ1_M, _T.Q8_K, lat.dequantize_row_iq1_m, reference_dot=lat.dot_iq1_m,
                  from_float=False),
    CPUTypeTraits(_T.BF16, _T.BF16, dq.half_row_to_f32, cols=fl.dot_bf16_cols, to_float_arg=int(_T.BF16)),
    CPUTypeTraits(_T.TQ1_0, _T.Q8_K, lb.dequantize_row_tq1_0, reference_dot=lb.dot_tq1_0,
                  reference_dot_x86=lb.dot_tq1_0_x86),
    CPUTypeTraits(_T.TQ2_0, _T.Q8_K, lb.dequantize_row_tq2_0, reference_dot=lb.dot_tq2_0,
                  reference_dot_x86=lb.dot_tq2_0_x86),
    CPUTypeTraits(_T.MXFP4, _T.Q8_0, dq.dequantize_row_mxfp4, cols=ql.dot_mxfp4_cols),
    CPUTypeTraits(_T.NVFP4, _T.Q8_0, lb.dequantize_row_nvfp4, reference_dot=lb.dot_nvfp4,
                  reference_dot_x86=lb.dot_nvfp4_x86),
    CPUTypeTraits(_T.Q1_0, _T.Q8_0, lb.dequantize_row_q12_0, reference_dot=lb.dot_q1_0,
                  reference_dot_x86=lb.dot_q1_0_x86, to_float_arg=1),
    # x86 has no Q2_0 vec_dot of its own: the generic C loop, as the host's gcc compiles it
    CPUTypeTraits(_T.Q2_0, _T.Q8_0, lb.dequantize_row_q12_0, reference_dot=lb.dot_q2_0,
                  reference_dot_x86=lb.dot_q2_0_fused if FMA_CHAINS else lb.dot_q2_0, to_float_arg=2),
)}

# what GET_ROWS, CPY and DUP read and write (besides F32 to F32 copies of any type pair the kernels allow)
CONVERTIBLE_TYPES: tuple[GGMLType, ...] = tuple(CPU_TYPE_TRAITS)
# what CPY, DUP and SET_ROWS write from float32
WRITABLE_TYPES: tuple[GGMLType, ...] = tuple(t for t, row in CPU_TYPE_TRAITS.items() if row.from_float)
# MUL_MAT's and MUL_MAT_ID's src0 types
MUL_MAT_TYPES: tuple[GGMLType, ...] = tuple(t for t, row in CPU_TYPE_TRAITS.items() if row.vec_dot_type is not None)
QUANT_MUL_MAT_TYPES: tuple[GGMLType, ...] = tuple(t for t in MUL_MAT_TYPES if TYPE_TRAITS[t].is_quantized)
# the weight types whose direct kernels use the multi-column row loops
COLS_KINDS: frozenset[int] = frozenset(int(t) for t, row in CPU_TYPE_TRAITS.items() if row.cols is not None)
# the kind of each repacked type's matrices (a repacked src0 takes its x8 loop for every column count)
X8_KINDS: dict[int, int] = {int(t): X8_REPACKED + int(t) for t, row in CPU_TYPE_TRAITS.items() if row.repack}
# the kind of the tiles of each type with an x8 loop that tiles_x8.tile_x8 makes (prompts of plain matrices)
X8_TILE_KINDS: dict[int, int] = {int(t): X8_TILE + int(t) for t, row in CPU_TYPE_TRAITS.items()
                                 if row.x8 is not None and t in x8.TILE_TYPES}
# the batch-invariant kind of each repacked type whose gemm and gemv orders differ (every column as gemv)
X8_GEMV_KINDS: dict[int, int] = {int(t): X8_GEMV + int(t) for t, row in CPU_TYPE_TRAITS.items()
                                 if row.repack and row.x8_gemv is not None}
# the kinds whose loops take whole groups of X8_ROWS rows (a work item's rows are a multiple of them)
X8_GROUP_KINDS: frozenset[int] = frozenset((*X8_KINDS.values(), *X8_TILE_KINDS.values(), *X8_GEMV_KINDS.values()))
# the types whose prompts take the row loops, in the order of ggml-cpu's tiled matmul under "x86" (its kind here)
# and of its vec_dot rows under "ref" (no tiled kernel without SIMD); faster than BLAS on dequantized tiles
TILED_KINDS: dict[int, int] = {int(t): TILED + int(t) for t, row in CPU_TYPE_TRAITS.items()
                               if row.tiled is not None}
# the vec_dot types src1 is quantized to, and those it is rounded to
QUANTIZED_SRC1_TYPES: frozenset[GGMLType] = frozenset(
    row.vec_dot_type for row in CPU_TYPE_TRAITS.values() if row.vec_dot_type is not None and not row.float_src1)
ROUNDED_SRC1_TYPES: frozenset[GGMLType] = frozenset(
    row.vec_dot_type for row in CPU_TYPE_TRAITS.values() if row.float_src1 and row.vec_dot_type != GGMLType.F32)


def row_of_kind(kind: int) -> CPUTypeTraits:
    """The table row of a kernel kind (a weight type, or one of its x8 layouts)."""
    return CPU_TYPE_TRAITS[GGMLType(kind % X8_REPACKED)]
