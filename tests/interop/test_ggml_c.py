"""pyggml.testing.ggml_c: ggml.h's enums, the struct layout, and one-op graphs computed by pyggml and real ggml.

The libraries are llama.cpp 0c1e570's libggml-base/libggml-cpu (the ggml_c_lib fixture builds them once per
machine; the tests skip only where there is no C compiler). The comparisons use test-backend-ops' NMSE
thresholds: 1e-7, 5e-4 for MUL_MAT.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyggml.backends.cpu import cpu_init
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError, NotAllocatedError, UnsupportedOpError
from pyggml.core.graph import graph_overhead
from pyggml.core.tensor import GGMLOp, ScaleMode, Tensor, UnaryOp
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import tensor_get_numpy, tensor_set_numpy
from pyggml.testing import alloc_ctx_tensors, ggml_c, op_check
from pyggml.testing.ggml_c import CTensor, GGMLCError, parse_enums
from pyggml.testing.op_check import MAX_NMSE, MAX_NMSE_MUL_MAT, compare, new, op, permuted, to_f64, transposed

F32, F16, BF16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32
Q4_0, Q8_0, Q8_1, I64 = GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q8_1, GGMLType.I64

# --- the enum parser ---

SYNTHETIC = """
#define GGML_THING 7   // not an enum
#if defined(X)
    #define Y \\
        2
#endif
static const char * s = "enum ggml_fake { A, B };";  // a string, not an enum
enum ggml_plain {
    GGML_PLAIN_A,          // 0
    GGML_PLAIN_B,          /* 1 */
    // GGML_PLAIN_GONE = 9, commented out: not a member
    GGML_PLAIN_C = 10,
    GGML_PLAIN_D,
    GGML_PLAIN_COUNT,
};
enum ggml_exprs {
    GGML_E_SHIFT = (1 << 2),
    GGML_E_HEX   = 0x10,
    GGML_E_OR    = GGML_E_SHIFT | GGML_E_HEX,
    GGML_E_NEXT,
    GGML_E_NEG   = -1,
    GGML_E_AFTER_NEG,
    GGML_E_OTHER = GGML_PLAIN_C * 2 + 1u,   /* a member of an earlier enum */
    GGML_E_DIV   = -7 / 2
};
enum other_lib { OTHER_A = 5 };
struct ggml_s { enum ggml_plain p; };
"""


def test_parse_enums_synthetic() -> None:
    enums = parse_enums(SYNTHETIC)
    assert enums == {
        "ggml_plain": {"GGML_PLAIN_A": 0, "GGML_PLAIN_B": 1, "GGML_PLAIN_C": 10, "GGML_PLAIN_D": 11,
                       "GGML_PLAIN_COUNT": 12},
        "ggml_exprs": {"GGML_E_SHIFT": 4, "GGML_E_HEX": 16, "GGML_E_OR": 20, "GGML_E_NEXT": 21, "GGML_E_NEG": -1,
                       "GGML_E_AFTER_NEG": 0, "GGML_E_OTHER": 21, "GGML_E_DIV": -3},  # C division truncates
    }
    assert list(enums["ggml_plain"]) == ["GGML_PLAIN_A", "GGML_PLAIN_B", "GGML_PLAIN_C", "GGML_PLAIN_D",
                                         "GGML_PLAIN_COUNT"]  # the header's order
    assert parse_enums(SYNTHETIC, prefix="other_") == {"other_lib": {"OTHER_A": 5}}


@pytest.mark.parametrize("body", ["A = UNKNOWN_NAME", "A = 1 +", "A = foo(2)", "A = 1.5"])
def test_parse_enums_rejects_what_is_not_a_constant(body: str) -> None:
    with pytest.raises(ArgumentError, match="enum ggml_bad: A"):
        parse_enums(f"enum ggml_bad {{ {body} }};")


@pytest.fixture(scope="module")
def ggml_h() -> str:
    return ggml_c.header_text("ggml.h")


def test_parse_enums_of_ggml_h(ggml_h: str) -> None:
    enums = parse_enums(ggml_h)
    for name in ("ggml_type", "ggml_op", "ggml_unary_op", "ggml_glu_op", "ggml_prec", "ggml_sort_order",
                 "ggml_scale_mode", "ggml_tri_type", "ggml_op_pool", "ggml_tensor_flag", "ggml_status"):
        assert name in enums, name
    # the enums counted by a *_COUNT member run 0, 1, 2, ... up to it
    for name, count in (("ggml_op", "GGML_OP_COUNT"), ("ggml_unary_op", "GGML_UNARY_OP_COUNT"),
                        ("ggml_glu_op", "GGML_GLU_OP_COUNT"), ("ggml_op_pool", "GGML_OP_POOL_COUNT"),
                        ("ggml_scale_mode", "GGML_SCALE_MODE_COUNT")):
        members = list(enums[name].items())
        assert members[-1][0] == count
        assert [v for _, v in members] == list(range(len(members))), name
    assert enums["ggml_op"]["GGML_OP_COUNT"] == 101  # as ggml.c asserts (static_assert GGML_OP_COUNT == 101)
    assert enums["ggml_unary_op"]["GGML_UNARY_OP_COUNT"] == 22
    assert enums["ggml_glu_op"]["GGML_GLU_OP_COUNT"] == 7
    # types have holes (removed types): COUNT is one past the largest
    types = enums["ggml_type"]
    assert types["GGML_TYPE_COUNT"] == max(v for k, v in types.items() if k != "GGML_TYPE_COUNT") + 1 == 43
    assert "GGML_TYPE_Q4_2" not in types  # commented out in the header
    assert (types["GGML_TYPE_BF16"], types["GGML_TYPE_MXFP4"], types["GGML_TYPE_Q2_0"]) == (30, 39, 42)
    assert enums["ggml_prec"] == {"GGML_PREC_UNDEFINED": 0, "GGML_PREC_DEFAULT": 0, "GGML_PREC_F32": 10,
                                  "GGML_PREC_BF16": 15, "GGML_PREC_F16": 20, "GGML_PREC_Q8": 30, "GGML_PREC_Q4": 40}
    assert enums["ggml_tensor_flag"]["GGML_TENSOR_FLAG_COMPUTE"] == 16
    assert enums["ggml_scale_flag"] == {"GGML_SCALE_FLAG_ALIGN_CORNERS": 256, "GGML_SCALE_FLAG_ANTIALIAS": 512}
    assert enums["ggml_status"]["GGML_STATUS_ALLOC_FAILED"] == -2
    assert enums["ggml_sched_priority"]["GGML_SCHED_PRIO_NORMAL"] == 0  # implicit after LOW = -1
    # ggml's GGML_OP_COUNT assert, read from ggml.c itself
    ggml_c_src = (Path(ggml_c.llamacpp.include_dir()).parent / "src" / "ggml.c").read_text()
    assert "static_assert(GGML_OP_COUNT == 101" in ggml_c_src


def test_enum_values_agree_with_the_library(ggml_c_lib: Any) -> None:
    """The names the library prints for each parsed value are the members' names."""
    enums = ggml_c.c_enums()
    for member, value in enums["ggml_op"].items():
        if member != "GGML_OP_COUNT":
            assert ggml_c_lib.ggml_op_name(value).decode() == member.removeprefix("GGML_OP_")
    for member, value in enums["ggml_unary_op"].items():
        if member != "GGML_UNARY_OP_COUNT":
            assert ggml_c_lib.ggml_unary_op_name(value).decode() == member.removeprefix("GGML_UNARY_OP_")
    for member, value in enums["ggml_type"].items():
        if member != "GGML_TYPE_COUNT":
            assert ggml_c_lib.ggml_type_name(value).decode().upper() == member.removeprefix("GGML_TYPE_")


@pytest.mark.parametrize("size", [1, 7, 64, 100, 2048, 65536])
@pytest.mark.parametrize("grads", [False, True])
def test_graph_overhead_is_the_librarys(ggml_c_lib: Any, size: int, grads: bool) -> None:
    assert graph_overhead(size, grads) == ggml_c_lib.ggml_graph_overhead_custom(size, grads)


# --- the struct layout ---


def test_ctensor_is_the_headers_struct(ggml_h: str, ggml_c_lib: Any) -> None:
    header = ggml_c.header_struct(ggml_h, "ggml_tensor")
    assert [name for name, _ in header] == [name for name, _ in CTensor._fields_]

    class HeaderTensor(ctypes.Structure):
        _fields_ = header

    for name, _ in header:
        ours, theirs = getattr(CTensor, name), getattr(HeaderTensor, name)
        assert (ours.offset, ours.size) == (theirs.offset, theirs.size), name
    assert ctypes.sizeof(CTensor) == ctypes.sizeof(HeaderTensor) == 336
    assert ctypes.sizeof(CTensor) == ggml_c_lib.ggml_tensor_overhead() - ctypes.sizeof(ggml_c.CObject)
    ggml_c_lib.check_layout()  # fields written by the library read back through CTensor


def test_parse_defines(ggml_h: str) -> None:
    defines = ggml_c.parse_defines(ggml_h)
    assert (defines["GGML_MAX_DIMS"], defines["GGML_MAX_SRC"], defines["GGML_MAX_OP_PARAMS"],
            defines["GGML_MAX_NAME"]) == (4, 10, 64, 64)


# --- mapping pyggml's numbers to C's ---


def test_ops_types_and_unary_ops_map_by_name(ggml_c_lib: Any) -> None:
    enums = ggml_c.c_enums()
    assert ggml_c.c_op(GGMLOp.MUL_MAT) == enums["ggml_op"]["GGML_OP_MUL_MAT"] == 29
    assert ggml_c.c_type(GGMLType.Q8_0) == 8
    for o in GGMLOp:  # pyggml's numbers are C's: mapping by name is the identity
        if o.name not in ggml_c.PYTHON_ONLY_OPS:
            assert ggml_c.c_op(o) == o, o.name
    ctx = Context(mem_size=1 << 16, no_alloc=True)
    g = ctx.gelu(ctx.new_tensor(F32, [4]))
    assert ggml_c.ENUM_OP_PARAMS == {}  # no op_params word needs translating any more
    assert g.op_params[0] == UnaryOp.GELU == enums["ggml_unary_op"]["GGML_UNARY_OP_GELU"] == 8
    assert ggml_c.c_op_params(g) == [int(w) for w in g.op_params]  # as is
    assert ggml_c.c_op_params(ctx.scale(g, 0.5)) == [int(w) for w in ctx.scale(g, 0.5).op_params]


def test_python_callables_are_refused(ggml_c_lib: Any) -> None:
    for name in ("MAP_CUSTOM1", "MAP_CUSTOM2", "MAP_CUSTOM3", "CUSTOM"):
        with pytest.raises(UnsupportedOpError, match=f"{name}.*Python function"):
            ggml_c.c_op(GGMLOp[name])


def test_enum_words_would_be_translated_by_name(ggml_c_lib: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mechanism for an op_params word holding an enum whose pyggml numbers differ from C's (none today)."""
    monkeypatch.setitem(ggml_c.ENUM_OP_PARAMS, "UNARY", {0: ("ggml_unary_op", "GGML_UNARY_OP_", UnaryOp)})
    ctx = Context(mem_size=1 << 16, no_alloc=True)
    t = ctx.silu(ctx.new_tensor(F32, [4]).set_name("x"))
    assert ggml_c.c_op_params(t)[0] == ggml_c.c_enums()["ggml_unary_op"]["GGML_UNARY_OP_SILU"]
    t.op_params[0] = 99  # no UnaryOp
    with pytest.raises(UnsupportedOpError, match="op param 0 = 99 is no UnaryOp"):
        ggml_c.c_op_params(t)


# --- one-op graphs: pyggml's CPU backend against C ---

Build = Callable[[Context], Tensor]
Init = Callable[[np.random.Generator, Tensor], np.ndarray]


def _pyggml_and_c(build: Build, inits: dict[str, Init] | None = None, threads: int = 1,
                  isolate: bool = True) -> tuple[Tensor, np.ndarray, np.ndarray]:
    """The output of `build`, its value computed by pyggml's CPU backend and by C from the same leafs."""
    ctx = Context(mem_size=1 << 22, no_alloc=True)
    out = build(ctx)
    g = ctx.new_graph()
    g.build_forward_expand(out)
    cpu = cpu_init(n_threads=1)
    buffer = alloc_ctx_tensors(ctx, cpu)
    try:
        rng = np.random.default_rng(1234)
        for leaf in g.leafs:
            tensor_set_numpy(leaf, (inits or {}).get(leaf.name, op_check.default_values)(rng, leaf))
        want = ggml_c.compute_like(out, threads, isolate=isolate)  # first: some graphs write into their leafs
        cpu.graph_compute(g)
        return out, tensor_get_numpy(out), want
    finally:
        buffer.free()
        cpu.free()


def _nmse(build: Build, inits: dict[str, Init] | None = None, **kwargs: Any) -> float:
    out, got, want = _pyggml_and_c(build, inits, **kwargs)
    assert got.shape == want.shape and got.dtype == want.dtype
    nmse, why = compare(to_f64(out, got), to_f64(out, want))
    assert not why, why
    return nmse


def _add_bcast(ctx: Context) -> Tensor:
    return op(ctx, "add")(new(ctx, "a", F32, [16, 10, 4, 2]), new(ctx, "b", F32, [16, 1, 4, 1]))


def _add_bcast_rows(ctx: Context) -> Tensor:
    return op(ctx, "add")(new(ctx, "a", F32, [16, 10, 4, 2]), new(ctx, "b", F32, [1, 10, 1, 2]))


def _mul_mat(type_a: GGMLType, bs: tuple[int, int] = (1, 1), nr: tuple[int, int] = (1, 1)) -> Build:
    def build(ctx: Context) -> Tensor:
        a = new(ctx, "a", type_a, [256, 16, bs[0], bs[1]])
        b = new(ctx, "b", F32, [256, 5, bs[0] * nr[0], bs[1] * nr[1]])
        return op(ctx, "mul_mat")(a, b)

    return build


def _get_rows(type: GGMLType) -> Build:
    def build(ctx: Context) -> Tensor:
        n = 256 if type in (Q4_0, Q8_0) else 10
        return op(ctx, "get_rows")(new(ctx, "a", type, [n, 5, 3, 1]), new(ctx, "idx", I32, [4, 3, 1, 1]))

    return build


def _permuted_add(ctx: Context) -> Tensor:
    a = permuted(ctx, "a", F32, [8, 6, 4, 2], (0, 2, 1, 3))
    b = transposed(ctx, "b", F32, [8, 6, 1, 1])
    return op(ctx, "add")(a, b)


def _chain(ctx: Context) -> Tensor:
    """A few ops in a row: matmul, broadcast add, silu, scale, through a permute and a cont."""
    h = op(ctx, "mul_mat")(new(ctx, "w", Q8_0, [64, 24, 1, 1]), new(ctx, "x", F32, [64, 6, 1, 1]))
    h = op(ctx, "silu")(op(ctx, "add")(h, new(ctx, "bias", F32, [24, 1, 1, 1])))
    return op(ctx, "scale")(op(ctx, "cont")(op(ctx, "transpose")(h)), 0.5)


def _concat(dim: int, ne_b: list[int]) -> Build:
    return lambda ctx: op(ctx, "concat")(new(ctx, "a", F32, [10, 10, 10, 1]), new(ctx, "b", F32, ne_b), dim)


CASES: dict[str, tuple[Build, dict[str, Init], float]] = {
    "ADD broadcast rows": (_add_bcast, {}, MAX_NMSE),
    "ADD broadcast columns": (_add_bcast_rows, {}, MAX_NMSE),
    "ADD permuted + transposed": (_permuted_add, {}, MAX_NMSE),
    "MUL_MAT f32": (_mul_mat(F32, (2, 1), (1, 2)), {}, MAX_NMSE_MUL_MAT),
    "MUL_MAT f16": (_mul_mat(F16), {}, MAX_NMSE_MUL_MAT),
    "MUL_MAT q8_0": (_mul_mat(Q8_0), {}, MAX_NMSE_MUL_MAT),
    "MUL_MAT q4_0 broadcast": (_mul_mat(Q4_0, (3, 1), (2, 1)), {}, MAX_NMSE_MUL_MAT),
    "MUL_MAT permuted b": (lambda ctx: op(ctx, "mul_mat")(new(ctx, "a", F32, [32, 16, 2, 1]),
                                                          permuted(ctx, "b", F32, [32, 8, 2, 1], (0, 2, 1, 3))),
                           {}, MAX_NMSE_MUL_MAT),
    "GET_ROWS f32": (_get_rows(F32), {"idx": op_check.indices(5)}, MAX_NMSE),
    "GET_ROWS q4_0": (_get_rows(Q4_0), {"idx": op_check.indices(5)}, MAX_NMSE),
    "SCALE": (lambda ctx: op(ctx, "scale")(new(ctx, "a", F32, [10, 10, 10, 10]), 0.75), {}, MAX_NMSE),
    "RMS_NORM": (lambda ctx: op(ctx, "rms_norm")(new(ctx, "a", F32, [64, 10, 4, 1]), 1e-6), {}, MAX_NMSE),
    "RMS_NORM permuted": (lambda ctx: op(ctx, "rms_norm")(permuted(ctx, "a", F32, [32, 6, 4, 1], (0, 2, 1, 3)),
                                                          1e-6), {}, MAX_NMSE),
    "SOFT_MAX": (lambda ctx: op(ctx, "soft_max")(new(ctx, "a", F32, [32, 8, 4, 1])), {}, MAX_NMSE),
    "SOFT_MAX_EXT mask": (lambda ctx: op(ctx, "soft_max_ext")(new(ctx, "a", F32, [32, 8, 4, 1]),
                                                              new(ctx, "mask", F32, [32, 8, 1, 1]), 0.125),
                          {}, MAX_NMSE),
    "CPY f32->f16": (lambda ctx: op(ctx, "cpy")(new(ctx, "a", F32, [256, 4, 2, 1]), new(ctx, "b", F16, [256, 4, 2, 1])),
                     {}, MAX_NMSE),
    "CPY permuted f32->f32": (lambda ctx: op(ctx, "cpy")(permuted(ctx, "a", F32, [16, 6, 4, 1], (0, 2, 1, 3)),
                                                         new(ctx, "b", F32, [16, 6, 4, 1])), {}, MAX_NMSE),
    "CONT transposed": (lambda ctx: op(ctx, "cont")(transposed(ctx, "a", F16, [10, 7, 3, 1])), {}, MAX_NMSE),
    "CONT permuted": (lambda ctx: op(ctx, "cont")(op(ctx, "permute")(new(ctx, "a", F32, [5, 4, 3, 2]), 2, 0, 3, 1)),
                      {}, MAX_NMSE),
    "GELU": (lambda ctx: op(ctx, "gelu")(new(ctx, "a", F32, [128, 10, 3, 1])), {}, MAX_NMSE),
    "SILU": (lambda ctx: op(ctx, "silu")(new(ctx, "a", F32, [128, 10, 3, 1])), {}, MAX_NMSE),
    "chain": (_chain, {}, MAX_NMSE_MUL_MAT),
    # the ops whose op_params changed since 2023 (strict xfails before issue 21)
    "CONCAT dim 2": (_concat(2, [10, 10, 5, 1]), {}, MAX_NMSE),
    "CONCAT dim 0": (_concat(0, [3, 10, 10, 1]), {}, MAX_NMSE),
    "PAD": (lambda ctx: op(ctx, "pad")(new(ctx, "a", F32, [10, 7, 3, 2]), 2, 1, 1, 0), {}, MAX_NMSE),
    "PAD ext": (lambda ctx: op(ctx, "pad_ext")(new(ctx, "a", F32, [10, 7, 3, 2]), 1, 2, 0, 3, 1, 0, 0, 1), {},
                MAX_NMSE),
    "UPSCALE": (lambda ctx: op(ctx, "upscale")(new(ctx, "a", F32, [16, 8, 3, 2]), 2), {}, MAX_NMSE),
    "UPSCALE bilinear": (lambda ctx: op(ctx, "upscale_ext")(new(ctx, "a", F32, [16, 8, 3, 2]), 23, 13, 3, 2,
                                                            ScaleMode.BILINEAR), {}, MAX_NMSE),
    "ROPE neox partial": (lambda ctx: op(ctx, "rope")(new(ctx, "a", F32, [64, 4, 10, 1]), new(ctx, "pos", I32, [10]),
                                                      32, 2), {"pos": op_check.indices(512)}, op_check.MAX_NMSE_ROPE),
    "ROPE normal partial": (lambda ctx: op(ctx, "rope")(new(ctx, "a", F32, [64, 4, 10, 1]), new(ctx, "pos", I32, [10]),
                                                        32, 0), {"pos": op_check.indices(512)}, op_check.MAX_NMSE_ROPE),
    "SOFT_MAX ALiBi": (lambda ctx: op(ctx, "soft_max_ext")(new(ctx, "a", F32, [32, 8, 4, 1]),
                                                           new(ctx, "mask", F32, [32, 8, 1, 1]), 0.125, 8.0),
                       {}, MAX_NMSE),
}


@pytest.mark.parametrize("name", list(CASES))
def test_pyggml_matches_c(ggml_c_lib: Any, name: str) -> None:
    build, inits, max_nmse = CASES[name]
    nmse = _nmse(build, inits)
    assert nmse <= max_nmse, f"{name}: NMSE {nmse:.3e} > {max_nmse:g}"


def test_threads_and_in_process_compute_agree(ggml_c_lib: Any) -> None:
    assert _nmse(_mul_mat(Q4_0, (3, 1), (2, 1)), threads=3, isolate=False) <= MAX_NMSE_MUL_MAT
    with pytest.raises(ArgumentError, match="threads=3 needs isolate=False"):
        _nmse(_mul_mat(Q4_0, (3, 1), (2, 1)), threads=3)
    out, _, forked = _pyggml_and_c(_chain)
    _, _, in_process = _pyggml_and_c(_chain, isolate=False)
    assert np.array_equal(forked, in_process)


def _cpu_flag(flag: str) -> bool:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(line.startswith("flags") and flag in line.split() for line in text.splitlines())


# ggml's CPU quantizes CPY's Q8_0 and Q8_1 with its SIMD rows (x86 AVX, ARM NEON: 127/amax, ties to even) and
# pyggml's CPU backend does the same (quants.from_float_cpu); a ggml built without SIMD uses the reference rows
# (ties away from zero), and there the two differ on ties.
GGML_SIMD_Q8_0 = _cpu_flag("avx") or _cpu_flag("asimd")
ROUNDING_CASES = {
    "CPY bf16->q8_0": lambda ctx: op(ctx, "cpy")(new(ctx, "a", BF16, [256, 4, 2, 1]),
                                                 new(ctx, "b", Q8_0, [256, 4, 2, 1])),
    "CPY f32 ties->q8_1": lambda ctx: op(ctx, "cpy")(new(ctx, "rows", F32, [256, 4, 1, 1]),
                                                     new(ctx, "b", Q8_1, [256, 4, 1, 1])),
    "SET_ROWS f32 ties->q8_0": lambda ctx: op(ctx, "set_rows")(new(ctx, "dst", Q8_0, [256, 6, 1, 1]),
                                                           new(ctx, "rows", F32, [256, 3, 1, 1]),
                                                           new(ctx, "idx", I64, [3, 1, 1, 1])),
}


def _ties(rng: np.random.Generator, t: Tensor) -> np.ndarray:
    """Blocks of amax 63.5 (127/amax = 2) whose other values are k/2 + 1/4: x * 2 is a tie k + 1/2."""
    x = (rng.integers(-120, 120, t.nelements()) / 2 + 0.25).astype(np.float32)
    x[::32] = 63.5
    return x


TIES = {"rows": _ties, "idx": lambda rng, t: np.array([4, 0, 2], np.int64)}


@pytest.mark.parametrize("name", list(ROUNDING_CASES))
def test_q8_conversion_rounds_as_ggml_cpu(ggml_c_lib: Any, name: str) -> None:
    out, got, want = _pyggml_and_c(ROUNDING_CASES[name], TIES)
    if GGML_SIMD_Q8_0:
        assert np.array_equal(got, want), f"{name}: the Q8 bytes differ from ggml's"
    else:  # ggml's scalar row rounds the ties away from zero: pyggml keeps the SIMD builds' bytes
        assert not np.array_equal(got, want), f"{name}: ggml's scalar build should round the ties the other way"


@pytest.mark.parametrize("qtype", [Q8_0, Q8_1])
def test_cpu_q8_row_differs_from_the_reference_only_on_ties(qtype: GGMLType) -> None:
    """from_float_cpu is ggml-cpu's SIMD row: on values with ties it differs from the reference row, else not."""
    from pyggml.core import quants

    rng = np.random.default_rng(3)
    plain = rng.standard_normal((8, 64)).astype(np.float32)
    ties = (rng.integers(-120, 120, (8, 64)) / 2 + 0.25).astype(np.float32)
    ties[:, ::32] = 63.5  # each block's amax: x * 127/amax = 2x = k + 1/2, a tie
    assert np.array_equal(quants.from_float_cpu(qtype, plain), quants.from_float(qtype, plain))
    assert not np.array_equal(quants.from_float_cpu(qtype, ties), quants.from_float(qtype, ties))


# --- the oracle's own guarantees ---


def test_c_never_writes_pyggml_memory(ggml_c_lib: Any) -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a, b = new(ctx, "a", F32, [8, 3, 1, 1]), new(ctx, "b", F32, [8, 3, 1, 1])
    out = op(ctx, "cpy")(a, b)  # writes into b
    cpu = cpu_init(1)
    buffer = alloc_ctx_tensors(ctx, cpu)
    try:
        tensor_set_numpy(a, np.arange(24, dtype=np.float32))
        tensor_set_numpy(b, np.zeros(24, dtype=np.float32))
        c = ggml_c.compute_like(out)
        assert np.array_equal(c.ravel(), np.arange(24, dtype=np.float32))
        assert not tensor_get_numpy(b).any()  # pyggml's b as it was
    finally:
        buffer.free()
        cpu.free()


def test_an_input_without_memory_is_named(ggml_c_lib: Any) -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    out = op(ctx, "add")(new(ctx, "left", F32, [4, 1, 1, 1]), new(ctx, "right", F32, [4, 1, 1, 1]))
    with pytest.raises(NotAllocatedError, match="'left'"):
        ggml_c.compute_like(out)


def test_an_op_c_cannot_run_is_named_before_any_c_runs(ggml_c_lib: Any) -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    out = op(ctx, "map_custom1")(new(ctx, "kq", F32, [10, 10, 8, 1]), op_check._custom1, 1, None).set_name("f")
    with pytest.raises(UnsupportedOpError, match="MAP_CUSTOM1 of 'f' calls a Python function"):
        ggml_c.compute_like(out)


def _scale_f16(ctx: Context) -> Tensor:
    return op(ctx, "scale")(new(ctx, "a", F16, [10, 10, 1, 1]), 0.75)  # ggml's CPU SCALE takes F32 only


def test_a_ggml_abort_becomes_an_error(ggml_c_lib: Any) -> None:
    pid = os.getpid()
    with pytest.raises(GGMLCError, match=r"SIGABRT(.|\n)*ops\.cpp:\d+: fatal error"):
        _pyggml_and_c(_scale_f16)
    assert os.getpid() == pid  # still here


# --- the "ggml-c" backend as op_check' reference ---


def test_backend_as_test_ops_reference(ggml_c_lib: Any) -> None:
    cpu = cpu_init(1)
    ref = ggml_c.ggml_c_init()
    try:
        assert ref.name() == "ggml-c"
        cases = [c for c in op_check.all_cases()
                 if (c.label, c.desc) in {("ADD", "type=f32,ne=[16,10,10,10],nr=[2,2,2,2]"),
                                          ("MUL_MAT", "type_a=q4_0,type_b=f32,m=16,n=8,k=256,bs=[3,2],nr=[2,2]"),
                                          ("GET_ROWS", "type=q8_0,n=256,m=5,r=3,b=3"),
                                          ("ROPE", "type=f32,ne=[128,4,10,1],n_dims=128,mode=2"),
                                          ("SOFT_MAX",
                                           "type=f32,ne=[32,8,4,2],mask=f32[32,8,1,1],scale=0.125,max_bias=0")}]
        assert len(cases) == 5
        for case in cases:
            r = op_check.run_case(case, cpu, ref)
            assert r.status == "OK", (case.label, case.desc, r.detail)
        custom = [c for c in op_check.all_cases() if c.label == "MAP_CUSTOM1"]
        assert [op_check.run_case(c, cpu, ref).status for c in custom] == ["not supported"]  # a Python function
        limited = next(c for c in op_check.all_cases() if (c.label, c.desc) in op_check.GGML_LIMITS)
        r = op_check.run_case(limited, cpu, ref, op_check.GGML_LIMITS)
        assert r.status == "not supported" and "ggml's kernel" in r.detail
    finally:
        cpu.free()
        ref.free()


def test_backend_probe_turns_aborts_into_not_supported(ggml_c_lib: Any) -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    node = _scale_f16(ctx)
    plain, probing = ggml_c.ggml_c_init(), ggml_c.ggml_c_init(probe=True)
    try:
        assert plain.supports_op(node)  # ggml's CPU supports_op says yes...
        assert not probing.supports_op(node)  # ...its kernel aborts
        assert any("fatal error" in reason for reason in probing.probed.values())
        assert probing.supports_op(op(ctx, "scale")(new(ctx, "b", F32, [10, 10, 1, 1]), 0.75))
        assert not plain.supports_op(op(ctx, "map_custom1")(new(ctx, "c", F32, [4, 1, 1, 1]), op_check._custom1))
    finally:
        plain.free()
        probing.free()


def test_backend_writes_results_into_its_buffers(ggml_c_lib: Any) -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    ref = ggml_c.ggml_c_init()
    out = _chain(ctx)
    g = ctx.new_graph()
    g.build_forward_expand(out)
    buffer = alloc_ctx_tensors(ctx, ref)
    try:
        rng = np.random.default_rng(7)
        for leaf in g.leafs:
            tensor_set_numpy(leaf, op_check.default_values(rng, leaf))
        want = ggml_c.compute_like(out)
        ref.graph_compute(g)
        assert np.array_equal(tensor_get_numpy(out), want)
        # every node's value is there, not only the output's
        assert all(tensor_get_numpy(n).any() for n in g.nodes)
    finally:
        buffer.free()
        ref.free()


def test_cli_test_ops_against_ggml(ggml_c_lib: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`pyggml test-ops --against ggml`: the table against real ggml, a summary by op, and a case ggml's kernel
    cannot take listed as not supported with its reason."""
    from pyggml.cli.main import main

    assert main(["test-ops", "--against", "ggml", "-o", "ROPE"]) == 0
    out = capsys.readouterr().out
    assert "Testing backend CPU against ggml-c" in out
    n = sum(c.label == "ROPE" for c in op_check.all_cases())
    assert f"{n}/{n} passed, 0 failed, 0 not supported" in out
    assert main(["test-ops", "--against", "ggml", "-o", "GELU", "-v"]) == 0
    out = capsys.readouterr().out
    assert "not supported (ggml-c: ggml's kernel reads each row as contiguous floats" in out
