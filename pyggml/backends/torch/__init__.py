"""The torch backend: PyTorch's memory and kernels on a device (`cpu` here, `cuda:N` where there is one).

Optional: `pip install pyggml[torch]`. Importing this package imports torch;
the registry imports it only when a "torch" backend is asked for.
"""

from pyggml.backends.torch.backend import (
    TorchBackend,
    half_matmul_is_fast,
    is_torch,
    parse_device,
    torch_init,
    torch_set_n_threads,
)
from pyggml.backends.torch.buffer import TORCH_ALIGNMENT, TorchBuffer
from pyggml.backends.torch.cache import WeightCache
from pyggml.backends.torch.kernels import supports as kernel_supports
from pyggml.backends.torch.plan import TorchPlan

__all__ = ["TORCH_ALIGNMENT", "TorchBackend", "TorchBuffer", "TorchPlan", "WeightCache", "half_matmul_is_fast",
           "is_torch", "kernel_supports", "parse_device", "torch_init", "torch_set_n_threads"]
