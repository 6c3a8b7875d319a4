"""The torch backend: names and registry, buffers, set/get, copies with CPU buffers, threads, errors."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest
import torch

from pyggml.backends.cpu import cpu_init
from pyggml.backends.torch import (
    TORCH_ALIGNMENT,
    TorchBackend,
    TorchBuffer,
    is_torch,
    torch_init,
    torch_set_n_threads,
)
from pyggml.core import memory
from pyggml.core.context import Context
from pyggml.core.errors import (
    ArgumentError,
    BufferFreedError,
    GGMLError,
    GraphError,
    LayoutError,
    NotAllocatedError,
    OutOfBoundsError,
    UnsupportedOpError,
)
from pyggml.core.tensor import Tensor
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import (
    get_backend,
    init_backend,
    tensor_copy,
    tensor_get,
    tensor_get_async,
    tensor_get_numpy,
    tensor_set,
    tensor_set_async,
    tensor_set_numpy,
)
from pyggml.testing import alloc_ctx_tensors

F32, F16, BF16, I32, Q8_0 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.Q8_0


def _tensors(backend: object, *specs: tuple[str, GGMLType, list[int]]) -> tuple[Context, object, list[Tensor]]:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    ts = [ctx.new_tensor(type, ne).set_name(name) for name, type, ne in specs]
    buf = alloc_ctx_tensors(ctx, backend)  # type: ignore[arg-type]
    return ctx, buf, ts


# --- names, registry, device ---


def test_name_alignment_and_registry_names() -> None:
    b = torch_init()
    assert b.name() == "Torch(cpu)" and b.get_alignment() == TORCH_ALIGNMENT == 256
    assert is_torch(b) and not is_torch(cpu_init()) and not is_torch(None)
    for name in ("torch", "TORCH", "torch:cpu"):
        got = init_backend(name)
        assert isinstance(got, TorchBackend) and got.name() == "Torch(cpu)"


@pytest.mark.slow
def test_registry_imports_torch_only_when_asked() -> None:
    code = ("import sys; from pyggml.ggml_backend import init_backend, list_backends; "
            "assert 'torch' in list_backends() and 'torch' not in sys.modules; "
            "init_backend('cpu'); assert 'torch' not in sys.modules; "
            "print(init_backend('torch').name(), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["Torch(cpu)", "True"]


@pytest.mark.parametrize("name, why", [("torch:cuda:0", "CUDA is not available"), ("torch:nonsense", "not a torch"),
                                       ("torch:meta", "not supported")])
def test_unusable_devices_raise_argument_error(name: str, why: str) -> None:
    if name.startswith("torch:cuda") and torch.cuda.is_available():
        assert init_backend(name).name() == "Torch(cuda:0)"  # usable where there is a GPU
        return
    with pytest.raises(ArgumentError, match=why):
        init_backend(name)


def test_bad_arguments() -> None:
    with pytest.raises(ArgumentError, match="n_threads"):
        torch_init(n_threads=0)
    with pytest.raises(ArgumentError, match="matmul_precision 'int8' is not a matmul precision"):
        torch_init(matmul_precision="int8")
    with pytest.raises(ArgumentError, match="not a torch backend"):
        torch_set_n_threads(cpu_init(), 2)
    with pytest.raises(ArgumentError, match="n_threads"):
        torch_set_n_threads(torch_init(), 0)


# --- buffers ---


@pytest.mark.parametrize("size", [0, 1, 255, 256, 1000, 4096 + 7])
@pytest.mark.slow
def test_buffer_is_an_aligned_torch_tensor_and_not_host(size: int) -> None:
    with torch_init() as b, b.alloc_buffer(size) as buf:
        assert isinstance(buf, TorchBuffer)
        base = buf.get_base()
        assert base % TORCH_ALIGNMENT == 0 and buf.get_size() == size
        assert buf.raw is not None and buf.raw.dtype == torch.uint8 and buf.raw.device.type == "cpu"
        storage = buf.raw.untyped_storage()
        assert storage.data_ptr() <= base and base + size <= storage.data_ptr() + storage.nbytes()
        assert not buf.is_host() and not memory.is_host_address(base)
        assert buf.get_alignment() == 256


def test_tensor_views_share_the_buffer_memory() -> None:
    b = torch_init()
    ctx, buf, (a, q) = _tensors(b, ("a", F32, [4, 3]), ("q", Q8_0, [64, 2]))
    va = buf.tensor_view(a)
    assert va.shape == (1, 1, 3, 4) and va.dtype == torch.float32
    assert va.data_ptr() == a.data
    tensor_set_numpy(a, np.arange(12, dtype=np.float32).reshape(3, 4))
    assert torch.equal(va[0, 0], torch.arange(12, dtype=torch.float32).view(3, 4))
    t = ctx.transpose(a)
    t.data, t.buffer = a.data, buf
    assert torch.equal(buf.tensor_view(t)[0, 0], va[0, 0].t())
    vq = buf.tensor_view(q)
    assert vq.dtype == torch.uint8 and vq.shape == (1, 1, 2, 68)


def test_misaligned_views_raise_layout_error() -> None:
    b = torch_init()
    _, buf, (a,) = _tensors(b, ("a", F32, [8]))
    with pytest.raises(LayoutError, match="not aligned"):
        buf.view(a.data + 2, F32, [2, 1, 1, 1], [4, 8, 8, 8], "odd")
    with pytest.raises(OutOfBoundsError, match="outside"):
        buf.view(a.data + buf.size, F32, [2, 1, 1, 1], [4, 8, 8, 8], "past")


def test_free_buffer_then_use_raises() -> None:
    b = torch_init()
    _, buf, (a,) = _tensors(b, ("a", F32, [8]))
    buf.free()
    assert buf.raw is None
    with pytest.raises(BufferFreedError):
        tensor_set(a, np.zeros(8, np.float32))
    with pytest.raises(BufferFreedError):
        buf.get_base()
    buf.free()  # twice is harmless


# --- set / get ---


def test_set_get_round_trip_with_offsets() -> None:
    b = torch_init()
    _, buf, (a,) = _tensors(b, ("a", F32, [16]))
    values = np.arange(16, dtype=np.float32)
    tensor_set(a, values)
    assert np.array_equal(tensor_get_numpy(a), values)
    tensor_set(a, np.float32([100, 101]).tobytes(), offset=8)  # bytes objects are read-only: still fine
    out = np.zeros(4, np.float32)
    tensor_get(a, out, offset=4, size=16)
    assert out.tolist() == [1, 100, 101, 4]
    tensor_set_async(a, np.full(16, 7, np.float32))
    got = np.empty(16, np.float32)
    tensor_get_async(a, got)
    b.synchronize()
    assert (got == 7).all()
    assert buf.generation == 3


def test_set_get_numpy_types() -> None:
    b = torch_init()
    _, _, (h, bf, i) = _tensors(b, ("h", F16, [5, 2]), ("bf", BF16, [3]), ("i", I32, [4]))
    hv = np.linspace(-2, 2, 10, dtype=np.float32).reshape(2, 5)
    tensor_set_numpy(h, hv)
    assert np.array_equal(tensor_get_numpy(h), hv.astype(np.float16))
    tensor_set_numpy(bf, [1.0, -2.5, 3.0])
    assert tensor_get_numpy(bf).tolist() == [0x3F80, 0xC020, 0x4040]
    tensor_set_numpy(i, [1, -2, 3, 2**31 - 1])
    assert tensor_get_numpy(i).tolist() == [1, -2, 3, 2**31 - 1]


def test_set_get_errors_name_the_tensor() -> None:
    b = torch_init()
    _, _, (a,) = _tensors(b, ("weights", F32, [4]))
    with pytest.raises(OutOfBoundsError, match="'weights'"):
        tensor_set(a, np.zeros(5, np.float32))
    with pytest.raises(OutOfBoundsError, match="'weights'"):
        tensor_get(a, np.zeros(8, np.float32), offset=8, size=16)
    ctx = Context(mem_size=1 << 12, no_alloc=True)
    loose = ctx.new_tensor_1d(F32, 4).set_name("loose")
    with pytest.raises(NotAllocatedError, match="'loose'"):
        tensor_set(loose, np.zeros(4, np.float32))


# --- copies with CPU buffers and between torch buffers ---


def test_copies_between_torch_and_cpu_buffers_are_direct(caplog: pytest.LogCaptureFixture) -> None:
    tb, cb = torch_init(), cpu_init(1)
    _, tbuf, (t1, t2) = _tensors(tb, ("t1", F32, [6, 2]), ("t2", F32, [6, 2]))
    _, _, (c1,) = _tensors(cb, ("c1", F32, [6, 2]))
    values = np.arange(12, dtype=np.float32).reshape(2, 6)
    tensor_set_numpy(c1, values)
    with caplog.at_level(logging.DEBUG, logger="pyggml.ggml_backend"):
        tensor_copy(c1, t1)  # CPU -> torch: the torch backend's cpy_tensor_from
        assert np.array_equal(tensor_get_numpy(t1), values)
        tensor_copy(t1, t2)  # torch -> torch
        assert np.array_equal(tensor_get_numpy(t2), values)
        tensor_set_numpy(t2, -values)
        tensor_copy(t2, c1)  # torch -> CPU
        assert np.array_equal(c1.numpy().reshape(2, 6), -values)
    assert "going through host memory" not in caplog.text
    # the hooks themselves handle host memory (no fallback through tensor_get/tensor_set)
    tensor_set_numpy(c1, values * 3)
    assert tb._cpy_tensor_from(c1, t1) and np.array_equal(tensor_get_numpy(t1), values * 3)
    tensor_set_numpy(t1, values * 5)
    assert tb._cpy_tensor_to(t1, c1) and np.array_equal(c1.numpy().reshape(2, 6), values * 5)
    assert get_backend(t1) is tb and get_backend(c1) is cb


def test_copy_between_two_torch_backends() -> None:
    b1, b2 = torch_init(), torch_init()
    _, _, (x,) = _tensors(b1, ("x", F16, [8]))
    _, buf2, (y,) = _tensors(b2, ("y", F16, [8]))
    tensor_set_numpy(x, np.arange(8))
    gen = buf2.generation
    tensor_copy(x, y)
    assert tensor_get_numpy(y).tolist() == list(range(8)) and buf2.generation == gen + 1


def test_copy_to_an_unknown_buffer_kind_is_not_handled() -> None:
    """A buffer that is neither host memory nor torch's: the hooks decline (the caller goes through host)."""
    from pyggml.ggml_backend.buffer import BufferInterface, buffer_init

    tb = torch_init()
    _, _, (t,) = _tensors(tb, ("t", F32, [4]))
    ctx = Context(mem_size=1 << 12, no_alloc=True)
    other = ctx.new_tensor_1d(F32, 4).set_name("other")
    foreign = buffer_init(cpu_init(), BufferInterface(get_base=lambda buf: 0x1000), None, 64)
    other.data, other.buffer = 0x1000, foreign
    assert tb._cpy_tensor_from(other, t) is False
    assert tb._cpy_tensor_to(t, other) is False


# --- compute errors, threads ---


def test_graph_with_a_cpu_tensor_raises_before_computing() -> None:
    tb, cb = torch_init(), cpu_init(1)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 4).set_name("a")
    out = ctx.scale(a, 2.0).set_name("out")
    alloc_ctx_tensors(ctx, cb)
    g = ctx.new_graph()
    g.build_forward_expand(out)
    with pytest.raises(ArgumentError, match="is in buffer 'CPU'"):
        tb.graph_compute(g)


def test_unsupported_op_raises_unsupported_op_error() -> None:
    tb = torch_init()
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_2d(F32, 4, 4).set_name("a")
    out = ctx.diag_mask_inf(a, 0).set_name("masked")
    alloc_ctx_tensors(ctx, tb)
    g = ctx.new_graph()
    g.build_forward_expand(out)
    assert not tb.supports_op(out)
    with pytest.raises(UnsupportedOpError, match="DIAG_MASK_INF"):
        tb.graph_compute(g)
    assert isinstance(UnsupportedOpError("x"), GGMLError)


def test_plans_compute_again_and_refuse_freed_things() -> None:
    tb = torch_init()
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 4).set_name("a")
    out = ctx.scale(a, 3.0).set_name("out")
    buf = alloc_ctx_tensors(ctx, tb)
    g = ctx.new_graph()
    g.build_forward_expand(out)
    plan = tb.graph_plan_create(g)
    for k in (1.0, 2.0):
        tensor_set_numpy(a, np.full(4, k, np.float32))
        tb.graph_plan_compute(plan)
        assert (tensor_get_numpy(out) == 3 * k).all()
    tb.graph_plan_free(plan)
    with pytest.raises(GraphError, match="freed"):
        tb.graph_plan_compute(plan)
    plan2 = tb.graph_plan_create(g)
    buf.free()
    with pytest.raises(BufferFreedError):
        tb.graph_plan_compute(plan2)
    tb.free()
    with pytest.raises(BufferFreedError, match="after it was freed"):
        tb.alloc_buffer(16)


def test_n_threads_is_applied_to_torch_when_computing() -> None:
    before = torch.get_num_threads()
    tb = torch_init()
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    out = ctx.scale(ctx.new_tensor_1d(F32, 4), 2.0)
    alloc_ctx_tensors(ctx, tb)
    g = ctx.new_graph()
    g.build_forward_expand(out)
    try:
        want = 1 if before != 1 else 2
        torch_set_n_threads(tb, want)
        tb.graph_compute(g)
        assert torch.get_num_threads() == want
        tb.set_n_threads(before)
        tb.graph_compute(g)
        assert torch.get_num_threads() == before and tb.n_threads == before
    finally:
        torch.set_num_threads(before)
