"""The torch backend: memory and kernels of PyTorch on one device (`cpu`, `cuda:N`).

Named `Torch(<device>)`, found by the registry as "torch" (the cpu device)
and "torch:<device>" ("torch:cuda:0"). Buffers are torch uint8 tensors on the
device (see `buffer`); kernels are torch ops writing into views of them (see
`kernels`); graphs are computed through plans (see `plan`).

Transfers: tensor set/get copy between the caller's memory and the device
with `non_blocking` on CUDA (the `_async` forms return before the copy ends;
`synchronize` waits for the device's stream), plain copies on the cpu device.
`cpy_tensor_from`/`cpy_tensor_to` copy directly between a torch buffer and a
CPU (host) buffer or another torch buffer: torch views of both sides
(`torch.from_numpy` over the host bytes, no temporary), one `copy_`.

Threads: torch's intra-op thread count is process-wide; a backend with
`n_threads` set (`torch_set_n_threads`) sets it before each compute when it
differs, as the CPU backend limits BLAS.

Matmul precision: the option `matmul_precision` ("auto", "f32", "f16",
"bf16"; see `precision`) fixes the dtype MUL_MAT multiplies non-F32 weights
in; "auto" is chosen from the device's capabilities once, at construction.
`describe()` says which precision and why (`pyggml run --verbose` prints it).

Device: the torch registry's device of the same torch device (see `device`:
"Torch(cpu)", "Torch(cuda:N)"), which gives the buffer type and events
(CUDA events on cuda; on cpu the work is done when an event is recorded).
"""

from __future__ import annotations

import logging

import torch

from pyggml.backends.torch.buffer import (
    TORCH_ALIGNMENT,
    TorchBuffer,
    copy_into,
    host_source,
    host_view,
    torch_alloc_buffer,
    watch_weight_cache,
)
from pyggml.backends.torch.cache import DEFAULT_WEIGHT_CACHE_BYTES, WeightCache
from pyggml.backends.torch.device import torch_device_for
from pyggml.backends.torch.kernels import supports
from pyggml.backends.torch.plan import TorchPlan, plan_compute, plan_create
from pyggml.backends.torch.precision import (
    PRECISION_DTYPES,
    DeviceCaps,
    Precision,
    probe_caps,
    resolve_matmul_precision,
)
from pyggml.core.checks import check_instance, check_positive, check_size
from pyggml.core.errors import ArgumentError, NotAllocatedError
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer, tensor_buffer
from pyggml.ggml_backend.event import Event

log = logging.getLogger("pyggml.backends.torch")


def parse_device(device: str | torch.device | None) -> torch.device:
    """The torch device for a name ("cpu", "cuda", "cuda:1"); ArgumentError if torch cannot use it here."""
    if device is not None:
        check_instance(device, (str, torch.device), "torch backend: device")
    try:
        dev = torch.device(device if device else "cpu")
    except (RuntimeError, TypeError) as e:
        raise ArgumentError(f"torch backend: {device!r} is not a torch device name ({e})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ArgumentError(f"torch backend: device '{device}' asked for, but CUDA is not available "
                                f"(torch {torch.__version__})")
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise ArgumentError(f"torch backend: device '{device}' asked for, but there are only "
                                f"{torch.cuda.device_count()} CUDA devices")
        return torch.device("cuda", index)
    if dev.type != "cpu":
        # other device types (mps, xpu, ...) may work, but nothing here has checked them
        raise ArgumentError(f"torch backend: device type '{dev.type}' is not supported (cpu, cuda)")
    return dev


class TorchBackend(Backend):
    """A pyggml backend computing with PyTorch on `device`.

    `weight_cache_bytes` bounds the weight cache (converted MUL_MAT weights,
    see `pyggml.backends.torch.cache`). `matmul_precision` ("auto", "f32",
    "f16" or "bf16") is the dtype MUL_MAT multiplies F16, BF16 and quantized
    weights in (see `pyggml.backends.torch.precision`); None takes
    PYGGML_TORCH_MATMUL_PRECISION from the environment, else "auto", which the
    device's capabilities decide (`default_matmul_precision`).
    """

    def __init__(self, device: str | torch.device | None = "cpu", n_threads: int | None = None,
                 weight_cache_bytes: int = DEFAULT_WEIGHT_CACHE_BYTES, *,
                 matmul_precision: str | None = None) -> None:
        torch_device = parse_device(device)
        super().__init__(torch_device_for(torch_device))
        self.device = torch_device
        self.n_threads = None if n_threads is None else check_positive(n_threads, "torch backend: n_threads")
        self.weight_cache = WeightCache(check_size(weight_cache_bytes, "torch backend: weight_cache_bytes"))
        watch_weight_cache(self.weight_cache)
        self.non_blocking = self.device.type == "cuda"
        self.caps: DeviceCaps = probe_caps(self.device)
        self._precision, self._precision_source = resolve_matmul_precision(matmul_precision, self.caps)

    # --- policy ---

    @property
    def matmul_precision(self) -> Precision:
        """"f32", "f16" or "bf16": what MUL_MAT multiplies non-F32 weights in (fixed at construction)."""
        return self._precision

    @property
    def matmul_dtype(self) -> torch.dtype:
        return PRECISION_DTYPES[self._precision]

    def describe(self) -> str:
        """The backend's choices in words: "matmul precision bf16 (auto: cpu with amx, avx512_bf16)"."""
        return f"matmul precision {self._precision} ({self._precision_source})"

    def half_is_fast(self, dtype: torch.dtype) -> bool:
        """Whether weights of half `dtype` are multiplied in it at any column count (it is the precision's dtype).

        Kept because benchmarks/bench_torch.py prints it; `describe()` says more.
        """
        return dtype != torch.float32 and dtype == self.matmul_dtype

    def set_n_threads(self, n_threads: int) -> None:
        """Computes of this backend run with torch.set_num_threads(n_threads) (see torch_set_n_threads)."""
        torch_set_n_threads(self, n_threads)

    def apply_n_threads(self) -> None:
        """Set torch's thread count to ours, if we have one and it differs (it is process-wide)."""
        if self.n_threads is not None and torch.get_num_threads() != self.n_threads:
            torch.set_num_threads(self.n_threads)

    # --- hooks ---

    def _get_name(self) -> str:
        return f"Torch({self.device})"

    def _free(self) -> None:
        self.weight_cache.clear()

    def _alloc_buffer(self, size: int) -> TorchBuffer:
        return torch_alloc_buffer(self, size, self.device, self.get_default_buffer_type())

    def _get_alignment(self) -> int:
        return TORCH_ALIGNMENT

    def _own(self, t: Tensor, what: str) -> TorchBuffer:
        buffer = tensor_buffer(t)
        if not isinstance(buffer, TorchBuffer):
            raise NotAllocatedError(f"{self.name()} {what}: tensor '{t.name}' is not in a torch buffer")
        return buffer

    def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        if size == 0:
            return
        buffer = self._own(tensor, "tensor_set")
        assert tensor.data is not None
        start = buffer.check_range(tensor.data + offset, size, tensor.name)
        buffer.bytes_at(start, size).copy_(host_source(data, size), non_blocking=self.non_blocking)
        buffer.note_write(start, size)

    def _get_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        if size == 0:
            return
        buffer = self._own(tensor, "tensor_get")
        assert tensor.data is not None
        start = buffer.check_range(tensor.data + offset, size, tensor.name)
        out = torch.frombuffer(data, dtype=torch.uint8, count=size)
        out.copy_(buffer.bytes_at(start, size), non_blocking=self.non_blocking)

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _cpy_tensor_from(self, src: Tensor, dst: Tensor) -> bool:
        """dst (ours) <- src from host memory or any torch buffer: one copy_ between views, no temporary."""
        return copy_into(self._own(dst, "cpy_tensor_from"), src, dst, self.non_blocking)

    def _cpy_tensor_to(self, src: Tensor, dst: Tensor) -> bool:
        """src (ours) -> dst in host memory or any torch buffer; host copies are complete on return."""
        sbuf = self._own(src, "cpy_tensor_to")
        nbytes = src.nbytes()
        assert dst.data is not None and src.data is not None
        source = sbuf.bytes_at(sbuf.check_range(src.data, nbytes, src.name), nbytes)
        dbuf: Buffer | None = tensor_buffer(dst)
        if isinstance(dbuf, TorchBuffer):
            dstart = dbuf.check_range(dst.data, nbytes, dst.name)
            if nbytes:
                dbuf.bytes_at(dstart, nbytes).copy_(source, non_blocking=self.non_blocking)
                dbuf.note_write(dstart, nbytes)
            return True
        if dbuf is not None and dbuf.is_host():
            host = host_view(dst, nbytes)
            if host is None:
                return False
            if nbytes:
                host.copy_(source)
                self._synchronize()
            return True
        return False

    def _graph_plan_create(self, graph: Graph) -> TorchPlan:
        return plan_create(self, graph)

    def _graph_plan_free(self, plan: TorchPlan) -> None:
        plan.freed = True
        plan.computes = []
        plan.buffers = []
        plan.writes = []

    def _graph_plan_compute(self, plan: TorchPlan) -> None:
        plan_compute(plan)

    def _graph_compute(self, graph: Graph) -> None:
        plan_compute(plan_create(self, graph))

    def _supports_op(self, op: Tensor) -> bool:
        return supports(op)

    def _event_record(self, event: Event) -> None:
        if self.device.type == "cuda":
            event.context.record(torch.cuda.current_stream(self.device))
        # on the cpu device the work queued so far is done: the event is complete

    def _event_wait(self, event: Event) -> None:
        if self.device.type == "cuda" and isinstance(event.context, torch.cuda.Event):
            torch.cuda.current_stream(self.device).wait_event(event.context)
        else:
            event.synchronize()


TORCH_SPEC_OPTIONS = ("matmul_precision",)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """(device, options) of a registry spec "DEVICE[,key=value...]": "cuda:0,matmul_precision=f16".

    The registry passes what follows "torch:" as one string, so options travel
    in it ("--backend torch:cpu,matmul_precision=f32"); the keys are TORCH_SPEC_OPTIONS.
    """
    device, *items = spec.split(",")
    options: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ArgumentError(f"torch backend: option {item!r} in {spec!r} is not key=value "
                                f"(keys: {', '.join(TORCH_SPEC_OPTIONS)})")
        if key not in TORCH_SPEC_OPTIONS:
            raise ArgumentError(f"torch backend: unknown option {key!r} in {spec!r} "
                                f"(keys: {', '.join(TORCH_SPEC_OPTIONS)})")
        if key in options:
            raise ArgumentError(f"torch backend: option {key!r} is given twice in {spec!r}")
        options[key] = value
    return device.strip() or "cpu", options


def torch_init(device: str | torch.device | None = "cpu", n_threads: int | None = None,
               weight_cache_bytes: int = DEFAULT_WEIGHT_CACHE_BYTES, *,
               matmul_precision: str | None = None) -> TorchBackend:
    """A torch backend on `device` ("cpu", "cuda:0", ...); see TorchBackend for the other arguments.

    `device` may carry options as the registry passes them ("cpu,matmul_precision=bf16", see parse_spec).
    """
    if isinstance(device, str) and "," in device:
        device, options = parse_spec(device)
        if "matmul_precision" in options:
            if matmul_precision is not None:
                raise ArgumentError(f"torch backend: matmul_precision is given both in the device spec "
                                    f"({options['matmul_precision']!r}) and as an argument ({matmul_precision!r})")
            matmul_precision = options["matmul_precision"]
    return TorchBackend(device, n_threads, weight_cache_bytes, matmul_precision=matmul_precision)


def is_torch(backend: Backend | None) -> bool:
    return isinstance(backend, TorchBackend)


def torch_set_n_threads(backend: Backend, n_threads: int) -> None:
    """Computes of `backend` run with torch.set_num_threads(n_threads) (torch's count is process-wide)."""
    if not is_torch(backend):
        what = (f"backend '{backend.name()}'" if isinstance(backend, Backend)
                else f"{type(backend).__name__} {backend!r:.80}")
        raise ArgumentError(f"torch_set_n_threads: {what} is not a torch backend")
    assert isinstance(backend, TorchBackend)
    backend.n_threads = check_positive(n_threads, "torch_set_n_threads: n_threads")
