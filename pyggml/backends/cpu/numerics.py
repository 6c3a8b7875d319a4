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


# the x86 level ggml-cpu is built for where results differ by it (F16/BF16 MUL_MAT; F16 FLASH_ATTN_EXT's V sums, in
# half precision with AVX512-FP16): AVX2+F16C+FMA, AVX512F, AVX512F with AVX512_BF16, and with AVX512_FP16 too
# (Sapphire Rapids); a named option of its own (ComputeParams.x86_level), so tests force each
X86Level = Literal["avx2", "avx512", "avx512bf16", "avx512fp16"]
X86_LEVELS: tuple[X86Level, ...] = ("avx2", "avx512", "avx512bf16", "avx512fp16")
ENV_X86_LEVEL = "PYGGML_CPU_X86_LEVEL"


def host_x86_level() -> X86Level:
    """The level a -march=native build of ggml-cpu has here (numba's CPU features), "avx2" below AVX512F."""
    features = llvm_binding.get_host_cpu_features()
    if not features.get("avx512f", False):
        return "avx2"
    if not features.get("avx512bf16", False):
        return "avx512"
    return "avx512fp16" if features.get("avx512fp16", False) else "avx512bf16"


def resolve_x86_level(value: object = None, environ: Mapping[str, str] | None = None) -> X86Level:
    """The level for an argument `value`: itself if given, else PYGGML_CPU_X86_LEVEL, else the host's."""
    if value is None:
        env = os.environ if environ is None else environ
        value = env.get(ENV_X86_LEVEL, "").strip() or None
        where = ENV_X86_LEVEL
    else:
        where = "x86 level"
    if value is None:
        return _HOST_LEVEL
    name = value.strip().lower() if isinstance(value, str) else value
    if name not in X86_LEVELS:
        raise ArgumentError(f"CPU backend: {where} {value!r} is not an x86 level; allowed: {', '.join(X86_LEVELS)}")
    return cast(X86Level, name)


_HOST_LEVEL: X86Level = host_x86_level()


# gcc's -march=native contracts a loop's `acc += a * b` into an FMA, except where it tunes for AMD Zen (its
# avoid_fma_chains): ggml's generic C loops that its x86 build runs (Q2_0's vec_dot) round as the host's build
# does; PYGGML_CPU_FMA_CHAINS ("1" or "0") overrides the host's, read once at import
ENV_FMA_CHAINS = "PYGGML_CPU_FMA_CHAINS"


def host_fma_chains(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ggml's x86 build here fuses its generic loops' multiply-adds: PYGGML_CPU_FMA_CHAINS if set, else
    not on a Zen CPU (LLVM's host CPU name "znver*"), else yes."""
    env = os.environ if environ is None else environ
    text = env.get(ENV_FMA_CHAINS, "").strip()
    if text:
        if text not in ("0", "1"):
            raise ArgumentError(f"CPU backend: {ENV_FMA_CHAINS} {text!r} is not 0 or 1")
        return text == "1"
    return not llvm_binding.get_host_cpu_name().startswith("znver")


FMA_CHAINS: bool = host_fma_chains()
