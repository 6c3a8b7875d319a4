"""The testing BLAS backend: memory of its own, MUL_MAT only."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.backends import testing_blas
from pyggml.backends.testing_blas import TestingBLASBackend
from pyggml.core import memory
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError, GGMLError, UnsupportedOpError
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import tensor_copy, tensor_get_numpy, tensor_set_numpy


def alloc_all(backend, *tensors):
    buffer = backend.alloc_buffer(sum(t.nbytes() + 64 for t in tensors))
    talloc = TensorAllocator.new_from_buffer(buffer)
    for t in tensors:
        talloc.alloc(t)
    return buffer


def test_memory_is_not_host_memory(blas: TestingBLASBackend) -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    t = ctx.new_tensor_2d(GGMLType.F32, 4, 3).set_name("t")
    buffer = alloc_all(blas, t)
    assert not buffer.is_host() and blas.n_alloc_buffer == 1
    assert buffer.get_base() % blas.get_alignment() == 0
    assert memory.find(t.data, t.nbytes()) is None
    with pytest.raises(GGMLError):
        t.numpy()  # no host pointer behind it
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor_set_numpy(t, values)
    np.testing.assert_array_equal(tensor_get_numpy(t), values)
    other = testing_blas.testing_blas_init("other")
    assert other.alloc_buffer(16).get_base() != buffer.get_base()  # address ranges of their own


def test_mul_mat_like_ggml(blas: TestingBLASBackend, rng: np.random.Generator) -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a32 = ctx.new_tensor_3d(GGMLType.F32, 5, 3, 1).set_name("a32")  # broadcast over dim 2
    a16 = ctx.new_tensor_2d(GGMLType.F16, 5, 3).set_name("a16")
    b = ctx.new_tensor_3d(GGMLType.F32, 5, 2, 2).set_name("b")
    c32 = ctx.mul_mat(a32, b).set_name("c32")
    c16 = ctx.mul_mat(a16, b).set_name("c16")
    g = ctx.new_graph()
    g.build_forward_expand(c32)
    g.build_forward_expand(c16)
    alloc_all(blas, a32, a16, b, c32, c16)
    A = rng.standard_normal((1, 3, 5)).astype(np.float32)
    A16 = rng.standard_normal((3, 5)).astype(np.float16)
    B = rng.standard_normal((2, 2, 5)).astype(np.float32)
    tensor_set_numpy(a32, A)
    tensor_set_numpy(a16, A16)
    tensor_set_numpy(b, B)
    blas.graph_compute(g)
    np.testing.assert_allclose(tensor_get_numpy(c32), B @ A[0].T, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(tensor_get_numpy(c16), B @ A16.astype(np.float32).T, rtol=1e-6, atol=1e-6)
    assert blas.computed == ["c32", "c16"] and blas.n_graph_compute == 1


def test_supports_only_contiguous_float_mul_mat(blas: TestingBLASBackend) -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_2d(GGMLType.F32, 32, 4)
    b = ctx.new_tensor_2d(GGMLType.F32, 32, 3)
    q = ctx.new_tensor_2d(GGMLType.Q8_0, 32, 4)
    assert blas.supports_op(ctx.mul_mat(a, b))
    assert not blas.supports_op(ctx.mul_mat(q, b))
    assert not blas.supports_op(ctx.mul_mat(ctx.cont(ctx.transpose(a)), ctx.transpose(ctx.new_tensor_2d(
        GGMLType.F32, 3, 4))))  # a transposed src1 is not contiguous
    add = ctx.add(a, a)
    assert not blas.supports_op(add)
    g = ctx.new_graph()
    g.build_forward_expand(add)
    alloc_all(blas, a, add)
    with pytest.raises(UnsupportedOpError, match="does not support op ADD"):
        blas.graph_compute(g)


def test_copies_cross_the_memory_boundary(blas: TestingBLASBackend, cpu_a) -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    h = ctx.new_tensor_1d(GGMLType.F32, 6).set_name("h")
    d = ctx.new_tensor_1d(GGMLType.F32, 6).set_name("d")
    back = ctx.new_tensor_1d(GGMLType.F32, 6).set_name("back")
    alloc_all(cpu_a, h, back)
    alloc_all(blas, d)
    tensor_set_numpy(h, np.arange(6, dtype=np.float32))
    tensor_copy(h, d)  # CPU -> own memory (the CPU's cpy_tensor_to sets it)
    tensor_copy(d, back)  # own memory -> CPU (the CPU's cpy_tensor_from gets it)
    np.testing.assert_array_equal(tensor_get_numpy(back), np.arange(6, dtype=np.float32))

    m = ctx.mul_mat(h, h).set_name("m")
    g = ctx.new_graph()
    g.build_forward_expand(m)
    alloc_all(blas, m)
    with pytest.raises(ArgumentError, match="'h' is in buffer 'CPU', not in this backend's memory"):
        blas.graph_compute(g)
