"""The CPU backend's numerics, a named option: which of ggml's CPU code paths the kernels reproduce, "x86" (its
AVX2/AVX512 code, the default on AVX2+FMA machines) or "ref" (its reference C); `PYGGML_CPU_NUMERICS` overrides the
default (DESIGN.md, "Numerics: which of ggml's CPU code paths")."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal, cast

from llvmlite import binding as llvm_binding

from pyggml.core.errors import ArgumentError

Numerics = Literal["x86", "ref"]

NUMERICS_CHOICES: tuple[Numerics, ...] = ("x86", "ref")
ENV_NUMERICS = "PYGGML_CPU_NUMERICS"
# the kernels' integer codes (numba compiles on ints, not strings)
NUMERICS_CODES: dict[str, int] = {"ref": 0, "x86": 1}


def host_numerics() -> Numerics:
    """"x86" where numba's target CPU has AVX2 and FMA (ggml's x86 paths), else "ref"."""
    import numba

    if numba.config.CPU_NAME:
        return "ref"  # a chosen (e.g. generic) target: no x86 SIMD assumed, as vec_dot's portable code
    features = llvm_binding.get_host_cpu_features()
    return "x86" if features.get("avx2", False) and features.get("fma", False) else "ref"


def check_numerics(value: object, where: str) -> Numerics:
    """`value` as one of NUMERICS_CHOICES (case-insensitive), else ArgumentError naming the allowed ones."""
    name = value.strip().lower() if isinstance(value, str) else value
    if name not in NUMERICS_CHOICES:
        raise ArgumentError(f"CPU backend: {where} {value!r} is not a numerics setting; "
                            f"allowed: {', '.join(NUMERICS_CHOICES)}")
    return cast(Numerics, name)


def resolve_numerics(value: object = None, environ: Mapping[str, str] | None = None) -> Numerics:
    """The setting for an argument `value`: itself if given, else PYGGML_CPU_NUMERICS, else the host's."""
    if value is not None:
        return check_numerics(value, "numerics")
    env = os.environ if environ is None else environ
    text = env.get(ENV_NUMERICS, "").strip()
    if text:
        return check_numerics(text, ENV_NUMERICS)
    return _HOST


_HOST: Numerics = host_numerics()
