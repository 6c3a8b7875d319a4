"""The CPU backend with IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0, NVFP4, Q1_0, Q2_0 and the lattice IQ types (IQ2_XXS,
IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S, IQ1_M) tensors: MUL_MAT, GET_ROWS and CPY.

Each graph is computed by pyggml's CPU backend and by real ggml (the C
library of llama.cpp 0c1e570, `ggml_c.compute_like`) from the same leafs, and
checked against a numpy reference written here: the weights dequantized
(`quants.to_float`, itself bit-exact with ggml's dequantize_row_*), src1
quantized to the weight type's vec_dot_type and back, the product in float64.
MUL_MAT must be within test-backend-ops' NMSE (5e-4) of C, and in fact agrees
to float rounding; GET_ROWS and CPY agree bit for bit. The lattice types'
weights are random blocks (pyggml, like ggml's CPU, does not write them), and
CPY and SET_ROWS to them are refused, as ggml's CPU refuses them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from pyggml.backends.cpu import cpu_init
from pyggml.backends.cpu.backend import CPUBackend
from pyggml.backends.cpu.kernels import atomics, matmul
from pyggml.backends.cpu.kernels.vec_dot import block_sums, kinds, table_lookup, to_float
from pyggml.core import quants
from pyggml.core.context import Context
from pyggml.core.errors import UnsupportedTypeError
from pyggml.core.tensor import Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.ggml_backend.tensor_io import tensor_get_numpy, tensor_set, tensor_set_numpy
from pyggml.gguf.loader import load_tensors
from pyggml.gguf.reader import GGUFFile, read_gguf
from pyggml.gguf.writer import RawTensor, write_gguf
from pyggml.testing import alloc_ctx_tensors, llamacpp
from pyggml.testing.random_blocks import random_blocks

T = GGMLType
LATTICE = [T.IQ2_XXS, T.IQ2_XS, T.IQ3_XXS, T.IQ1_S, T.IQ3_S, T.IQ2_S, T.IQ1_M]
NEW_TYPES = [T.IQ4_NL, T.IQ4_XS, T.MXFP4, T.TQ1_0, T.TQ2_0, T.NVFP4, T.Q1_0, T.Q2_0, *LATTICE]
WRITTEN_TYPES = [t for t in NEW_TYPES if t not in LATTICE]
MAX_NMSE_MUL_MAT = 5e-4  # test-backend-ops' threshold for MUL_MAT
TIGHT = 3e-6  # max |error| / max |reference|: float rounding only


def name(t: GGMLType) -> str:
    return t.name


@pytest.fixture(scope="module")
def ggml_c() -> object:
    """pyggml.testing.ggml_c with its library loaded (built if this machine lacks it)."""
    from pyggml.testing import ggml_c

    try:
        ggml_c.load()
    except llamacpp.NoCompilerError as e:
        pytest.skip(str(e))
    return ggml_c


@pytest.fixture
def cpu() -> Iterator[CPUBackend]:
    backend = cpu_init(n_threads=1)
    yield backend
    backend.free()


Build = Callable[[Context], Tensor]


def compute(build: Build, leafs: dict[str, np.ndarray], cpu: CPUBackend,
            ggml_c: object | None = None) -> tuple[Tensor, np.ndarray, np.ndarray | None]:
    """`build`'s output computed by pyggml's CPU backend (and by C when `ggml_c` is given) from `leafs`
    (float32 values by leaf name, or uint8 bytes for a quantized leaf)."""
    ctx = Context(mem_size=1 << 22, no_alloc=True)
    out = build(ctx)
    g = ctx.new_graph()
    g.build_forward_expand(out)
    buffer = alloc_ctx_tensors(ctx, cpu)
    try:
        for leaf in g.leafs:
            values = leafs[leaf.name]
            if values.dtype == np.uint8:
                tensor_set(leaf, values)
            else:
                tensor_set_numpy(leaf, values)
        want = ggml_c.compute_like(out) if ggml_c is not None else None
        cpu.graph_compute(g)
        return out, tensor_get_numpy(out), want
    finally:
        buffer.free()
        ctx.free()


def nmse(got: np.ndarray, want: np.ndarray) -> float:
    want = want.astype(np.float64)
    return float(np.sum((got - want) ** 2) / max(np.sum(want**2), 1e-30))


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and np.all(np.isfinite(got))
    assert nmse(got, want) < MAX_NMSE_MUL_MAT
    rel = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)
    assert rel < TIGHT, rel


def vec_dot_values(wtype: GGMLType, x: np.ndarray) -> np.ndarray:
    """src1 as ggml multiplies it: quantized to the weight type's vec_dot_type (Q8_0 or Q8_K) and back."""
    vdt = TYPE_TRAITS[wtype].vec_dot_type
    assert vdt in (T.Q8_0, T.Q8_K)
    return quants.to_float(vdt, quants.from_float(vdt, x))


def reference(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """MUL_MAT in float64: w (ne03, ne02, M, K), x (ne13, ne12, N, K) -> (ne13, ne12, N, M), ggml broadcasting."""
    r3, r2 = x.shape[0] // w.shape[0], x.shape[1] // w.shape[1]
    out = np.zeros(x.shape[:3] + (w.shape[2],))
    for i3 in range(x.shape[0]):
        for i2 in range(x.shape[1]):
            out[i3, i2] = x[i3, i2].astype(np.float64) @ w[i3 // r3, i2 // r2].T.astype(np.float64)
    return out


def weights(wtype: GGMLType, shape: tuple[int, ...], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(raw blocks, their float32 values) of random weights; shape in numpy order (..., M, K)."""
    if wtype in LATTICE:
        raw = random_blocks(wtype, shape, rng)
    else:
        raw = quants.from_float(wtype, rng.uniform(-1, 1, shape).astype(np.float32))
    return raw, quants.to_float(wtype, raw)


# --- MUL_MAT ---


CASES = {
    # name: (M, K, N, (ne03, ne02), (ne13, ne12))
    "matvec": (16, 256, 1, (1, 1), (1, 1)),
    "n8": (20, 512, 8, (1, 1), (1, 1)),
    "n33-blas": (24, 512, 33, (1, 1), (1, 1)),  # BLAS_MIN_COLS or more: dequantized tiles and BLAS
    "broadcast": (16, 256, 4, (2, 3), (4, 6)),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("wtype", NEW_TYPES, ids=name)
def test_mul_mat_matches_ggml_and_numpy(wtype: GGMLType, case: str, cpu: CPUBackend, ggml_c: object,
                                        rng: np.random.Generator) -> None:
    M, K, N, (ne03, ne02), (ne13, ne12) = CASES[case]
    raw, wvals = weights(wtype, (ne03, ne02, M, K), rng)
    x = rng.uniform(-1, 1, (ne13, ne12, N, K)).astype(np.float32)

    def build(ctx: Context) -> Tensor:
        a = ctx.new_tensor(wtype, [K, M, ne02, ne03]).set_name("a")
        b = ctx.new_tensor(T.F32, [K, N, ne12, ne13]).set_name("b")
        return ctx.mul_mat(a, b)

    out, got, want = compute(build, {"a": raw.reshape(-1), "b": x}, cpu, ggml_c)
    assert want is not None and got.dtype == want.dtype == np.float32
    ref = reference(wvals, vec_dot_values(wtype, x))
    assert_close(got.reshape(ref.shape), want.reshape(ref.shape).astype(np.float64))
    assert_close(got.reshape(ref.shape), ref)


@pytest.mark.parametrize("case", ["matvec", "n33-blas"])
@pytest.mark.parametrize("wtype", [T.Q4_1, T.Q5_1, T.Q4_K], ids=name)
def test_mul_mat_with_today_s_q8_1_and_q8_k_matches_ggml(wtype: GGMLType, case: str, cpu: CPUBackend,
                                                          ggml_c: object, rng: np.random.Generator) -> None:
    """src1 as today's Q8_1 (f16 d and s, s from the unrounded d) and Q8_K (scale -127/max), on both the direct
    and the BLAS path: C's result to float rounding."""
    M, K, N, _, _ = CASES[case]
    raw, _ = weights(wtype, (1, 1, M, K), rng)
    x = rng.uniform(-1, 1, (1, 1, N, K)).astype(np.float32)

    def build(ctx: Context) -> Tensor:
        return ctx.mul_mat(ctx.new_tensor(wtype, [K, M]).set_name("a"), ctx.new_tensor(T.F32, [K, N]).set_name("b"))

    out, got, want = compute(build, {"a": raw.reshape(-1), "b": x}, cpu, ggml_c)
    assert want is not None
    assert_close(got, want.astype(np.float64))


@pytest.mark.parametrize("wtype", NEW_TYPES, ids=name)
@pytest.mark.slow
def test_mul_mat_on_two_threads_is_the_serial_result(wtype: GGMLType, rng: np.random.Generator) -> None:
    M, K = 2048, 2048  # 4M multiply-adds: above matmul.PARALLEL_MIN_WORK, so the direct kernels use both threads
    assert matmul._direct_work(int(wtype), M, K, 1, 1) >= matmul.PARALLEL_MIN_WORK
    raw, _ = weights(wtype, (1, 1, M, K), rng)
    x = rng.uniform(-1, 1, (1, 1, 1, K)).astype(np.float32)

    def build(ctx: Context) -> Tensor:
        return ctx.mul_mat(ctx.new_tensor(wtype, [K, M]).set_name("a"), ctx.new_tensor(T.F32, [K, 1]).set_name("b"))

    results = []
    for n_threads in (1, 2):
        backend = cpu_init(n_threads=n_threads)
        try:
            results.append(compute(build, {"a": raw.reshape(-1), "b": x}, backend)[1])
        finally:
            backend.free()
    np.testing.assert_array_equal(results[0], results[1])  # each output is one row's dot: threads cannot change it


@pytest.mark.parametrize("wtype", NEW_TYPES, ids=name)
def test_mul_mat_with_src1_in_the_vec_dot_type(wtype: GGMLType, cpu: CPUBackend, ggml_c: object,
                                               rng: np.random.Generator) -> None:
    """src1 given as Q8_0 (IQ4_NL, MXFP4) or Q8_K (IQ4_XS) blocks: ggml skips the conversion, and so does pyggml."""
    vdt = TYPE_TRAITS[wtype].vec_dot_type
    M, K, N = 16, 512, 3
    raw, wvals = weights(wtype, (1, 1, M, K), rng)
    xq = quants.from_float(vdt, rng.uniform(-1, 1, (N, K)).astype(np.float32))

    def build(ctx: Context) -> Tensor:
        return ctx.mul_mat(ctx.new_tensor(wtype, [K, M]).set_name("a"), ctx.new_tensor(vdt, [K, N]).set_name("b"))

    out, got, want = compute(build, {"a": raw.reshape(-1), "b": xq.reshape(-1)}, cpu, ggml_c)
    assert want is not None
    ref = reference(wvals, quants.to_float(vdt, xq).reshape(1, 1, N, K))
    assert_close(got.reshape(ref.shape), want.reshape(ref.shape).astype(np.float64))
    assert_close(got.reshape(ref.shape), ref)


@pytest.mark.parametrize("wtype", NEW_TYPES, ids=name)
def test_blas_path_dequantizes_as_ggml(wtype: GGMLType, rng: np.random.Generator) -> None:
    """The numba dequantizer of the BLAS path (rows_to_f32) is ggml's dequantize_row, bit for bit."""
    tr = TYPE_TRAITS[wtype]
    K, M = 1024, 6
    if wtype in LATTICE:
        raw = random_blocks(wtype, (M, K), rng)
    else:
        raw = quants.from_float(wtype, (rng.standard_normal((M, K)) * np.exp2(rng.integers(-20, 20, (M, 1))))
                                .astype(np.float32))
    raw[1] = rng.integers(0, 256, raw.shape[1], dtype=np.uint8)  # any bytes (random scales, huge and tiny)
    if wtype == T.IQ4_XS:
        raw[1].reshape(-1, tr.type_size)[:, :2] = np.array([0.01], np.float16).view(np.uint8)
    out = np.zeros((M, K), np.float32)
    offsets = np.arange(M, dtype=np.int64) * raw.shape[1]
    with np.errstate(over="ignore", invalid="ignore"):
        to_float.rows_to_f32(int(wtype), raw.reshape(-1), offsets, 0, K // tr.blck_size, out)
        np.testing.assert_array_equal(out, quants.to_float(wtype, raw))


def _lookup_kernel(lookup: Callable[..., object], table: list[int]) -> Callable[..., None]:
    """A numba function out[0:32] = table[nibbles of w[0:16]] through the vector lookup `lookup`."""
    from llvmlite import ir
    from numba import njit, types
    from numba.extending import intrinsic

    @intrinsic
    def lookup32(typingctx, w, out):  # type: ignore[no-untyped-def]
        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            pw = atomics.element_pointer(context, builder, signature.args[0], args[0], ir.Constant(ir.IntType(64), 0))
            v = lookup(builder, table, block_sums.q4_0_nibbles(builder, pw))
            po = atomics.element_pointer(context, builder, signature.args[1], args[1], ir.Constant(ir.IntType(64), 0))
            builder.store(v, builder.bitcast(po, v.type.as_pointer()), align=1)
            return context.get_dummy_value()

        return types.void(w, out), codegen

    @njit
    def run(w: np.ndarray, out: np.ndarray) -> None:
        lookup32(w, out)

    return run


@pytest.mark.parametrize("kind", [kinds.IQ4_NL, kinds.MXFP4])
def test_table_lookups_are_the_table(kind: int) -> None:
    """The vpshufb lookup (AVX2) and the portable compare-and-select chain give the table's values."""
    table = kinds.KVALUES[kind]
    w = np.arange(16, dtype=np.uint8) | (np.arange(15, -1, -1, dtype=np.uint8) << 4)  # every nibble, both halves
    want = np.array([table[v & 15] for v in w] + [table[v >> 4] for v in w], np.int8)
    lookups = [table_lookup.lookup16_portable] + ([table_lookup.lookup16_avx2] if block_sums.HAS_AVX2 else [])
    for lookup in lookups:
        out = np.zeros(32, np.int8)
        _lookup_kernel(lookup, table)(w, out)
        np.testing.assert_array_equal(out, want)


# --- GET_ROWS and CPY ---


@pytest.mark.parametrize("wtype", NEW_TYPES, ids=name)
def test_get_rows_is_ggmls(wtype: GGMLType, cpu: CPUBackend, ggml_c: object, rng: np.random.Generator) -> None:
    n, m, r, b = 256, 5, 4, 3
    raw, wvals = weights(wtype, (b, m, n), rng)
    idx = rng.integers(0, m, (b, r)).astype(np.int32)

    def build(ctx: Context) -> Tensor:
        return ctx.get_rows(ctx.new_tensor(wtype, [n, m, b, 1]).set_name("a"),
                            ctx.new_tensor(T.I32, [r, b, 1, 1]).set_name("idx"))

    out, got, want = compute(build, {"a": raw.reshape(-1), "idx": idx}, cpu, ggml_c)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got.reshape(b, r, n), np.take_along_axis(wvals, idx[:, :, None], axis=1))


@pytest.mark.parametrize("wtype", WRITTEN_TYPES, ids=name)
def test_cpy_to_and_from_f32_is_ggmls(wtype: GGMLType, cpu: CPUBackend, ggml_c: object,
                                      rng: np.random.Generator) -> None:
    """CPY F32 -> type quantizes as ggml's CPU (its from_float: the _ref quantizers for these types), and
    type -> F32 dequantizes as ggml."""
    ne = [256, 4, 2, 1]
    x = rng.uniform(-1, 1, (2, 4, 256)).astype(np.float32)
    x[0, 1] *= np.float32(1e-3)
    x[1, 2, :128] = 0  # zero blocks (for IQ4_NL, only those below 1e-15 leave C's quants unset: none here)

    def to_type(ctx: Context) -> Tensor:
        return ctx.cpy(ctx.new_tensor(T.F32, ne).set_name("a"), ctx.new_tensor(wtype, ne).set_name("b"))

    dst = {"b": np.zeros(2 * 4 * 256 // TYPE_TRAITS[wtype].blck_size * TYPE_TRAITS[wtype].type_size, np.uint8)}
    out, got, want = compute(to_type, {"a": x, **dst}, cpu, ggml_c)
    if wtype == T.IQ4_NL:  # a block of zeros: C leaves its quants as they were, pyggml writes 0x88
        zero = np.abs(x.reshape(-1, 32)).max(axis=1) == 0
        assert want is not None
        want.reshape(-1, 18)[zero, 2:] = 0x88
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got.reshape(2, 4, -1), quants.from_float(wtype, x))

    raw = got.reshape(-1)

    def to_f32(ctx: Context) -> Tensor:
        return ctx.cpy(ctx.new_tensor(wtype, ne).set_name("a"), ctx.new_tensor(T.F32, ne).set_name("b"))

    out, back, want = compute(to_f32, {"a": raw, "b": np.zeros((2, 4, 256), np.float32)}, cpu, ggml_c)
    np.testing.assert_array_equal(back, want)
    np.testing.assert_array_equal(back.reshape(2, 4, 256), quants.to_float(wtype, got.reshape(2, 4, -1)))


@pytest.mark.parametrize("wtype", LATTICE, ids=name)
def test_lattice_cpy_to_f32_is_ggmls_and_from_f32_is_refused(wtype: GGMLType, cpu: CPUBackend, ggml_c: object,
                                                             rng: np.random.Generator) -> None:
    """CPY of a lattice type to F32 dequantizes as ggml; CPY and SET_ROWS from F32 to it are refused, as ggml's CPU
    refuses them (it has no from_float for these types)."""
    from kernel_helpers import compile_node, new_ctx

    ne = [256, 4, 2, 1]
    raw = random_blocks(wtype, (2, 4, 256), rng)

    def to_f32(ctx: Context) -> Tensor:
        return ctx.cpy(ctx.new_tensor(wtype, ne).set_name("a"), ctx.new_tensor(T.F32, ne).set_name("b"))

    out, back, want = compute(to_f32, {"a": raw.reshape(-1), "b": np.zeros((2, 4, 256), np.float32)}, cpu, ggml_c)
    np.testing.assert_array_equal(back, want)
    np.testing.assert_array_equal(back.reshape(2, 4, 256), quants.to_float(wtype, raw))

    ctx = new_ctx(1)
    dst = ctx.new_tensor(wtype, [256, 4])
    to_type = ctx.cpy(ctx.new_tensor(T.F32, [256, 4]).set_name("x"), dst)
    set_rows = ctx.set_rows(dst, ctx.new_tensor(T.F32, [256, 2]).set_name("r"), ctx.new_tensor(T.I64, [2]))
    for node in (to_type, set_rows):
        assert not cpu.supports_op(node), node.op.name
    with pytest.raises(UnsupportedTypeError, match=rf"cannot convert F32 \('x'\) to {wtype.name}"):
        compile_node(to_type)


@contextmanager
def gguf_on_cpu(path: Path, tensors: dict[str, RawTensor],
                cpu: CPUBackend) -> Iterator[tuple[GGUFFile, dict[str, Tensor]]]:
    """`tensors` (RawTensor by name) written to a GGUF file at `path`, read back, and loaded to `cpu`: (the file,
    the loaded tensors by name)."""
    write_gguf(path, "llama", {}, tensors)
    gf = read_gguf(path)
    try:
        loaded = load_tensors(gf, list(tensors), dict.fromkeys(tensors, cpu), progress=False)
        try:
            yield gf, loaded.tensors
        finally:
            loaded.free()
    finally:
        gf.close()


@pytest.mark.parametrize("wtype", LATTICE, ids=name)
def test_a_gguf_file_of_lattice_weights_loads_and_multiplies_as_ggml(wtype: GGMLType, tmp_path: Path,
                                                                      cpu: CPUBackend, ggml_c: object,
                                                                      rng: np.random.Generator) -> None:
    K, M = 512, 3
    raw = random_blocks(wtype, (M, K), rng)
    with gguf_on_cpu(tmp_path / "lattice.gguf", {"w": RawTensor(raw, wtype, (K, M))}, cpu) as (gf, tensors):
        assert gf.tensor("w").type == wtype
        np.testing.assert_array_equal(gf.tensor_float("w"), quants.to_float(wtype, raw))
        ctx = Context(mem_size=1 << 22, no_alloc=True)
        x = ctx.new_tensor(T.F32, [K, 2]).set_name("x")
        mm = ctx.mul_mat(tensors["w"], x)
        buffer = alloc_ctx_tensors(ctx, cpu)
        try:
            tensor_set_numpy(x, rng.uniform(-1, 1, (2, K)).astype(np.float32))
            want = ggml_c.compute_like(mm)  # type: ignore[attr-defined]
            g = ctx.new_graph()
            g.build_forward_expand(mm)
            cpu.graph_compute(g)
            assert_close(tensor_get_numpy(mm).astype(np.float64), want.astype(np.float64))
        finally:
            buffer.free()
            ctx.free()
