"""TensorAllocator decisions checked offset by offset against the seed's algorithm."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml import Context, GGMLError, GGMLType
from pyggml.alloc import TensorAllocator, aligned_offset
from pyggml.backends.cpu import cpu_init
from pyggml.core.errors import LimitExceededError, OutOfMemoryError
from pyggml.ggml_backend.tensor_io import tensor_get, tensor_set


def f32(ctx: Context, n: int, name: str):
    t = ctx.new_tensor_1d(GGMLType.F32, n)
    t.set_name(name)
    return t


@pytest.fixture
def ctx() -> Context:
    return Context(mem_size=1 << 20, no_alloc=True)


def test_aligned_offset() -> None:
    assert aligned_offset(None, 0, 32) == 0
    assert aligned_offset(None, 1, 32) == 32
    assert aligned_offset(0x1004, 0, 32) == 28
    with pytest.raises(GGMLError):
        aligned_offset(None, 3, 24)


def test_measure_base_and_max_size(ctx: Context) -> None:
    talloc = TensorAllocator.new_measure(32)
    assert talloc.is_measure()
    a, b = f32(ctx, 10, "a"), f32(ctx, 8, "b")  # 40 -> 64 bytes, 32 bytes
    talloc.alloc(a)
    talloc.alloc(b)
    # the fake base 0x1000 is 32-aligned, so the first tensor sits at the base itself
    assert a.data == 0x1000
    assert b.data == 0x1000 + 64
    assert talloc.get_max_size() == 96


def test_best_fit_prefers_smallest_block_and_keeps_the_tail(ctx: Context) -> None:
    talloc = TensorAllocator.new_measure(32)
    ts = [f32(ctx, n, f"t{i}") for i, n in enumerate([64, 8, 32, 8, 16, 8])]  # 256, 32, 128, 32, 64, 32 bytes
    for t in ts:
        talloc.alloc(t)
    base = talloc.base
    assert [t.data - base for t in ts] == [0, 256, 288, 416, 448, 512]
    # free t0 (256 bytes at 0), t2 (128 at 288) and t4 (64 at 448): three holes plus the tail at 544
    for i in (0, 2, 4):
        talloc.free_tensor(ts[i])
    assert [(b.addr - base, b.size) for b in talloc.free_blocks[:3]] == [(0, 256), (288, 128), (448, 64)]
    # 64 bytes fit best in the 64-byte hole, 100 bytes in the 128-byte hole
    c = f32(ctx, 16, "c")
    talloc.alloc(c)
    assert c.data - base == 448
    d = f32(ctx, 25, "d")  # 100 -> 128 bytes
    talloc.alloc(d)
    assert d.data - base == 288
    # 512 bytes fit no hole: the tail is the last resort
    e = f32(ctx, 128, "e")
    talloc.alloc(e)
    assert e.data - base == 544
    assert talloc.get_max_size() == 544 + 512


def test_equal_blocks_pick_the_later_one(ctx: Context) -> None:
    # the seed's `block->size <= best_fit_size` prefers the later of two equal blocks
    talloc = TensorAllocator.new_measure(32)
    ts = [f32(ctx, 8, f"t{i}") for i in range(4)]
    for t in ts:
        talloc.alloc(t)
    talloc.free_tensor(ts[0])
    talloc.free_tensor(ts[2])
    x = f32(ctx, 8, "x")
    talloc.alloc(x)
    assert x.data - talloc.base == 64


def test_free_merges_with_previous_and_next(ctx: Context) -> None:
    talloc = TensorAllocator.new_measure(32)
    ts = [f32(ctx, 8, f"t{i}") for i in range(4)]
    for t in ts:
        talloc.alloc(t)
    base = talloc.base
    talloc.free_tensor(ts[0])
    talloc.free_tensor(ts[2])
    assert [(b.addr - base, b.size) for b in talloc.free_blocks[:2]] == [(0, 32), (64, 32)]
    assert talloc.free_blocks[2].addr - base == 128
    # t1 ends where block 2 starts and starts where block 1 ends: all three merge
    talloc.free_tensor(ts[1])
    assert [(b.addr - base, b.size) for b in talloc.free_blocks][0] == (0, 96)
    assert talloc.n_free_blocks == 2
    # t3 joins the head block and the tail: one block again
    talloc.free_tensor(ts[3])
    assert talloc.n_free_blocks == 1
    assert talloc.free_blocks[0].addr == base


def test_real_buffer_full_and_errors_leave_it_usable(ctx: Context) -> None:
    backend = cpu_init()
    talloc = TensorAllocator.new_from_backend(backend, 256)
    a = f32(ctx, 32, "a")  # 128 bytes
    talloc.alloc(a)
    big = f32(ctx, 64, "big")  # 256 bytes
    with pytest.raises(OutOfMemoryError, match=r"'big'.*needed 256 bytes, largest free block 128"):
        talloc.alloc(big)
    with pytest.raises(GGMLError, match="'a'"):
        talloc.alloc(a)  # already allocated
    v = ctx.view_1d(a, 4, 0)
    v.set_name("v")
    with pytest.raises(GGMLError, match="view 'v'"):
        talloc.alloc(v)
    # still usable: the rest of the buffer takes a second 128-byte tensor, whose memory is real
    b = f32(ctx, 32, "b")
    talloc.alloc(b)
    assert b.buffer is talloc.get_buffer()
    tensor_set(b, np.arange(32, dtype=np.float32))
    out = np.zeros(32, dtype=np.float32)
    tensor_get(b, out)
    assert np.array_equal(out, np.arange(32))
    assert b.data - talloc.base == 128
    talloc.free()


def test_too_many_free_blocks_is_an_error_and_changes_nothing(ctx: Context) -> None:
    talloc = TensorAllocator.new_measure(32, max_free_blocks=2)
    ts = [f32(ctx, 8, f"t{i}") for i in range(5)]
    for t in ts:
        talloc.alloc(t)
    talloc.free_tensor(ts[0])  # blocks: hole at 0, tail
    before = talloc.snapshot()
    with pytest.raises(LimitExceededError, match=r"'t2'.*MAX_FREE_BLOCKS = 2"):
        talloc.free_tensor(ts[2])
    assert talloc.snapshot() == before
    talloc.free_tensor(ts[1])  # merges, no new block
    assert talloc.n_free_blocks == 2


def test_reset_keeps_max_size(ctx: Context) -> None:
    talloc = TensorAllocator.new_measure(32)
    talloc.alloc(f32(ctx, 100, "a"))
    peak = talloc.get_max_size()
    talloc.reset()
    assert talloc.n_free_blocks == 1 and talloc.get_max_size() == peak
    b = f32(ctx, 1, "b")
    talloc.alloc(b)
    assert b.data == talloc.base
