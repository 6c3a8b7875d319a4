"""The CPU backend: aligned buffers, caller memory, plans, threads, independence of instances."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pyggml.backends.cpu.backend as cpu_backend_module
from pyggml.backends.cpu import (
    TENSOR_ALIGNMENT,
    CPUBackend,
    CPUPlan,
    cpu_buffer_from_ptr,
    cpu_init,
    cpu_set_n_threads,
    graph_compute_with_ctx,
    is_cpu,
)
from pyggml.backends.cpu.kernels import KERNELS
from pyggml.core import memory
from pyggml.core.context import Context
from pyggml.core.errors import (
    ArgumentError,
    BufferFreedError,
    GraphError,
    OutOfBoundsError,
    UnsupportedOpError,
)
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp, Tensor, UnaryOp
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import Backend, get_backend, tensor_get, tensor_get_numpy, tensor_set
from pyggml.testing import alloc_ctx_tensors

F32 = GGMLType.F32


def test_name_alignment_and_is_cpu() -> None:
    b = cpu_init()
    assert b.name() == "CPU" and b.get_alignment() == TENSOR_ALIGNMENT == 64
    assert is_cpu(b) and not is_cpu(None)


@pytest.mark.parametrize("size", [0, 1, 63, 64, 1000, 4096 + 7])
def test_buffer_base_is_aligned_and_holds_size_bytes(size: int) -> None:
    with cpu_init() as b, b.alloc_buffer(size) as buf:
        base = buf.get_base()
        assert base % TENSOR_ALIGNMENT == 0
        assert buf.get_size() == size and buf.is_host()
        if size:
            found = memory.find(base, size)
            assert found is not None and found[0].nbytes >= size
            assert memory.find(base + size, 1) is None or memory.find(base + size, 1)[0] is not found[0]


def test_free_unregisters_the_memory() -> None:
    buf = cpu_init().alloc_buffer(256)
    base = buf.get_base()
    assert memory.is_host_address(base, 256)
    buf.free()
    assert not memory.is_host_address(base, 256)


def test_buffer_from_ptr_shares_the_callers_array_and_never_releases_it() -> None:
    backend = cpu_init()
    owner = np.zeros(16, dtype=np.float32)
    buf = cpu_buffer_from_ptr(backend, owner, owner.nbytes)
    assert buf.get_base() == owner.__array_interface__["data"][0]
    assert buf.get_size() == 64
    ctx = Context(mem_size=1 << 16, no_alloc=True)
    t = ctx.new_tensor_1d(F32, 8).set_name("t")
    t.data = buf.get_base() + 16
    t.buffer = buf
    owner[4:12] = np.arange(8)
    np.testing.assert_array_equal(tensor_get_numpy(t), np.arange(8))  # sees the caller's writes
    tensor_set(t, np.full(8, 5, np.float32))
    np.testing.assert_array_equal(owner[4:12], 5)  # writes land in the caller's array
    np.testing.assert_array_equal(owner[:4], 0)
    buf.free()
    owner[0] = 42  # still the caller's, still usable
    assert owner[0] == 42 and np.all(owner[4:12] == 5)
    with pytest.raises(BufferFreedError):
        tensor_get(t, np.zeros(8, np.float32))


def test_buffer_from_ptr_over_bytearray_and_address() -> None:
    backend = cpu_init()
    raw = bytearray(32)
    buf = cpu_buffer_from_ptr(backend, raw, 32)
    ctx = Context(mem_size=1 << 16, no_alloc=True)
    t = ctx.new_tensor_1d(GGMLType.I32, 2).set_name("t")
    t.data, t.buffer = buf.get_base() + 8, buf
    tensor_set(t, np.array([1, 2], np.int32))
    assert bytes(raw[8:16]) == np.array([1, 2], np.int32).tobytes()
    buf.free()

    # an address inside memory that is already registered (a Context's arena)
    host = Context(mem_size=1 << 16, no_alloc=False)
    h = host.new_tensor_1d(F32, 4).set_name("h")
    h.numpy()[...] = 3
    buf2 = cpu_buffer_from_ptr(backend, h.data, h.nbytes())
    v = ctx.new_tensor_1d(F32, 4).set_name("v")
    v.data, v.buffer = buf2.get_base(), buf2
    np.testing.assert_array_equal(tensor_get_numpy(v), 3)
    buf2.free()
    assert memory.is_host_address(h.data, 16)  # the arena is not unregistered


def test_buffer_from_ptr_rejects_bad_memory() -> None:
    backend = cpu_init()
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ArgumentError, match="read-only"):
        cpu_buffer_from_ptr(backend, ro, 16)
    with pytest.raises(ArgumentError, match="read-only"):
        cpu_buffer_from_ptr(backend, b"1234", 4)
    with pytest.raises(OutOfBoundsError, match="larger than the memory given"):
        cpu_buffer_from_ptr(backend, np.zeros(4, np.float32), 17)
    with pytest.raises(OutOfBoundsError, match="not inside any registered host memory"):
        cpu_buffer_from_ptr(backend, 0x10, 16)


def chain_graph(backend: CPUBackend, n: int = 3) -> tuple[Graph, Tensor, Tensor, Tensor]:
    """x -> (x + y) * y ... n times, then NEG."""
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    x = ctx.new_tensor_2d(F32, 3, 2).set_name("x")
    y = ctx.new_tensor_2d(F32, 3, 1).set_name("y")  # broadcast over rows
    t = x
    for i in range(n):
        t = ctx.mul(ctx.add(t, y), y).set_name(f"t{i}")
    out = ctx.unary(t, UnaryOp.NEG).set_name("out")
    g = ctx.new_graph()
    g.build_forward_expand(out)
    alloc_ctx_tensors(ctx, backend)
    return g, x, y, out


def chain_ref(x: np.ndarray, y: np.ndarray, n: int = 3) -> np.ndarray:
    t = x
    for _ in range(n):
        t = (t + y) * y
    return -t


def test_plan_reuse_and_inputs_changed_between_computes() -> None:
    backend = cpu_init()
    g, x, y, out = chain_graph(backend)
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    yv = np.array([[1, 2, 0.5]], np.float32)
    tensor_set(x, xv)
    tensor_set(y, yv)
    plan = backend.graph_plan_create(g)
    assert isinstance(plan, CPUPlan)
    assert len(plan.computes) == g.n_nodes  # no view nodes here: one compute each
    backend.graph_plan_compute(plan)
    first = tensor_get_numpy(out)
    np.testing.assert_allclose(first, chain_ref(xv, yv), rtol=1e-6)
    tensor_set(out, np.zeros(6, np.float32))
    backend.graph_plan_compute(plan)
    np.testing.assert_array_equal(tensor_get_numpy(out), first)
    xv2 = xv * -2 + 1
    tensor_set(x, xv2)
    backend.graph_plan_compute(plan)
    np.testing.assert_allclose(tensor_get_numpy(out), chain_ref(xv2, yv), rtol=1e-6)
    backend.graph_plan_free(plan)
    with pytest.raises(GraphError, match="freed"):
        backend.graph_plan_compute(plan)


def test_plan_skips_view_nodes_and_reads_through_them() -> None:
    backend = cpu_init()
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_2d(F32, 3, 2).set_name("a")
    at = ctx.transpose(a).set_name("at")
    r = ctx.cont(at).set_name("r")
    out = ctx.scale(r, 2.0).set_name("out")
    g = ctx.new_graph()
    g.build_forward_expand(out)
    alloc_ctx_tensors(ctx, backend)
    assert [n.op for n in g.nodes] == [GGMLOp.TRANSPOSE, GGMLOp.CONT, GGMLOp.SCALE]
    av = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor_set(a, av)
    plan = backend.graph_plan_create(g)
    assert len(plan.computes) == 2
    backend.graph_plan_compute(plan)
    np.testing.assert_array_equal(tensor_get_numpy(out), 2 * av.T)


def test_plan_compute_after_buffer_free_raises() -> None:
    backend = cpu_init()
    g, x, y, out = chain_graph(backend)
    plan = backend.graph_plan_create(g)
    buf = out.buffer
    buf.free()
    with pytest.raises(BufferFreedError, match="used by the plan was freed"):
        backend.graph_plan_compute(plan)


def test_inplace_op() -> None:
    backend = cpu_init()
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 4).set_name("a")
    b = ctx.new_tensor_1d(F32, 4).set_name("b")
    c = ctx.add_inplace(a, b).set_name("c")
    g = ctx.new_graph()
    g.build_forward_expand(c)
    alloc_ctx_tensors(ctx, backend)
    assert c.data == a.data
    tensor_set(a, np.arange(4, dtype=np.float32))
    tensor_set(b, np.full(4, 10, np.float32))
    backend.graph_compute(g)
    np.testing.assert_array_equal(tensor_get_numpy(a), np.arange(4) + 10)


def test_two_cpu_backends_are_independent() -> None:
    b1, b2 = cpu_init(), cpu_init()
    cpu_set_n_threads(b1, 1)
    cpu_set_n_threads(b2, 2)
    g1, x1, y1, out1 = chain_graph(b1)
    g2, x2, y2, out2 = chain_graph(b2)
    assert get_backend(out1) is b1 and get_backend(out2) is b2
    assert b1.work is not b2.work
    tensor_set(x1, np.ones(6, np.float32))
    tensor_set(y1, np.ones(3, np.float32))
    tensor_set(x2, np.full(6, 2, np.float32))
    tensor_set(y2, np.full(3, 3, np.float32))
    p1, p2 = b1.graph_plan_create(g1), b2.graph_plan_create(g2)
    assert p1.params.n_threads == 1 and p2.params.n_threads == 2
    b1.graph_plan_compute(p1)
    b2.graph_plan_compute(p2)
    np.testing.assert_allclose(tensor_get_numpy(out1), chain_ref(np.ones((2, 3)), np.ones((1, 3))))
    np.testing.assert_allclose(tensor_get_numpy(out2), chain_ref(np.full((2, 3), 2), np.full((1, 3), 3)))
    b1.free()
    with pytest.raises(BufferFreedError):
        b1.graph_plan_compute(p1)
    b2.graph_plan_compute(p2)  # the other one is unaffected
    assert b2.n_threads == 2


def test_n_threads_default_and_validation() -> None:
    import os

    b = cpu_init()
    assert b.n_threads == (os.cpu_count() or 1)
    with pytest.raises(ArgumentError, match=">= 1"):
        cpu_set_n_threads(b, 0)

    class Other(Backend):
        def _get_name(self) -> str:
            return "Other"

    with pytest.raises(ArgumentError, match="'Other' is not the CPU backend"):
        cpu_set_n_threads(Other(), 2)
    with pytest.raises(ArgumentError, match="not the CPU backend"):
        cpu_buffer_from_ptr(Other(), np.zeros(4), 8)


def test_blas_threads_are_set_where_they_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each compute makes every BLAS library run on one thread of its own (the kernels' threads share the BLAS
    work), setting it only where it differs: a count changed behind pyggml's back (another model, another
    package) is set again."""

    class FakeBlas:
        def __init__(self, n: int) -> None:
            self.n, self.sets = n, []

        @property
        def num_threads(self) -> int:
            return self.n

        def set_num_threads(self, n: int) -> None:
            self.sets.append(n)
            self.n = n

    libs = [FakeBlas(4), FakeBlas(1)]
    monkeypatch.setattr(cpu_backend_module, "_blas_libs", libs)
    backend = cpu_init()
    g, x, y, out = chain_graph(backend)
    for n_threads in (1, 2):
        cpu_set_n_threads(backend, n_threads)
        plan = backend.graph_plan_create(g)
        for _ in range(3):
            backend.graph_plan_compute(plan)
        backend.graph_compute(g)
    assert [lib.sets for lib in libs] == [[1], []]
    libs[0].n = 3  # changed by someone else
    backend.graph_compute(g)
    assert [lib.sets for lib in libs] == [[1, 1], []]


def test_blas_threads_reach_numpys_blas() -> None:
    """The real libraries: after a compute with n threads, the BLAS numpy was loaded with (the libraries
    loaded at the backend's first compute; a later one, say another package's, is not numpy's) reports 1."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    backend = cpu_init()
    g, x, y, out = chain_graph(backend)
    backend.graph_compute(g)
    libs = {lib.filepath for lib in cpu_backend_module._blas_controllers()}
    assert libs, "numpy's BLAS was not found"
    for n in (1, 2, 1):
        threadpoolctl.threadpool_limits(limits=3, user_api="blas")  # someone else's setting
        cpu_set_n_threads(backend, n)
        backend.graph_compute(g)
        assert {i["num_threads"] for i in threadpoolctl.threadpool_info() if i["filepath"] in libs} == {1}


def test_graph_compute_keeps_a_reusable_work_area() -> None:
    backend = cpu_init()
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 64).set_name("a")
    out = ctx.unary(a, UnaryOp.GELU).set_name("out")  # GELU works in scratch
    g = ctx.new_graph()
    g.build_forward_expand(out)
    alloc_ctx_tensors(ctx, backend)
    tensor_set(a, np.linspace(-3, 3, 64, dtype=np.float32))
    backend.graph_compute(g)
    work = backend.work
    backend.graph_compute(g)
    assert backend.work is work  # the same area, not a new one per compute
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    np.testing.assert_allclose(tensor_get_numpy(out), 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3))),
                               rtol=2e-3, atol=1e-3)


def test_graph_compute_with_ctx_on_context_memory() -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=False)
    a = ctx.new_tensor_1d(F32, 5).set_name("a")
    b = ctx.new_tensor_1d(F32, 5).set_name("b")
    c = ctx.mul(a, b).set_name("c")
    g = ctx.new_graph()
    g.build_forward_expand(c)
    a.numpy()[...] = np.arange(5)
    b.numpy()[...] = 3
    graph_compute_with_ctx(ctx, g, 2)
    np.testing.assert_array_equal(c.numpy().ravel(), np.arange(5) * 3)
    with pytest.raises(ArgumentError):
        graph_compute_with_ctx(ctx, g, 0)


def test_supports_op() -> None:
    backend = cpu_init()
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 4)
    assert backend.supports_op(ctx.add(a, a))
    assert backend.supports_op(ctx.transpose(ctx.new_tensor_2d(F32, 2, 2)))  # views: nothing to compute
    odd = ctx.new_tensor_1d(F32, 4)
    odd.op = GGMLOp.FLASH_ATTN_BACK  # no kernel
    odd.src[0] = a
    assert not backend.supports_op(odd)
    q = ctx.new_tensor_1d(GGMLType.Q8_0, 32)
    assert not backend.supports_op(ctx.add(q, q))  # the ADD kernel takes F32/F16 only
    g = ctx.new_graph()
    g.build_forward_expand(odd)
    alloc_ctx_tensors(ctx, backend)
    with pytest.raises(UnsupportedOpError, match="FLASH_ATTN_BACK"):
        backend.graph_compute(g)


def test_mul_mat_when_its_kernel_is_there() -> None:
    """MUL_MAT through the backend: computed if the kernel exists, else refused before running."""
    backend = cpu_init()
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    w = ctx.new_tensor_2d(F32, 8, 3).set_name("w")  # K=8, M=3
    x = ctx.new_tensor_2d(F32, 8, 2).set_name("x")  # K=8, N=2
    y = ctx.mul_mat(w, x).set_name("y")
    g = ctx.new_graph()
    g.build_forward_expand(y)
    alloc_ctx_tensors(ctx, backend)
    rng = np.random.default_rng(0)
    wv = rng.standard_normal((3, 8)).astype(np.float32)
    xv = rng.standard_normal((2, 8)).astype(np.float32)
    tensor_set(w, wv)
    tensor_set(x, xv)
    tensor_set(y, np.full(6, 7, np.float32))
    if GGMLOp.MUL_MAT not in KERNELS:
        with pytest.raises(UnsupportedOpError, match="MUL_MAT"):
            backend.graph_compute(g)
        np.testing.assert_array_equal(tensor_get_numpy(y), 7)
        return
    backend.graph_compute(g)
    np.testing.assert_allclose(tensor_get_numpy(y), xv @ wv.T, rtol=1e-5, atol=1e-5)


def test_default_threads_are_the_physical_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp's rule: the distinct thread-sibling sets (two hyperthreads of a core count once); without
    them the logical CPUs, halved above 4. The backend's default is that count."""
    for cpu, siblings in enumerate(["00000011", "00000011", "0000000c", "0000000c", "00000010"]):
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings").write_text(siblings + "\n")
    assert cpu_backend_module.physical_cores(str(tmp_path)) == 3
    empty = tmp_path / "none"
    empty.mkdir()
    for logical, want in ((1, 1), (3, 3), (4, 4), (8, 4), (None, 4)):
        monkeypatch.setattr(cpu_backend_module.os, "cpu_count", lambda n=logical: n)
        assert cpu_backend_module.physical_cores(str(empty)) == want
    monkeypatch.setattr(cpu_backend_module, "physical_cores", lambda: 3)
    assert cpu_init().n_threads == 3
