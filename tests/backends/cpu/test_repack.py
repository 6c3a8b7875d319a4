"""Q4_0 weights repacked for the CPU kernels (pyggml.backends.cpu.repack, vec_dot's "Q4_0 repacked" loop).

The layout: repack and unpack are inverse, each byte lands where the layout says, bad shapes are refused.
The loop: its dots against an independent scalar loop in the float order of ggml's x86 repack kernels
(ggml_gemv/gemm_q4_0_8x8_q8_0: acc = fma(float(block sum of (nibble - 8) * y), d_w * d_y, acc), block after
block), to the bit, with the portable sums and with VNNI's where the host has it, for 1 to 6 columns.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import backend_mul_mat
from numba import njit

from pyggml.backends.cpu.kernels.vec_dot import block_sums, ir, kinds, quantize_src1, tiles_x8
from pyggml.backends.cpu.repack import REPACKED_Q4_0, X8_ROWS, repack_q4_0, repack_q4_K, unpack_q4_0
from pyggml.core.errors import GGMLError

K = 224  # 7 blocks
NB = K // 32


def _q4_0_rows(rng: np.random.Generator, rows: int, nb: int) -> np.ndarray:
    """Random Q4_0 rows: every nibble pattern, f16 scales of far apart magnitudes (their products round)."""
    raw = rng.integers(0, 256, (rows, nb, 18), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.0, (rows, nb)) * np.exp2(rng.integers(-12, 4, (rows, nb)))).astype(np.float16)
    raw[:, :, :2] = d.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, nb * 18)


def _src1(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """n src1 rows quantized to Q8_0 as the kernels take them (yq, yd, ys, yb), blocks of random magnitude."""
    x = rng.standard_normal((n, NB, 32)) * np.exp(3 * rng.standard_normal((n, NB, 1)))
    x = np.ascontiguousarray(x.reshape(n, K).astype(np.float32))
    yq, yd = np.zeros((n, K), np.int8), np.zeros((n, NB), np.float32)
    ys, yb = np.zeros((n, NB), np.float32), np.zeros((n, K // 16), np.int32)
    quantize_src1.quantize_rows(kinds.Q8_0, x, yq, yd, ys, yb, quantize_src1.ROUND_X86)
    return yq, yd, ys, yb


@njit(cache=True)
def _reference(raw, yq, yd, out):
    """out[c, m]: ggml's x86 repack order, one scalar at a time, from the original Q4_0 rows."""
    for m in range(raw.shape[0]):
        for c in range(yq.shape[0]):
            acc = np.float32(0.0)
            for b in range(raw.shape[1] // 18):
                o = 18 * b
                isum = 0
                for j in range(16):
                    q = raw[m, o + 2 + j]
                    isum += (np.int32(q & 15) - 8) * np.int32(yq[c, 32 * b + j])
                    isum += (np.int32(q >> 4) - 8) * np.int32(yq[c, 32 * b + 16 + j])
                acc = ir.fma_f32(np.float32(isum), ir.load_f16(raw[m], o) * yd[c, b], acc)
            out[c, m] = acc


def test_repack_and_unpack_are_inverse_and_place_each_byte() -> None:
    rng = np.random.default_rng(0)
    raw = _q4_0_rows(rng, 3 * X8_ROWS, NB)
    packed = repack_q4_0(raw)
    assert packed.shape == raw.shape and packed.dtype == np.uint8
    assert np.array_equal(unpack_q4_0(packed), raw)
    flat = packed.reshape(-1)
    for g, r, b, v, i in ((0, 0, 0, 0, 0), (1, 5, 3, 2, 1), (2, 7, NB - 1, 3, 3)):
        block = flat[(g * NB + b) * X8_ROWS * 18:]
        row = raw[g * X8_ROWS + r, 18 * b:]
        assert block[2 * r:2 * r + 2].tobytes() == row[:2].tobytes()  # the scales first, row by row
        assert block[16 + 32 * v + 4 * r + i] == row[2 + 4 * v + i]


@pytest.mark.parametrize(("type_name", "shape"), [("Q4_0", (12, 18)), ("Q4_0", (16, 17)), ("Q4_0", (8,)),
                                                  ("Q4_K", (12, 144)), ("Q4_K", (16, 145)), ("Q4_K", (8,))])
def test_repack_refuses_other_shapes(type_name: str, shape: tuple[int, ...]) -> None:
    repack = {"Q4_0": repack_q4_0, "Q4_K": repack_q4_K}[type_name]
    with pytest.raises(GGMLError, match=f"repack {type_name}"):
        repack(np.zeros(shape, np.uint8))


VARIANTS = [False] + ([True] if block_sums.HAS_VNNI else [])


@pytest.mark.parametrize("groups", [1, 2], ids=lambda g: f"{g}-groups")
@pytest.mark.parametrize("vnni", VARIANTS, ids=lambda v: "vnni" if v else "portable")
@pytest.mark.slow
def test_repacked_loop_is_ggml_x86_repack_order_to_the_bit(vnni: bool, groups: int) -> None:
    rng = np.random.default_rng(1)
    M = 5 * X8_ROWS
    raw = _q4_0_rows(rng, M, NB)
    packed = repack_q4_0(raw).reshape(-1)
    w_off = np.arange(M, dtype=np.int64) * raw.shape[1]
    dot = tiles_x8.make_dot_q4_0_x8(vnni, ir.COLS, groups)

    @njit
    def run(w, w_off, m0, m1, yq, yd, yb, out):
        for r in range(0, yq.shape[0], 4):
            dot(w, w_off, 0, m0, m1, 7, yq, yd, yb, r, min(4, yq.shape[0] - r), out)

    for n in range(1, 7):
        yq, yd, _, yb = _src1(rng, n)
        want = np.zeros((n, M), np.float32)
        _reference(raw, yq, yd, want)
        got = np.full((n, M), np.nan, np.float32)
        run(packed, w_off, 0, M, yq, yd, yb, got)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), n
        # a range of groups writes those rows only
        part = np.full((n, M), np.nan, np.float32)
        run(packed, w_off, 2 * X8_ROWS, 4 * X8_ROWS, yq, yd, yb, part)
        assert np.array_equal(part[:, 16:32].view(np.uint32), want[:, 16:32].view(np.uint32))
        assert np.isnan(part[:, :16]).all() and np.isnan(part[:, 32:]).all()


# --- the CPU_REPACK buffer type: listed by the registry, written and read as plain Q4_0, computed by MUL_MAT ---


def _weights_in_repack_buffer(raw: np.ndarray, k: int, extra_f32: bool = False):
    """A context with a Q4_0 matrix of `raw`'s rows (and an F32 tensor) in one CPU_REPACK buffer."""
    from pyggml.alloc.ctx_tensors import alloc_ctx_tensors_from_buft
    from pyggml.backends.cpu.device import cpu_device
    from pyggml.core.context import Context
    from pyggml.core.types import GGMLType
    from pyggml.ggml_backend.registry import dev_extra_bufts
    from pyggml.ggml_backend.tensor_io import tensor_set

    (buft,) = dev_extra_bufts(cpu_device())
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    w = ctx.new_tensor_2d(GGMLType.Q4_0, k, raw.shape[0])
    w.set_name("w")
    f = ctx.new_tensor_1d(GGMLType.F32, 8) if extra_f32 else None
    buffer = alloc_ctx_tensors_from_buft(ctx, buft)
    tensor_set(w, raw.reshape(-1))
    return ctx, buffer, w, f


def test_the_registry_lists_cpu_repack_and_the_cpu_computes_with_it() -> None:
    from pyggml.backends.cpu.backend import cpu_init
    from pyggml.backends.cpu.device import cpu_device
    from pyggml.ggml_backend.registry import dev_extra_bufts

    (buft,) = dev_extra_bufts(cpu_device())
    assert buft.name() == "CPU_REPACK"
    assert not buft.is_host()  # as ggml's: other devices do not read it in place
    assert cpu_device().supports_buft(buft)
    with cpu_init() as backend:
        assert backend.supports_buft(buft)


def test_a_repacked_matrix_reads_back_as_its_q4_0_bytes_and_is_written_whole() -> None:
    from pyggml.backends.cpu.buffer import host_bytes
    from pyggml.ggml_backend.tensor_io import tensor_get, tensor_set

    rng = np.random.default_rng(2)
    raw = _q4_0_rows(rng, 2 * X8_ROWS, NB)
    ctx, buffer, w, f = _weights_in_repack_buffer(raw, K, extra_f32=True)
    try:
        assert w.extra is REPACKED_Q4_0 and f is not None and f.extra is None
        assert np.array_equal(host_bytes(w, "test"), repack_q4_0(raw).reshape(-1))  # held repacked
        back = np.zeros(raw.size, np.uint8)
        tensor_get(w, back)
        assert np.array_equal(back, raw.reshape(-1))
        with pytest.raises(GGMLError, match=r"'w' \(held repacked\) at offset 18 of 36 bytes"):
            tensor_set(w, np.zeros(36, np.uint8), 18, 36)
        with pytest.raises(GGMLError, match="read and written whole"):
            tensor_get(w, np.zeros(18, np.uint8), 0, 18)
        tensor_get(w, back)
        assert np.array_equal(back, raw.reshape(-1))  # untouched by the refused calls
        tensor_set(f, np.arange(8, dtype=np.float32))  # other tensors are held as in a CPU buffer
        assert np.array_equal(f.numpy().reshape(-1), np.arange(8, dtype=np.float32))
    finally:
        buffer.free()
        ctx.free()


@pytest.mark.parametrize("n_threads", [1, 2])
def test_mul_mat_of_a_repacked_matrix_is_the_repack_order_for_any_batch(n_threads: int) -> None:
    from pyggml.backends.cpu.backend import cpu_init, cpu_set_n_threads
    from pyggml.backends.cpu.kernels import matmul

    rng = np.random.default_rng(3)
    M = 64 * X8_ROWS  # enough work for the threads (matmul.PARALLEL_MIN_WORK)
    raw = _q4_0_rows(rng, M, NB)
    ctx, buffer, w, _ = _weights_in_repack_buffer(raw, K)
    try:
        with cpu_init() as backend:
            cpu_set_n_threads(backend, n_threads)
            for n in (1, 5, matmul.BLAS_MIN_COLS + 4):  # a token, a few, a prompt (no BLAS path)
                x = (rng.standard_normal((n, K)) * 3).astype(np.float32)
                yq, yd = np.zeros((n, K), np.int8), np.zeros((n, NB), np.float32)
                quantize_src1.quantize_rows(kinds.Q8_0, x, yq, yd, np.zeros_like(yd), np.zeros((n, K // 16), np.int32),
                                            quantize_src1.ROUND_X86)
                want = np.zeros((n, M), np.float32)
                _reference(raw, yq, yd, want)
                assert np.array_equal(backend_mul_mat(backend, w, x).view(np.uint32), want.view(np.uint32)), n
    finally:
        buffer.free()
        ctx.free()


def test_other_ops_on_a_repacked_matrix_are_refused() -> None:
    from pyggml.backends.cpu.backend import cpu_init
    from pyggml.backends.cpu.device import cpu_device
    from pyggml.core.context import Context
    from pyggml.core.errors import UnsupportedOpError
    from pyggml.core.types import GGMLType

    raw = _q4_0_rows(np.random.default_rng(4), X8_ROWS, NB)
    ctx, buffer, w, _ = _weights_in_repack_buffer(raw, K)
    try:
        c2 = Context(mem_size=1 << 20)
        ids = c2.new_tensor_1d(GGMLType.I32, 2)
        ids.numpy()[0, 0, 0] = [0, 1]
        rows = c2.get_rows(w, ids)
        half = c2.mul_mat(w, c2.new_tensor_2d(GGMLType.F16, K, 1))
        assert not cpu_device().supports_op(rows) and not cpu_device().supports_op(half)
        assert cpu_device().supports_op(c2.mul_mat(w, c2.new_tensor_2d(GGMLType.F32, K, 1)))
        g = c2.new_graph()
        g.build_forward_expand(rows)
        with cpu_init() as backend, pytest.raises(UnsupportedOpError, match="does not support op GET_ROWS"):
            backend.graph_compute(g)
        c2.free()
    finally:
        buffer.free()
        ctx.free()


@pytest.mark.parametrize(("type_name", "rows", "held"), [("Q4_0", 16, True), ("Q4_0", 12, False), ("Q8_0", 16, False)])
def test_weight_buft_supported_asks_the_device(type_name: str, rows: int, held: bool) -> None:
    from pyggml.backends.cpu.device import cpu_device
    from pyggml.core.context import Context
    from pyggml.core.types import GGMLType
    from pyggml.ggml_backend.registry import dev_extra_bufts
    from pyggml.gguf.loader import weight_buft_supported

    ctx = Context(mem_size=1 << 16, no_alloc=True)
    weight = ctx.new_tensor_2d(GGMLType[type_name], K, rows)
    (buft,) = dev_extra_bufts(cpu_device())
    assert weight_buft_supported(cpu_device(), buft, weight) is held
    assert weight.buffer is None and weight.extra is None  # the question leaves the weight as it was
    ctx.free()
