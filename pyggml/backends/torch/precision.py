"""The torch backend's matmul precision: a named option, its default from the device, one rule.

`matmul_precision` is the one reduced-precision dtype MUL_MAT may compute in
(what each value does per weight type: `pyggml.backends.torch.kernels.matmul`):

- "f32": every product in f32, from ggml's operands: exact up to summation
  order, on any device.
- "f16": quantized and F16 weights in f16 (the result rounded to f16); BF16
  weights in f32, or in bf16 below `HALF_NATIVE_MAX_COLS` src1 columns.
- "bf16": quantized and BF16 weights in bf16 (the result rounded to bf16);
  F16 weights in f32, or in f16 below `HALF_NATIVE_MAX_COLS` src1 columns.
- "auto": one of the above from the device's capabilities
  (`default_matmul_precision`).

F32 weights are always multiplied in f32. A backend built without the option
(None) takes `PYGGML_TORCH_MATMUL_PRECISION` from the environment (any of the
four values), else "auto"; an explicit argument wins over the environment, so
code and tests that name a precision get it on every machine.

Why it is an option: bf16 products are much faster than f32 ones where the
CPU has AMX or AVX512-BF16, but keep ~3 digits; which machine a
test runs on must not decide what it checks. The capability probe
(`probe_caps`) is the only place that reads hardware flags, and
`default_matmul_precision` the only rule that turns them into a choice.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

import torch

from pyggml.core.checks import check_instance
from pyggml.core.errors import ArgumentError

Precision = Literal["f32", "f16", "bf16"]

MATMUL_PRECISIONS: tuple[Precision, ...] = ("f32", "f16", "bf16")
MATMUL_PRECISION_CHOICES: tuple[str, ...] = ("auto", *MATMUL_PRECISIONS)
ENV_MATMUL_PRECISION = "PYGGML_TORCH_MATMUL_PRECISION"

PRECISION_DTYPES: dict[str, torch.dtype] = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class DeviceCaps:
    """What the default rule looks at: the device type and the CPU's matrix-unit flags (as torch reports them).

    `amx` is AMX tiles (torch.cpu._is_amx_tile_supported; every AMX CPU has
    AMX-BF16), `avx512_bf16` the AVX512 BF16 dot products, `amx_fp16` AMX-FP16.
    The CPU flags are False on a CUDA device (they say nothing about the GPU).
    """

    device_type: str = "cpu"
    amx: bool = False
    avx512_bf16: bool = False
    amx_fp16: bool = False

    def flags(self) -> list[str]:
        """The names of the flags that are set, for messages ("amx", "avx512_bf16", ...)."""
        return [name for name in ("amx", "avx512_bf16", "amx_fp16") if getattr(self, name)]

    def describe(self) -> str:
        if self.device_type != "cpu":
            return self.device_type
        return f"cpu with {', '.join(self.flags())}" if self.flags() else "cpu without bf16/f16 matrix units"


def default_matmul_precision(caps: DeviceCaps) -> Precision:
    """THE rule: the precision "auto" means on a device with `caps`.

    - CUDA: f16. Tensor cores multiply f16 on every GPU torch supports (bf16
      only from Ampere on), and ggml's CUDA backend multiplies F16 weights with
      src1 converted to f16 as well.
    - A CPU with AMX or AVX512-BF16: bf16 (much faster than f32 GEMMs there;
      bf16 keeps f32's range, so activations cannot overflow).
    - A CPU with AMX-FP16 only: f16.
    - Any other CPU (AVX2): f32; torch's half GEMMs there are much slower than f32.
    """
    if caps.device_type == "cuda":
        return "f16"
    if caps.amx or caps.avx512_bf16:
        return "bf16"
    if caps.amx_fp16:
        return "f16"
    return "f32"


def _cpu_flag(name: str) -> bool:
    fn = getattr(torch.cpu, name, None)  # private torch helpers: absent in some builds, then False
    try:
        return bool(fn()) if fn is not None else False
    except RuntimeError:
        return False


def probe_caps(device: torch.device) -> DeviceCaps:
    """The capabilities of `device` (the one place hardware flags are read)."""
    if device.type != "cpu":
        return DeviceCaps(device_type=device.type)
    return DeviceCaps(device_type="cpu", amx=_cpu_flag("_is_amx_tile_supported"),
                      avx512_bf16=_cpu_flag("_is_avx512_bf16_supported"),
                      amx_fp16=_cpu_flag("_is_amx_fp16_supported"))


def _choice(value: str, where: str) -> str:
    name = value.strip().lower()
    if name not in MATMUL_PRECISION_CHOICES:
        raise ArgumentError(f"torch backend: {where} {value!r} is not a matmul precision; "
                            f"allowed: {', '.join(MATMUL_PRECISION_CHOICES)}")
    return name


def resolve_matmul_precision(value: object, caps: DeviceCaps,
                             environ: Mapping[str, str] | None = None) -> tuple[Precision, str]:
    """(precision, where it came from) for the constructor's `matmul_precision` argument.

    None reads PYGGML_TORCH_MATMUL_PRECISION (unset or empty: "auto"); a value
    is one of MATMUL_PRECISION_CHOICES, case-insensitive. A wrong value raises
    ArgumentError naming it and the allowed ones, a wrong type ArgumentTypeError.
    """
    env = os.environ if environ is None else environ
    if value is None and env.get(ENV_MATMUL_PRECISION, "").strip():
        name, source = _choice(env[ENV_MATMUL_PRECISION], ENV_MATMUL_PRECISION), f"from {ENV_MATMUL_PRECISION}"
    elif value is None:
        name, source = "auto", ""
    else:
        check_instance(value, str, f"torch backend: matmul_precision ({', '.join(MATMUL_PRECISION_CHOICES)})")
        assert isinstance(value, str)
        name, source = _choice(value, "matmul_precision"), "from the matmul_precision option"
    if name == "auto":
        return default_matmul_precision(caps), f"auto: {caps.describe()}"
    assert name in MATMUL_PRECISIONS
    return cast(Precision, name), source
