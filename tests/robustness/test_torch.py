"""Bad-input catalog of the torch backend: options, buffers, set/get ranges, freed objects, compute.

Each case asserts the error class, that the message names the thing and the numbers, and that the
object still works afterwards (`assert_works`: the same backend, or a new one where the case freed it,
computes a MUL_MAT and a SCALE exactly; a failed set/get left the bytes as they were). The huge buffer
runs in a child process: if the check failed, torch would zero-fill pages the machine does not have.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest
import torch

from pyggml.backends.cpu import cpu_init
from pyggml.backends.torch import ENV_MATMUL_PRECISION, TorchBackend, torch_init, torch_set_n_threads
from pyggml.backends.torch.plan import plan_create
from pyggml.core.context import Context
from pyggml.core.errors import (
    ArgumentError,
    ArgumentTypeError,
    BufferFreedError,
    GGMLError,
    GraphError,
    LayoutError,
    NotAllocatedError,
    OutOfBoundsError,
    UnsupportedOpError,
    UnsupportedTypeError,
)
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor, UnaryOp
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import (
    init_backend,
    tensor_copy,
    tensor_get,
    tensor_get_numpy,
    tensor_set,
    tensor_set_numpy,
)
from pyggml.ggml_backend.buffer import Buffer
from pyggml.testing import alloc_ctx_tensors
from robustness.conftest import expect_error, run_isolated

F32, F16, I32, Q8_0 = GGMLType.F32, GGMLType.F16, GGMLType.I32, GGMLType.Q8_0
ALLOWED = "allowed: auto, f32, f16, bf16"


@pytest.fixture(autouse=True)
def _no_env_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_MATMUL_PRECISION, raising=False)


def _graph(*outs: Tensor) -> Graph:
    ctx = outs[0].ctx
    assert ctx is not None
    g = ctx.new_graph()
    for t in outs:
        g.build_forward_expand(t)
    return g


def assert_works(tb: TorchBackend) -> None:
    """`tb` allocates, sets, computes (an F16 MUL_MAT and a SCALE) and reads, with exact results."""
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    w = ctx.new_tensor_2d(F16, 4, 3).set_name("ok_w")
    x = ctx.new_tensor_2d(F32, 4, 2).set_name("ok_x")
    y = ctx.scale(ctx.mul_mat(w, x), 0.5)
    buf = alloc_ctx_tensors(ctx, tb)
    try:
        wv = np.arange(12, dtype=np.float32).reshape(3, 4)  # small integers: exact in every precision
        xv = np.array([[1, 0, 2, 1], [0, 1, 1, 3]], dtype=np.float32)
        tensor_set_numpy(w, wv)
        tensor_set_numpy(x, xv)
        g = ctx.new_graph()
        g.build_forward_expand(y)
        tb.graph_compute(g)
        assert np.array_equal(tensor_get_numpy(y), 0.5 * (xv @ wv.T))
    finally:
        buf.free()


@pytest.fixture
def tb() -> TorchBackend:
    return torch_init(matmul_precision="f32")


def _one(tb: TorchBackend, name: str = "a", n: int = 4,
         op: Callable[[Context, Tensor], Tensor] | None = None) -> tuple[Context, Buffer, Tensor, Tensor | None]:
    """An F32 tensor `name` of n elements holding 0, 1, ..., n-1 and `op` of it (if given), allocated
    together in one torch buffer of 256 bytes per tensor (the backend's alignment)."""
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    t = ctx.new_tensor_1d(F32, n).set_name(name)
    out = op(ctx, t).set_name(f"{name}_out") if op is not None else None
    buf = alloc_ctx_tensors(ctx, tb)
    assert buf.size == 256 * (1 if op is None else 2)
    tensor_set_numpy(t, np.arange(n))
    return ctx, buf, t, out


# --- options: (id, keyword arguments of torch_init, error class, fragments) ---

OPTION_CASES: list[tuple[str, dict[str, object], type[GGMLError], tuple[str, ...]]] = [
    ("precision-unknown", {"matmul_precision": "fp8"}, ArgumentError, ("matmul_precision 'fp8'", ALLOWED)),
    ("precision-empty", {"matmul_precision": ""}, ArgumentError, ("matmul_precision ''", ALLOWED)),
    ("precision-dtype-name", {"matmul_precision": "bfloat16"}, ArgumentError, ("'bfloat16'", ALLOWED)),
    ("precision-int", {"matmul_precision": 16}, ArgumentTypeError, ("matmul_precision", "must be a str", "int 16")),
    ("precision-bool", {"matmul_precision": True}, ArgumentTypeError, ("must be a str", "bool True")),
    ("precision-torch-dtype", {"matmul_precision": torch.bfloat16}, ArgumentTypeError,
     ("must be a str", "dtype torch.bfloat16")),
    ("precision-list", {"matmul_precision": ["f32"]}, ArgumentTypeError, ("must be a str", "list ['f32']")),
    ("n_threads-zero", {"n_threads": 0}, ArgumentError, ("n_threads must be >= 1, got 0",)),
    ("n_threads-negative", {"n_threads": -3}, ArgumentError, ("n_threads must be >= 1, got -3",)),
    ("n_threads-float", {"n_threads": 2.5}, ArgumentTypeError, ("n_threads must be an integer", "float 2.5")),
    ("n_threads-str", {"n_threads": "2"}, ArgumentTypeError, ("n_threads must be an integer", "str '2'")),
    ("cache-negative", {"weight_cache_bytes": -1}, ArgumentError, ("weight_cache_bytes must be >= 0, got -1",)),
    ("cache-float", {"weight_cache_bytes": 1.5e9}, ArgumentTypeError,
     ("weight_cache_bytes must be an integer", "float 1500000000.0")),
    ("device-float", {"device": 3.5}, ArgumentTypeError, ("device must be a str or device", "float 3.5")),
    ("device-unknown", {"device": "nonsense"}, ArgumentError, ("'nonsense' is not a torch device name",)),
    ("device-meta", {"device": "meta"}, ArgumentError, ("device type 'meta' is not supported (cpu, cuda)",)),
    ("spec-unknown-key", {"device": "cpu,precision=f32"}, ArgumentError,
     ("unknown option 'precision' in 'cpu,precision=f32'", "keys: matmul_precision")),
    ("spec-no-value", {"device": "cpu,bf16"}, ArgumentError, ("option 'bf16' in 'cpu,bf16' is not key=value",)),
    ("spec-bad-precision", {"device": "cpu,matmul_precision=f64"}, ArgumentError, ("'f64'", ALLOWED)),
    ("spec-and-argument", {"device": "cpu,matmul_precision=f16", "matmul_precision": "bf16"}, ArgumentError,
     ("both in the device spec ('f16') and as an argument ('bf16')",)),
]


@pytest.mark.parametrize("kwargs, cls, fragments", [c[1:] for c in OPTION_CASES], ids=[c[0] for c in OPTION_CASES])
def test_bad_options(kwargs: dict[str, object], cls: type[GGMLError], fragments: tuple[str, ...]) -> None:
    expect_error(lambda: torch_init(**kwargs), cls, *fragments)  # type: ignore[arg-type]
    assert_works(torch_init(matmul_precision="f32"))


def test_cuda_device_out_of_range() -> None:
    """Without CUDA: 'not available'; with it: the count of devices. Either way ArgumentError naming it."""
    want = (f"there are only {torch.cuda.device_count()} CUDA devices" if torch.cuda.is_available()
            else "CUDA is not available")
    expect_error(lambda: torch_init("cuda:99"), ArgumentError, "device 'cuda:99'", want)
    assert_works(torch_init())


@pytest.mark.parametrize("value", ["bf17", "f32 please", "0"])
def test_bad_environment_value(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_MATMUL_PRECISION, value)
    expect_error(torch_init, ArgumentError, f"{ENV_MATMUL_PRECISION} {value!r}", "is not a matmul precision", ALLOWED)
    expect_error(lambda: init_backend("torch"), ArgumentError, f"{ENV_MATMUL_PRECISION} {value!r}")
    assert_works(torch_init(matmul_precision="bf16"))  # an explicit value does not read the variable
    monkeypatch.setenv(ENV_MATMUL_PRECISION, "f16")
    assert torch_init().matmul_precision == "f16"


def test_registry_spec_errors_name_the_option() -> None:
    expect_error(lambda: init_backend("torch:cpu,matmul_precision=half"), ArgumentError, "'half'", ALLOWED)
    expect_error(lambda: init_backend("torch:cpu,threads=2"), ArgumentError, "unknown option 'threads'")
    good = init_backend("torch:cpu,matmul_precision=f16")
    assert isinstance(good, TorchBackend) and good.matmul_precision == "f16"
    assert_works(good)


@pytest.mark.parametrize("backend, n, cls, fragments", [
    ("torch", 0, ArgumentError, ("n_threads must be >= 1, got 0",)),
    ("torch", -2, ArgumentError, ("n_threads must be >= 1, got -2",)),
    ("torch", 1.5, ArgumentTypeError, ("n_threads must be an integer", "float 1.5")),
    ("cpu", 2, ArgumentError, ("backend 'CPU' is not a torch backend",)),
    ("int", 2, ArgumentError, ("int 42 is not a torch backend",)),
])
def test_set_n_threads_bad(tb: TorchBackend, backend: str, n: object, cls: type[GGMLError],
                           fragments: tuple[str, ...]) -> None:
    tb.n_threads = 1
    target = {"torch": tb, "cpu": cpu_init(1), "int": 42}[backend]
    expect_error(lambda: torch_set_n_threads(target, n), cls, *fragments)  # type: ignore[arg-type]
    assert tb.n_threads == 1  # unchanged by the failed call
    assert_works(tb)


# --- buffers ---


def test_negative_buffer_size(tb: TorchBackend) -> None:
    expect_error(lambda: tb.alloc_buffer(-1), ArgumentError, "'Torch(cpu)'", "-1 bytes")
    assert_works(tb)


@pytest.mark.slow
def test_buffer_larger_than_the_host_memory() -> None:
    """OutOfMemoryError with the bytes asked for and available, before torch touches a page."""
    proc = run_isolated("""
        from pyggml.backends.torch import torch_init
        from pyggml.core.errors import OutOfMemoryError
        tb = torch_init(matmul_precision="f32")
        for size in (1 << 50, 1 << 62):
            try:
                tb.alloc_buffer(size)
            except OutOfMemoryError as e:
                print(e)
        buf = tb.alloc_buffer(1 << 20)
        print("still works", buf.get_size())
    """)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3, proc.stdout
    for size, line in zip((1 << 50, 1 << 62), lines[:2], strict=True):
        assert re.fullmatch(rf"torch backend 'Torch\(cpu\)': buffer: cannot allocate {size} bytes \([\d.]+ GiB\) "
                            r"of host memory, \d+ bytes \([\d.]+ GiB\) available", line), line
    assert lines[2] == f"still works {1 << 20}"


def test_set_and_get_on_a_freed_buffer(tb: TorchBackend) -> None:
    _, buf, a, _ = _one(tb, "freed_a", 16)
    buf.free()
    expect_error(lambda: tensor_set(a, np.zeros(16, np.float32)), BufferFreedError, "'Torch(cpu)'", "(256 bytes)",
                 "after it was freed")
    expect_error(lambda: tensor_get(a, np.zeros(16, np.float32)), BufferFreedError, "(256 bytes)")
    expect_error(buf.get_base, BufferFreedError, "(256 bytes)")
    assert isinstance(buf, Buffer) and buf.freed
    buf.free()  # twice is harmless
    assert_works(tb)


def test_views_of_a_freed_buffer(tb: TorchBackend) -> None:
    """The buffer's torch views are gone with it: a view asked for afterwards is refused, not made."""
    _, buf, a, _ = _one(tb, "gone", 8)
    addr = a.data
    buf.free()
    assert addr is not None
    expect_error(lambda: buf.view(addr, F32, [8, 1, 1, 1], [4, 32, 32, 32], "gone"),  # type: ignore[attr-defined]
                 BufferFreedError, "(256 bytes)")
    assert_works(tb)


# --- set / get ranges: (id, call, error class, fragments) ---

RANGE_CASES: list[tuple[str, Callable[[Tensor], object], type[GGMLError], tuple[str, ...]]] = [
    ("set-past-end", lambda a: tensor_set(a, np.zeros(4, np.float32), offset=12), OutOfBoundsError,
     ("write of 16 bytes at offset 12", "'a' (16 bytes)")),
    ("set-too-long", lambda a: tensor_set(a, np.zeros(5, np.float32)), OutOfBoundsError,
     ("write of 20 bytes at offset 0", "'a' (16 bytes)")),
    ("set-negative-offset", lambda a: tensor_set(a, np.zeros(1, np.float32), offset=-4), ArgumentError,
     ("offset (-4)", "'a'")),
    ("set-size-past-data", lambda a: tensor_set(a, np.zeros(2, np.float32), size=12), OutOfBoundsError,
     ("write of 12 bytes to 'a'", "holds only 8 bytes")),
    ("get-past-end", lambda a: tensor_get(a, np.zeros(4, np.float32), offset=8, size=16), OutOfBoundsError,
     ("read of 16 bytes at offset 8", "'a' (16 bytes)")),
    ("get-negative-offset", lambda a: tensor_get(a, np.zeros(4, np.float32), offset=-8), ArgumentError,
     ("offset (-8)", "'a'")),
    ("get-small-output", lambda a: tensor_get(a, np.zeros(2, np.float32)), OutOfBoundsError,
     ("read of 16 bytes from 'a'", "output of only 8 bytes")),
    ("get-read-only-output", lambda a: tensor_get(a, bytes(16)), ArgumentError, ("read-only",)),
    ("copy-other-shape", lambda a: tensor_copy(a, _cpu_tensor(5)), LayoutError,
     ("different layouts", "'a' F32 ne=[4, 1, 1, 1]", "ne=[5, 1, 1, 1]")),
]


def _cpu_tensor(n: int) -> Tensor:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    t = ctx.new_tensor_1d(F32, n).set_name(f"cpu{n}")
    alloc_ctx_tensors(ctx, cpu_init(1))
    return t


@pytest.mark.parametrize("call, cls, fragments", [c[1:] for c in RANGE_CASES], ids=[c[0] for c in RANGE_CASES])
def test_set_get_ranges(tb: TorchBackend, call: Callable[[Tensor], object], cls: type[GGMLError],
                        fragments: tuple[str, ...]) -> None:
    _, buf, a, _ = _one(tb, "a", 4)
    generation = buf.generation  # type: ignore[attr-defined]
    expect_error(lambda: call(a), cls, *fragments)
    assert buf.generation == generation  # type: ignore[attr-defined]  # nothing was written
    assert tensor_get_numpy(a).tolist() == [0, 1, 2, 3]
    tensor_set(a, np.float32([7]), offset=12)
    assert tensor_get_numpy(a).tolist() == [0, 1, 2, 7]
    assert_works(tb)


@pytest.mark.parametrize("where, offset", [("past the end", 256 - 8), ("before the base", -256)])
def test_tensor_outside_its_torch_buffer(tb: TorchBackend, where: str, offset: int) -> None:
    """A tensor whose address lies partly outside its buffer (a corrupt view): set, get and compute refuse it
    (the torch buffer checks every range itself) and the buffer's bytes are untouched."""
    ctx, buf, a, _ = _one(tb, "inside", 4)
    b = ctx.new_tensor_1d(F32, 4).set_name("stray")
    b.data, b.buffer = buf.get_base() + offset, buf
    msg = (f"16 bytes of 'stray' at offset {offset} are outside its 256 bytes",)
    expect_error(lambda: tensor_set(b, np.ones(4, np.float32)), OutOfBoundsError, *msg)
    expect_error(lambda: tensor_get(b, np.zeros(4, np.float32)), OutOfBoundsError, *msg)
    out = ctx.scale(b, 2.0).set_name("out")
    out.data, out.buffer = a.data, buf  # computes into 'inside': must not happen
    expect_error(lambda: tb.graph_compute(_graph(out)), OutOfBoundsError, *msg)
    assert tensor_get_numpy(a).tolist() == [0, 1, 2, 3]
    assert_works(tb)


def test_misaligned_view(tb: TorchBackend) -> None:
    _, buf, a, _ = _one(tb, "aligned", 8)
    assert a.data is not None
    expect_error(lambda: buf.view(a.data + 2, F32, [2, 1, 1, 1], [4, 8, 8, 8], "odd"),  # type: ignore[attr-defined]
                 LayoutError, "tensor 'odd' (F32) at offset 2", "nb=[4, 8, 8, 8]", "4-byte elements")
    assert tensor_get_numpy(a).tolist() == list(range(8))
    assert_works(tb)


# --- freed backends and plans ---


def test_freed_backend() -> None:
    tb = torch_init(matmul_precision="f32")
    _, buf, a, out = _one(tb, "orphan", 4, lambda c, t: c.scale(t, 2.0))
    assert out is not None
    g = _graph(out)
    plan = tb.graph_plan_create(g)
    tb.free()
    for call in (lambda: tb.alloc_buffer(16), lambda: tb.graph_compute(g), lambda: tb.graph_plan_compute(plan),
                 lambda: tensor_set(a, np.zeros(4, np.float32)), tb.synchronize):
        expect_error(call, BufferFreedError, "backend 'Torch(cpu)' was used after it was freed")
    assert len(tb.weight_cache.entries) == 0
    tb.free()  # twice is harmless
    assert_works(torch_init(matmul_precision="f32"))


def test_freed_plan_and_freed_buffer_of_a_plan(tb: TorchBackend) -> None:
    _, buf, a, out = _one(tb, "p_in", 4, lambda c, t: c.scale(t, 3.0))
    assert out is not None
    g = _graph(out)
    plan = tb.graph_plan_create(g)
    tb.graph_plan_free(plan)
    expect_error(lambda: tb.graph_plan_compute(plan), GraphError, "the plan of 1 nodes was freed")
    plan2 = tb.graph_plan_create(g)
    buf.free()
    expect_error(lambda: tb.graph_plan_compute(plan2), BufferFreedError, "buffer 'Torch(cpu)' (512 bytes)",
                 "used by the plan was freed")
    expect_error(lambda: tb.graph_plan_create(g), BufferFreedError, "node 0 'p_in_out' (SCALE)",
                 "in buffer 'Torch(cpu)' (512 bytes), which was freed")
    assert_works(tb)


# --- compute: ops and types the backend does not take ---


def _alloc_graph(tb: TorchBackend, build: Callable[[Context], Tensor]) -> tuple[Graph, Tensor]:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    out = build(ctx).set_name("bad")
    alloc_ctx_tensors(ctx, tb)
    return _graph(out), out


UNSUPPORTED_CASES: list[tuple[str, Callable[[Context], Tensor], tuple[str, ...]]] = [
    ("diag-mask", lambda c: c.diag_mask_inf(c.new_tensor_2d(F32, 4, 4).set_name("m"), 0),
     ("op DIAG_MASK_INF of node 0 'bad'", "sources m:F32")),
    ("unary-tanh", lambda c: c.unary(c.new_tensor_1d(F32, 4).set_name("t"), UnaryOp.TANH),
     ("op TANH of node 0 'bad'",)),
    ("sub", lambda c: c.sub(c.new_tensor_1d(F32, 4).set_name("s0"), c.new_tensor_1d(F32, 4).set_name("s1")),
     ("op SUB of node 0 'bad'", "sources s0:F32, s1:F32")),
    ("mul_mat-q8_K", lambda c: c.mul_mat(c.new_tensor_2d(GGMLType.Q8_K, 256, 2).set_name("w"),
                                          c.new_tensor_2d(F32, 256, 3).set_name("x")),
     ("op MUL_MAT of node 0 'bad'", "F32[2, 3, 1, 1]", "sources w:Q8_K, x:F32")),
    ("mul_mat-q8_0-f16-src1", lambda c: c.mul_mat(c.new_tensor_2d(Q8_0, 32, 2).set_name("w"),
                                                  c.new_tensor_2d(F16, 32, 3).set_name("x")),
     ("op MUL_MAT", "sources w:Q8_0, x:F16")),
    ("cpy-to-q8_0", lambda c: c.cpy(c.new_tensor_1d(F32, 32).set_name("src"), c.new_tensor_1d(Q8_0, 32)),
     ("op CPY of node 0 'bad'", "(Q8_0[32, 1, 1, 1]; sources src:F32")),
    ("get_rows-q8_K", lambda c: c.get_rows(c.new_tensor_2d(GGMLType.Q8_K, 256, 4).set_name("table"),
                                            c.new_tensor_1d(I32, 2).set_name("idx")),
     ("op GET_ROWS", "sources table:Q8_K, idx:I32")),
]


@pytest.mark.parametrize("build, fragments", [c[1:] for c in UNSUPPORTED_CASES], ids=[c[0] for c in UNSUPPORTED_CASES])
def test_unsupported_op_asked_to_compute(tb: TorchBackend, build: Callable[[Context], Tensor],
                                         fragments: tuple[str, ...]) -> None:
    g, out = _alloc_graph(tb, build)
    assert not tb.supports_op(out)
    expect_error(lambda: tb.graph_compute(g), UnsupportedOpError, "backend 'Torch(cpu)' does not support", *fragments)
    expect_error(lambda: tb.graph_plan_create(g), UnsupportedOpError, *fragments)
    assert_works(tb)


def test_kernel_refuses_what_supports_op_refuses(tb: TorchBackend) -> None:
    """The plan maker itself (below graph_compute's check) names the tensor and the types it takes."""
    g, _ = _alloc_graph(tb, lambda c: c.mul_mat(c.new_tensor_2d(GGMLType.Q8_K, 256, 2).set_name("w"),
                                                c.new_tensor_2d(F32, 256, 3).set_name("x")))
    expect_error(lambda: plan_create(tb, g), UnsupportedTypeError, "torch MUL_MAT 'bad' (Q8_K x F32 -> F32)",
                 "src0 'w' has type Q8_K", "F32, F16, BF16, Q4_0, Q4_1")
    assert_works(tb)


def test_graph_with_tensors_elsewhere(tb: TorchBackend) -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 4).set_name("host_a")
    out = ctx.scale(a, 2.0).set_name("host_out")
    alloc_ctx_tensors(ctx, cpu_init(1))
    expect_error(lambda: tb.graph_compute(_graph(out)), ArgumentError, "'host_out' is in buffer 'CPU'",
                 "not in cpu memory of a torch backend")
    ctx2 = Context(mem_size=1 << 20, no_alloc=True)
    loose = ctx2.new_tensor_1d(F32, 4).set_name("loose")
    expect_error(lambda: tb.graph_compute(_graph(ctx2.scale(loose, 2.0).set_name("loose_out"))), NotAllocatedError,
                 "node 0 'loose_out' (SCALE) is not allocated")
    assert_works(tb)


@pytest.mark.parametrize("bad_index", [-1, 5, 2**31 - 1])
def test_get_rows_index_out_of_range(tb: TorchBackend, bad_index: int) -> None:
    """Checked on every compute, before dst is written; the same plan computes once the index is fixed."""
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    table = ctx.new_tensor_2d(F32, 3, 5).set_name("table")
    idx = ctx.new_tensor_1d(I32, 2).set_name("idx")
    rows = ctx.get_rows(table, idx).set_name("rows")
    alloc_ctx_tensors(ctx, tb)
    tensor_set_numpy(table, np.arange(15, dtype=np.float32).reshape(5, 3))
    tensor_set_numpy(rows, np.full((2, 3), -1, np.float32))
    plan = tb.graph_plan_create(_graph(rows))
    tensor_set_numpy(idx, [1, bad_index])
    expect_error(lambda: tb.graph_plan_compute(plan), OutOfBoundsError, "torch GET_ROWS 'rows'",
                 f"row index {bad_index} outside [0, 5)")
    assert (tensor_get_numpy(rows) == -1).all()  # nothing written
    tensor_set_numpy(idx, [4, 0])
    tb.graph_plan_compute(plan)
    assert tensor_get_numpy(rows).tolist() == [[12, 13, 14], [0, 1, 2]]
    assert_works(tb)
