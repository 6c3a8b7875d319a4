"""Context: the pool's accounting as ggml's, arena memory for no_alloc=False, lookups, graphs' pool use."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.core.context import GGML_MEM_ALIGN, Context, tensor_overhead
from pyggml.core.errors import ArgumentError, ContextFullError, NotAllocatedError
from pyggml.core.graph import graph_overhead
from pyggml.core.types import GGMLType

F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32


def test_tensor_overhead_is_ggml_object_plus_tensor() -> None:
    assert tensor_overhead() == 32 + 336
    assert tensor_overhead() % GGML_MEM_ALIGN == 0


@pytest.mark.parametrize("n", [1, 3, 10])
def test_no_alloc_context_holds_exactly_n_tensors(n: int) -> None:
    ctx = Context(mem_size=n * tensor_overhead(), no_alloc=True)
    ts = [ctx.new_tensor_2d(F32, 4096, 4096) for _ in range(n)]  # data size does not count without alloc
    assert all(t.data is None for t in ts)
    assert ctx.used_mem() == n * tensor_overhead()
    with pytest.raises(ContextFullError) as e:
        ctx.new_tensor_1d(F32, 1)
    msg = str(e.value)
    assert f"needed {tensor_overhead()} bytes" in msg
    assert f"available 0 of {n * tensor_overhead()}" in msg
    assert len(ctx.tensors) == n  # nothing half-done
    assert ctx.used_mem() == n * tensor_overhead()


def test_views_take_a_tensor_object_each() -> None:
    ctx = Context(mem_size=3 * tensor_overhead(), no_alloc=True)
    a = ctx.new_tensor_2d(F32, 4, 4)
    ctx.transpose(a)
    ctx.view_1d(a, 4, 0)
    with pytest.raises(ContextFullError):
        ctx.reshape_1d(a, 16)


def test_alloc_context_pads_each_tensor_like_ggml_new_object() -> None:
    # 3 elements of f32 = 12 bytes of data, padded to 16
    per_tensor = tensor_overhead() + 16
    ctx = Context(mem_size=3 * per_tensor)
    for _ in range(3):
        ctx.new_tensor_1d(F32, 3)
    assert ctx.used_mem() == 3 * per_tensor
    with pytest.raises(ContextFullError, match=rf"needed {per_tensor} bytes, available 0 of {3 * per_tensor}"):
        ctx.new_tensor_1d(F32, 1)


def test_alloc_context_tensors_are_writable_distinct_and_aligned() -> None:
    ctx = Context(mem_size=1 << 20)
    shapes = [(F32, [5, 3]), (F16, [7]), (I32, [2, 2, 2]), (F32, [1]), (F32, [33, 2])]
    ts = [ctx.new_tensor(t, ne) for t, ne in shapes]
    for i, t in enumerate(ts):
        assert t.data is not None
        assert t.data % GGML_MEM_ALIGN == 0
        t.numpy()[...] = i + 1
    for i, t in enumerate(ts):  # no tensor's writes reached another
        assert np.all(t.numpy() == i + 1)
    spans = sorted((t.data, t.data + t.nbytes()) for t in ts)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert end <= start
    assert ts[0].numpy().shape == (1, 1, 3, 5)  # reversed ne


def test_alloc_context_over_a_caller_buffer() -> None:
    buf = np.zeros(8192, dtype=np.uint8)
    ctx = Context(mem_size=4096, mem_buffer=buf)
    t = ctx.new_tensor_1d(F32, 4)
    t.numpy()[...] = [1, 2, 3, 4]
    start = t.data - buf.__array_interface__["data"][0]
    assert np.array_equal(buf[start: start + 16].view(np.float32), [1, 2, 3, 4])


def test_alloc_context_over_a_misaligned_caller_buffer_keeps_data_aligned() -> None:
    buf = np.zeros(4096, dtype=np.uint8)[3:]
    ctx = Context(mem_size=2048, mem_buffer=buf)
    t = ctx.new_tensor_1d(F32, 4)
    assert t.data % GGML_MEM_ALIGN == 0
    base = buf.__array_interface__["data"][0]
    assert base <= t.data and t.data + t.nbytes() <= base + 2048


def test_caller_buffer_too_small_raises() -> None:
    with pytest.raises(ArgumentError, match="mem_buffer holds 100 bytes, mem_size asks 200"):
        Context(mem_size=200, mem_buffer=np.zeros(100, np.uint8))


def test_negative_mem_size_raises() -> None:
    with pytest.raises(ArgumentError):
        Context(mem_size=-1)


def test_new_i32_f32_hold_their_value() -> None:
    ctx = Context(mem_size=1 << 12)
    assert ctx.new_i32(-7).numpy().reshape(-1)[0] == -7
    assert ctx.new_f32(2.5).numpy().reshape(-1)[0] == np.float32(2.5)


def test_no_alloc_tensor_has_no_numpy_view() -> None:
    ctx = Context(mem_size=1 << 12, no_alloc=True)
    t = ctx.new_tensor_1d(F32, 4).set_name("w")
    with pytest.raises(NotAllocatedError, match="'w' has no memory"):
        t.numpy()


def test_views_share_memory_in_an_alloc_context() -> None:
    ctx = Context(mem_size=1 << 16)
    a = ctx.new_tensor_2d(F32, 4, 3)
    a.numpy()[...] = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    t = ctx.transpose(a)
    assert np.array_equal(t.numpy()[0, 0], np.arange(12).reshape(3, 4).T)
    v = ctx.view_1d(a, 2, 5 * 4)
    v.numpy()[...] = -1
    assert a.numpy().reshape(-1)[5] == -1 and a.numpy().reshape(-1)[6] == -1


def test_bad_dimensions_raise() -> None:
    ctx = Context(mem_size=1 << 12, no_alloc=True)
    with pytest.raises(ArgumentError, match=r"new_tensor_2d: ne\[1\] must be >= 0, got -1"):
        ctx.new_tensor_2d(F32, 4, -1)
    with pytest.raises(ArgumentError, match="1 to 4 dimensions, got 5"):
        ctx.new_tensor(F32, [1, 1, 1, 1, 1])
    assert ctx.used_mem() == 0


def test_get_tensor_and_iteration() -> None:
    ctx = Context(mem_size=1 << 14, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 4).set_name("a")
    b = ctx.new_tensor_1d(F32, 4).set_name("b")
    assert ctx.get_tensor("b") is b
    assert ctx.get_tensor("nope") is None
    assert ctx.get_first_tensor() is a
    assert ctx.get_next_tensor(a) is b
    assert ctx.get_next_tensor(b) is None
    assert list(ctx) == [a, b]


def test_max_tensor_size_and_no_alloc_switch() -> None:
    ctx = Context(mem_size=1 << 14, no_alloc=True)
    ctx.new_tensor_2d(F32, 8, 8)
    ctx.new_tensor_1d(F32, 3)
    assert ctx.get_max_tensor_size() == 256
    assert ctx.get_no_alloc()
    ctx.set_no_alloc(False)
    assert not ctx.get_no_alloc()


def test_graphs_take_their_overhead_from_the_pool() -> None:
    ctx = Context(mem_size=graph_overhead() + graph_overhead(64), no_alloc=True)
    ctx.new_graph()
    ctx.new_graph(64)
    assert ctx.used_mem() == graph_overhead() + graph_overhead(64)
    with pytest.raises(ContextFullError, match="a graph"):
        ctx.new_graph(8)


def test_graph_overhead_is_ggmls() -> None:
    # object header 32 + pad16(struct 96 + 2 * 2048 pointers + ggml_hash_size(4096) = 4099 int32 use counts
    # and pointer keys (aligned to 8) + ceil(4099 / 32) bitset words)
    assert graph_overhead() == 32 + 82576  # 96 + 32768 + 16396 + 4 + 32792 + 516 = 82572, padded to 82576
    # with grads: + 2 * 131 pointers; 96 + 1024 + 524 + 4 + 1048 + 2096 + 20 = 4812, padded to 4816
    assert graph_overhead(64, True) == 32 + 4816


def test_free_drops_memory_and_tensors() -> None:
    ctx = Context(mem_size=1 << 12)
    t = ctx.new_tensor_1d(F32, 4)
    with ctx:
        pass
    assert t.data is None
    assert list(ctx) == []
