"""The torch backend: PyTorch's memory and kernels on a device (`cpu` here, `cuda:N` where there is one).

Optional: `pip install pyggml[torch]`. Importing this package imports torch;
the registry imports it only when a "torch" backend is asked for.

Options: `torch_init(device, n_threads, weight_cache_bytes, matmul_precision=...)`;
from the registry, `"torch:cpu,matmul_precision=f32"`; from the environment,
PYGGML_TORCH_MATMUL_PRECISION (see `precision`).

Registry, devices and buffer types: see `device` (the entry point `pyggml.backends: torch`).
"""

from pyggml.backends.torch.backend import (
    TorchBackend,
    is_torch,
    parse_device,
    parse_spec,
    torch_init,
    torch_set_n_threads,
)
from pyggml.backends.torch.buffer import TORCH_ALIGNMENT, TorchBuffer
from pyggml.backends.torch.cache import WeightCache
from pyggml.backends.torch.device import TorchBufferType, TorchDevice, TorchReg, torch_device_for, torch_reg
from pyggml.backends.torch.kernels import supports as kernel_supports
from pyggml.backends.torch.plan import TorchPlan
from pyggml.backends.torch.precision import (
    ENV_MATMUL_PRECISION,
    MATMUL_PRECISION_CHOICES,
    MATMUL_PRECISIONS,
    DeviceCaps,
    default_matmul_precision,
    probe_caps,
)

__all__ = ["ENV_MATMUL_PRECISION", "MATMUL_PRECISIONS", "MATMUL_PRECISION_CHOICES", "TORCH_ALIGNMENT", "DeviceCaps",
           "TorchBackend", "TorchBuffer", "TorchBufferType", "TorchDevice", "TorchPlan", "TorchReg", "WeightCache",
           "default_matmul_precision", "is_torch", "kernel_supports", "parse_device", "parse_spec", "probe_caps",
           "torch_device_for", "torch_init", "torch_reg", "torch_set_n_threads"]
