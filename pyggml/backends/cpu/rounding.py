"""The CPU backend's quantized-product numerics: a named option, chosen by hardware.

`quant_rounding` says which of ggml's CPU code paths MUL_MAT (and MUL_MAT_ID)
reproduce where the weights are quantized:

- "x86": ggml's AVX2/AVX512 code (ggml-cpu/arch/x86/quants.c), what llama.cpp
  runs on x86 machines. src1 rows are quantized to Q8_0/Q8_1 as
  `quantize_row_q8_0`/`quantize_row_q8_1` there do: each value times
  `id = 127 / amax` (float32), rounded half to even (`_mm256_round_ps`); and
  the Q8_0 x Q8_0 and Q4_1 x Q8_1 dot products accumulate as
  `ggml_vec_dot_q8_0_q8_0`/`ggml_vec_dot_q4_1_q8_1` do: one 8-lane float
  accumulator, `acc = fma(d_w * d_y, lane sums, acc)` block after block, then
  ggml's `hsum_float_8`; Q4_1's `summs` summed with scalar FMAs
  (`summs = fma(m, s, summs)`: gcc contracts ggml's `summs += m * s` under
  -std=gnu11, checked in the disassembly of 0c1e570's build) and added last.
- "ref": ggml's reference C (`quantize_row_q8_0_ref`/`q8_1_ref`: value times
  `1 / d` with `d = amax / 127`, `roundf` = half away from zero), what ggml
  runs without SIMD; the dots keep four accumulators (faster; only float
  summation order differs from ggml's scalar code).

The two differ in one quant in a few thousand (a value whose scaled
magnitude lands on or next to a half), which moves a logit by ~1e-3
relative: enough to change a greedy token at a near-tie, so pyggml serving
llama.cpp over RPC must round as llama.cpp's own CPU does to write the same
text. Q8_K (K-quants, IQ4_XS) rounds half to even on both paths already.

Default: "x86" where numba compiles for a CPU with AVX2 and FMA (the CPUs
where ggml takes that path; every machine here), else "ref".
`PYGGML_CPU_QUANT_ROUNDING` in the environment (either value) overrides the
default; an explicit `quant_rounding` argument overrides both, so tests that
name a setting get it on every machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal, cast

from llvmlite import binding as llvm_binding

from pyggml.core.errors import ArgumentError

QuantRounding = Literal["x86", "ref"]

QUANT_ROUNDINGS: tuple[QuantRounding, ...] = ("x86", "ref")
ENV_QUANT_ROUNDING = "PYGGML_CPU_QUANT_ROUNDING"
# the kernels' integer codes (numba compiles on ints, not strings)
ROUNDING_CODES: dict[str, int] = {"ref": 0, "x86": 1}


def host_quant_rounding() -> QuantRounding:
    """"x86" where numba's target CPU has AVX2 and FMA (ggml's x86 paths), else "ref"."""
    import numba

    if numba.config.CPU_NAME:
        return "ref"  # a chosen (e.g. generic) target: no x86 SIMD assumed, as quant_dot's portable code
    features = llvm_binding.get_host_cpu_features()
    return "x86" if features.get("avx2", False) and features.get("fma", False) else "ref"


def check_quant_rounding(value: object, where: str) -> QuantRounding:
    """`value` as one of QUANT_ROUNDINGS (case-insensitive), else ArgumentError naming the allowed ones."""
    name = value.strip().lower() if isinstance(value, str) else value
    if name not in QUANT_ROUNDINGS:
        raise ArgumentError(f"CPU backend: {where} {value!r} is not a quant rounding; "
                            f"allowed: {', '.join(QUANT_ROUNDINGS)}")
    return cast(QuantRounding, name)


def resolve_quant_rounding(value: object = None, environ: Mapping[str, str] | None = None) -> QuantRounding:
    """The setting for an argument `value`: itself if given, else PYGGML_CPU_QUANT_ROUNDING, else the host's."""
    if value is not None:
        return check_quant_rounding(value, "quant_rounding")
    env = os.environ if environ is None else environ
    text = env.get(ENV_QUANT_ROUNDING, "").strip()
    if text:
        return check_quant_rounding(text, ENV_QUANT_ROUNDING)
    return _HOST


_HOST: QuantRounding = host_quant_rounding()
