"""tensor_set / tensor_get / tensor_copy and the numpy forms: data paths and every error path.

Each error test also checks that no byte of the buffer (or of the caller's output) moved.
"""

from __future__ import annotations

import array

import numpy as np
import pytest

from pyggml.backends.cpu import CPUBuffer, cpu_init
from pyggml.backends.cpu.buffer import cpu_alloc_buffer
from pyggml.core.context import Context
from pyggml.core.errors import (
    ArgumentError,
    BufferFreedError,
    GGMLError,
    LayoutError,
    NotAllocatedError,
    OutOfBoundsError,
    ShapeError,
)
from pyggml.core.tensor import Tensor
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import (
    Backend,
    get_backend,
    tensor_copy,
    tensor_get,
    tensor_get_async,
    tensor_get_numpy,
    tensor_set,
    tensor_set_async,
    tensor_set_numpy,
)
from pyggml.testing import alloc_ctx_tensors

F32, F16, BF16, Q8_0, I32 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.I32


def setup(*specs: tuple[str, GGMLType, list[int]]) -> tuple[Context, CPUBuffer, dict[str, Tensor]]:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    ts = {name: ctx.new_tensor(type, ne).set_name(name) for name, type, ne in specs}
    buf = alloc_ctx_tensors(ctx, cpu_init())
    assert isinstance(buf, CPUBuffer)
    return ctx, buf, ts


def snapshot(buf: CPUBuffer) -> bytes:
    assert buf.array is not None
    return buf.array.tobytes()


def test_set_get_roundtrip_with_every_buffer_kind() -> None:
    _, buf, ts = setup(("w", F32, [6]))
    w = ts["w"]
    values = np.arange(6, dtype=np.float32)
    for data in (values, values.tobytes(), bytearray(values.tobytes()), memoryview(values.tobytes()),
                 array.array("f", values.tolist())):
        tensor_set(w, np.zeros(6, np.float32))
        tensor_set(w, data)
        out = np.empty(6, np.float32)
        tensor_get(w, out)
        np.testing.assert_array_equal(out, values)
    outb = bytearray(24)
    tensor_get(w, outb)
    assert bytes(outb) == values.tobytes()


def test_set_get_with_offset_and_size() -> None:
    _, buf, ts = setup(("w", F32, [8]))
    w = ts["w"]
    tensor_set(w, np.zeros(8, np.float32))
    tensor_set(w, np.array([7, 8, 9], np.float32), 8, 8)  # only the first two floats, at element 2
    got = np.empty(8, np.float32)
    tensor_get(w, got)
    np.testing.assert_array_equal(got, [0, 0, 7, 8, 0, 0, 0, 0])
    part = np.zeros(3, np.float32)
    tensor_get(w, part, 8, 8)
    np.testing.assert_array_equal(part, [7, 8, 0])
    rest = np.zeros(6, np.float32)
    tensor_get(w, rest, 8)  # size defaults to the rest of the tensor
    np.testing.assert_array_equal(rest, [7, 8, 0, 0, 0, 0])


def test_non_contiguous_source_data_is_taken_in_element_order() -> None:
    _, buf, ts = setup(("w", F32, [4]))
    src = np.arange(8, dtype=np.float32)[::2]
    tensor_set(ts["w"], src)
    np.testing.assert_array_equal(tensor_get_numpy(ts["w"]), [0, 2, 4, 6])


def test_async_forms_move_the_same_bytes() -> None:
    _, buf, ts = setup(("w", F32, [4]))
    tensor_set_async(ts["w"], np.array([1, 2, 3, 4], np.float32))
    get_backend(ts["w"]).synchronize()
    out = np.zeros(4, np.float32)
    tensor_get_async(ts["w"], out, 4, 8)
    np.testing.assert_array_equal(out[:2], [2, 3])
    with pytest.raises(OutOfBoundsError):
        tensor_set_async(ts["w"], np.zeros(5, np.float32))


def test_set_out_of_bounds_raises_and_changes_nothing() -> None:
    _, buf, ts = setup(("a", F32, [4]), ("w", F32, [20]), ("z", F32, [4]))
    w = ts["w"]
    tensor_set(w, np.arange(20, dtype=np.float32))
    before = snapshot(buf)
    with pytest.raises(OutOfBoundsError) as e:
        tensor_set(w, np.ones(16, np.float32), 32, 64)
    assert "64 bytes at offset 32" in str(e.value) and "'w' (80 bytes)" in str(e.value)
    with pytest.raises(OutOfBoundsError):
        tensor_set(w, np.ones(21, np.float32))
    with pytest.raises(ArgumentError):
        tensor_set(w, np.ones(1, np.float32), -4)
    assert snapshot(buf) == before


def test_get_out_of_bounds_raises_and_leaves_the_output_alone() -> None:
    _, buf, ts = setup(("w", F32, [4]))
    tensor_set(ts["w"], np.arange(4, dtype=np.float32))
    before = snapshot(buf)
    out = np.full(8, -1, np.float32)
    with pytest.raises(OutOfBoundsError) as e:
        tensor_get(ts["w"], out, 8, 16)
    assert "read of 16 bytes at offset 8" in str(e.value)
    np.testing.assert_array_equal(out, -1)
    assert snapshot(buf) == before


def test_data_too_small_and_output_too_small() -> None:
    _, buf, ts = setup(("w", F32, [8]))
    before = snapshot(buf)
    with pytest.raises(OutOfBoundsError, match="holds only 8 bytes"):
        tensor_set(ts["w"], np.ones(2, np.float32), 0, 32)
    out = np.full(2, -1, np.float32)
    with pytest.raises(OutOfBoundsError, match="output of only 8 bytes"):
        tensor_get(ts["w"], out)
    np.testing.assert_array_equal(out, -1)
    assert snapshot(buf) == before


def test_read_only_or_strided_output_is_rejected() -> None:
    _, buf, ts = setup(("w", F32, [4]))
    with pytest.raises(ArgumentError, match="read-only"):
        tensor_get(ts["w"], b"\0" * 16)
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ArgumentError, match="read-only"):
        tensor_get(ts["w"], ro)
    with pytest.raises(ArgumentError, match="C-contiguous"):
        tensor_get(ts["w"], np.zeros(8, np.float32)[::2])
    with pytest.raises(ArgumentError, match="buffer protocol"):
        tensor_set(ts["w"], [1.0, 2.0])  # type: ignore[arg-type]


def test_unallocated_tensor_raises() -> None:
    ctx, buf, ts = setup(("w", F32, [4]))
    before = snapshot(buf)
    loose = ctx.new_tensor_1d(F32, 4).set_name("loose")
    with pytest.raises(NotAllocatedError, match="'loose' is not allocated"):
        tensor_set(loose, np.ones(4, np.float32))
    with pytest.raises(NotAllocatedError):
        tensor_get(loose, np.zeros(4, np.float32))
    with pytest.raises(NotAllocatedError):
        tensor_get_numpy(loose)
    assert snapshot(buf) == before
    assert get_backend(loose) is None


def test_context_memory_tensor_has_no_backend() -> None:
    ctx = Context(mem_size=1 << 16, no_alloc=False)
    t = ctx.new_tensor_1d(F32, 4).set_name("host")
    t.numpy()[...] = 3
    with pytest.raises(NotAllocatedError, match="not in a backend buffer"):
        tensor_set(t, np.zeros(4, np.float32))
    np.testing.assert_array_equal(t.numpy().ravel(), 3)


def test_freed_buffer_raises_and_memory_is_untouched() -> None:
    _, buf, ts = setup(("w", F32, [4]))
    tensor_set(ts["w"], np.arange(4, dtype=np.float32))
    mem = buf.array
    assert mem is not None
    before = mem.tobytes()
    buf.free()
    with pytest.raises(BufferFreedError, match="freed"):
        tensor_set(ts["w"], np.ones(4, np.float32))
    out = np.full(4, -1, np.float32)
    with pytest.raises(BufferFreedError):
        tensor_get(ts["w"], out)
    np.testing.assert_array_equal(out, -1)
    assert mem.tobytes() == before
    buf.free()  # twice is harmless


def test_freed_backend_raises() -> None:
    _, buf, ts = setup(("w", F32, [4]))
    backend = get_backend(ts["w"])
    assert backend is not None
    backend.free()
    with pytest.raises(BufferFreedError, match="backend 'CPU'"):
        tensor_set(ts["w"], np.ones(4, np.float32))


def test_copy_between_different_layouts_raises_and_changes_nothing() -> None:
    ctx, buf, ts = setup(("a", F32, [4, 3]), ("b", F32, [3, 4]), ("h", F16, [4, 3]))
    tensor_set(ts["a"], np.arange(12, dtype=np.float32))
    before = snapshot(buf)
    with pytest.raises(LayoutError) as e:
        tensor_copy(ts["a"], ts["b"])
    assert "'a' F32 ne=[4, 3, 1, 1]" in str(e.value) and "'b' F32 ne=[3, 4, 1, 1]" in str(e.value)
    with pytest.raises(LayoutError):
        tensor_copy(ts["a"], ts["h"])
    at = ctx.transpose(ts["a"])  # same ne as b after transpose, different nb
    with pytest.raises(LayoutError):
        tensor_copy(at, ts["b"])
    assert snapshot(buf) == before


def test_copy_between_two_cpu_backends() -> None:
    _, buf1, t1 = setup(("a", F32, [5]))
    _, buf2, t2 = setup(("a", F32, [5]))
    assert get_backend(t1["a"]) is not get_backend(t2["a"])
    tensor_set(t1["a"], np.arange(5, dtype=np.float32))
    tensor_copy(t1["a"], t2["a"])
    np.testing.assert_array_equal(tensor_get_numpy(t2["a"]), np.arange(5))
    tensor_copy(t2["a"], t2["a"])  # src is dst: nothing to do


class HostBackend(Backend):
    """A host-memory backend without cpy hooks: copies between two of them go through host memory."""

    def __init__(self, label: str, log: list[str]) -> None:
        super().__init__()
        self.label = label
        self.log = log
        self._cpu = cpu_init()

    def _get_name(self) -> str:
        return self.label

    def _alloc_buffer(self, size: int) -> CPUBuffer:
        return cpu_alloc_buffer(self, size)

    def _get_alignment(self) -> int:
        return 64

    def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        self.log.append(f"{self.label}.set")
        self._cpu._set_tensor_async(tensor, data, offset, size)

    def _get_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        self.log.append(f"{self.label}.get")
        self._cpu._get_tensor_async(tensor, data, offset, size)

    def _synchronize(self) -> None:
        self.log.append(f"{self.label}.sync")

    def _supports_op(self, op: Tensor) -> bool:
        return False


def test_copy_falls_back_to_host_memory_and_prefers_cpy_from() -> None:
    log: list[str] = []
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 3).set_name("a")
    b = ctx.new_tensor_1d(F32, 3).set_name("b")
    c = ctx.new_tensor_1d(F32, 3).set_name("c")
    for t, label in ((a, "A"), (b, "B")):
        sub = Context(mem_size=1 << 12, no_alloc=True)
        sub.tensors.append(t)
        alloc_ctx_tensors(sub, HostBackend(label, log))
    sub = Context(mem_size=1 << 12, no_alloc=True)
    sub.tensors.append(c)
    alloc_ctx_tensors(sub, cpu_init())
    tensor_set(a, np.array([1, 2, 3], np.float32))
    log.clear()
    tensor_copy(a, b)
    assert log == ["A.get", "A.sync", "B.set", "B.sync"]
    np.testing.assert_array_equal(tensor_get_numpy(b), [1, 2, 3])
    # to a CPU tensor: CPU's cpy_tensor_from reads src straight into dst's memory
    log.clear()
    tensor_copy(a, c)
    assert log == ["A.get", "A.sync"]
    np.testing.assert_array_equal(tensor_get_numpy(c), [1, 2, 3])
    # from a CPU tensor: the CPU backend's cpy_tensor_to writes into dst through its backend
    tensor_set(c, np.array([4, 5, 6], np.float32))
    log.clear()
    tensor_copy(c, b)
    assert log == ["B.set", "B.sync"]
    np.testing.assert_array_equal(tensor_get_numpy(b), [4, 5, 6])


def test_get_backend_resolves_views_through_view_src() -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_2d(F32, 4, 3).set_name("a")
    buf = alloc_ctx_tensors(ctx, cpu_init())
    v = ctx.view_1d(a, 4, 16).set_name("row1")  # made after allocation: data set, buffer not
    assert v.buffer is None and v.data == a.data + 16
    assert get_backend(v) is buf.backend
    tensor_set(a, np.arange(12, dtype=np.float32))
    np.testing.assert_array_equal(tensor_get_numpy(v), [4, 5, 6, 7])
    tensor_set(v, np.zeros(4, np.float32))
    np.testing.assert_array_equal(tensor_get_numpy(a)[1], 0)


def test_get_numpy_shapes_and_dtypes() -> None:
    ctx, buf, ts = setup(("m", F32, [4, 3]), ("v", F32, [5]), ("h", F16, [2, 1, 3]), ("q", Q8_0, [64, 2]),
                         ("i", I32, [3]))
    tensor_set(ts["m"], np.arange(12, dtype=np.float32))
    m = tensor_get_numpy(ts["m"])
    assert m.shape == (3, 4) and m.dtype == np.float32
    np.testing.assert_array_equal(m, np.arange(12).reshape(3, 4))
    assert tensor_get_numpy(ts["v"]).shape == (5,)
    h = tensor_get_numpy(ts["h"])
    assert h.shape == (3, 1, 2) and h.dtype == np.float16
    q = tensor_get_numpy(ts["q"])
    assert q.shape == (2, 68) and q.dtype == np.uint8  # two blocks of 34 bytes per row
    assert tensor_get_numpy(ts["i"]).dtype == np.int32
    # a copy: changing it does not change the tensor
    m[...] = -1
    assert tensor_get_numpy(ts["m"])[0, 0] == 0


def test_get_numpy_of_a_transposed_view_is_in_element_order() -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_2d(F32, 4, 3).set_name("a")
    at = ctx.transpose(a).set_name("at")
    alloc_ctx_tensors(ctx, cpu_init())
    vals = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor_set(a, vals)
    got = tensor_get_numpy(at)
    assert got.shape == (4, 3) and got.flags.c_contiguous
    np.testing.assert_array_equal(got, vals.T)


def test_set_numpy_converts_to_the_tensor_type() -> None:
    _, buf, ts = setup(("h", F16, [3, 2]), ("b", BF16, [4]), ("i", I32, [3]))
    vals = np.array([[0.5, 1.25, -2], [3, 4, 1e-3]], np.float64)
    tensor_set_numpy(ts["h"], vals)
    np.testing.assert_array_equal(tensor_get_numpy(ts["h"]), vals.astype(np.float16))
    tensor_set_numpy(ts["b"], np.array([1.0, -2.0, 1.00390625, np.nan], np.float32))
    bits = tensor_get_numpy(ts["b"])
    assert bits.dtype == np.uint16
    assert bits[0] == 0x3F80 and bits[1] == 0xC000
    assert bits[2] == 0x3F80  # 1 + 2^-8 is halfway: rounds to even
    assert (bits[3] & 0x7F80) == 0x7F80 and (bits[3] & 0x7F) != 0  # NaN stays NaN
    tensor_set_numpy(ts["i"], [7, 8, 9])
    np.testing.assert_array_equal(tensor_get_numpy(ts["i"]), [7, 8, 9])
    before = snapshot(buf)
    with pytest.raises(ShapeError, match="'h' holds 6 elements"):
        tensor_set_numpy(ts["h"], np.zeros(5))
    assert snapshot(buf) == before


def test_set_numpy_through_a_strided_view_keeps_the_gaps() -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_2d(F32, 4, 3).set_name("a")
    col = ctx.view_2d(a, 1, 3, a.nb[1], 8).set_name("col2")  # column 2: strided
    alloc_ctx_tensors(ctx, cpu_init())
    tensor_set(a, np.zeros(12, np.float32))
    tensor_set_numpy(col, [1, 2, 3])
    want = np.zeros((3, 4), np.float32)
    want[:, 2] = [1, 2, 3]
    np.testing.assert_array_equal(tensor_get_numpy(a), want)
    np.testing.assert_array_equal(tensor_get_numpy(col).ravel(), [1, 2, 3])


def test_errors_are_ggml_errors() -> None:
    for cls in (OutOfBoundsError, NotAllocatedError, BufferFreedError, LayoutError, ArgumentError):
        assert issubclass(cls, GGMLError)
