"""The torch backend's registry, devices and buffer types.

One registry "torch" with a device per torch device pyggml computes on:
"Torch(cpu)" first, then "Torch(cuda:N)" for each CUDA GPU torch sees. The
cuda devices are GPUs (memory: `torch.cuda.mem_get_info`; caps: async,
events); the cpu device is an accelerator used together with the CPU
backend (type ACCEL; memory: the host's; caps: events, complete once
recorded, since its work is synchronous). Neither wraps host memory: a torch
buffer is device memory even on cpu (see `buffer`), so the loader copies
weights in.

Specs: "torch" (the cpu device), "torch:DEVICE[,OPTIONS]" with torch's device
names and the backend's options ("torch:cuda:0,matmul_precision=f16"; see
`backend.parse_spec`); a device's `init_backend(params)` takes the OPTIONS.

`torch_reg` is the entry point `pyggml.backends: torch` (see pyproject.toml).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from pyggml.backends.torch.buffer import TORCH_ALIGNMENT, torch_alloc_buffer
from pyggml.backends.torch.kernels import supports
from pyggml.core.errors import ArgumentError
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend.buffer import Buffer
from pyggml.ggml_backend.buffer_type import BufferType
from pyggml.ggml_backend.device import Device, DeviceType, host_cpu_name, host_memory
from pyggml.ggml_backend.device import DeviceCaps as BackendDeviceCaps
from pyggml.ggml_backend.event import Event
from pyggml.ggml_backend.registry import Reg

if TYPE_CHECKING:
    from pyggml.backends.torch.backend import TorchBackend


class TorchBufferType(BufferType):
    """Memory of one torch device, as torch uint8 tensors."""

    def __init__(self, device: TorchDevice) -> None:
        super().__init__(device)
        self.torch_device = device.torch_device

    def _get_name(self) -> str:
        return f"Torch({self.torch_device})"

    def _alloc_buffer(self, size: int) -> Buffer:
        return torch_alloc_buffer(None, size, self.torch_device, self)

    def _get_alignment(self) -> int:
        return TORCH_ALIGNMENT


class TorchDevice(Device):
    """A torch device ("cpu", "cuda:N")."""

    def __init__(self, reg: TorchReg, torch_device: torch.device) -> None:
        super().__init__(reg)
        self.torch_device = torch_device
        self.buft = TorchBufferType(self)

    def _is_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    def _get_name(self) -> str:
        return f"Torch({self.torch_device})"

    def _get_description(self) -> str:
        if self._is_cuda():
            return f"PyTorch {torch.__version__}: {torch.cuda.get_device_name(self.torch_device)}"
        return f"PyTorch {torch.__version__}: {host_cpu_name()}"

    def _get_memory(self) -> tuple[int, int]:
        if self._is_cuda():
            free, total = torch.cuda.mem_get_info(self.torch_device)
            return int(free), int(total)
        return host_memory()

    def _get_type(self) -> DeviceType:
        return DeviceType.GPU if self._is_cuda() else DeviceType.ACCEL

    def _get_caps(self) -> BackendDeviceCaps:
        return BackendDeviceCaps(async_=self._is_cuda(), events=True)

    def _init_backend(self, params: str | None) -> TorchBackend:
        from pyggml.backends.torch.backend import torch_init

        spec = str(self.torch_device)
        return torch_init(f"{spec},{params}" if params else spec)

    def _get_buffer_type(self) -> BufferType:
        return self.buft

    def _supports_op(self, op: Tensor) -> bool:
        return supports(op)

    def _supports_buft(self, buft: BufferType) -> bool:
        return buft is self.buft

    def _event_new(self) -> Event:
        return Event(self, torch.cuda.Event() if self._is_cuda() else None)

    def _event_synchronize(self, event: Event) -> None:
        if event.context is not None:
            event.context.synchronize()


class TorchReg(Reg):
    """The torch backend's registry: the cpu device, then each CUDA device."""

    def __init__(self) -> None:
        super().__init__()
        names = ["cpu"]
        if torch.cuda.is_available():
            names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        self._devices = [TorchDevice(self, torch.device(name)) for name in names]

    def _get_name(self) -> str:
        return "torch"

    def _get_device_count(self) -> int:
        return len(self._devices)

    def _get_device(self, index: int) -> Device:
        return self._devices[index]

    def _init_backend(self, arg: str | None) -> TorchBackend:
        from pyggml.backends.torch.backend import torch_init

        return torch_init(arg or "cpu")

    def device_of(self, torch_device: torch.device) -> TorchDevice:
        """The device of a torch device ("cuda" resolved to its index already)."""
        for dev in self._devices:
            if dev.torch_device == torch_device:
                return dev
        raise ArgumentError(f"torch backend: no device {torch_device} (devices: "
                            f"{', '.join(str(d.torch_device) for d in self._devices)})")


_reg: TorchReg | None = None


def torch_reg() -> TorchReg:
    """The torch registry (one per process)."""
    global _reg
    if _reg is None:
        _reg = TorchReg()
    return _reg


def torch_device_for(torch_device: torch.device) -> TorchDevice:
    """The registry's device for `torch_device`."""
    return torch_reg().device_of(torch_device)
