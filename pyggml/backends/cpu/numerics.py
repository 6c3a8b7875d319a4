"""The CPU backend's numerics: which of ggml's CPU code paths the kernels reproduce, a named option.

`numerics` is chosen by hardware, since ggml's CPU backend computes some ops
differently on different CPUs (its SIMD code is not its reference C):

- "x86": ggml's AVX2/AVX512 code (ggml-cpu/arch/x86/quants.c, vec.h,
  simd-mappings.h of llama.cpp 0c1e570), what llama.cpp runs on x86
  machines:
  - src1 rows of MUL_MAT (and MUL_MAT_ID's direct path) are quantized to
    Q8_0/Q8_1 as `quantize_row_q8_0`/`quantize_row_q8_1` there: each value
    times `id = 127 / amax` (float32), rounded half to even
    (`_mm256_round_ps`);
  - the Q8_0, Q4_0 and Q5_0 x Q8_0, Q4_1 x Q8_1 and Q4_K, Q6_K x Q8_K dot
    products accumulate as `ggml_vec_dot_q8_0_q8_0`/`_q4_0_q8_0`/`_q5_0_q8_0`/
    `_q4_1_q8_1`/`_q4_K_q8_K`/`_q6_K_q8_K`: one 8-lane float
    accumulator, `acc = fma(d_w * d_y, lane sums, acc)` block after block,
    `hsum_float_8`; Q4_1's `summs` by scalar FMAs (`summs = fma(m, s,
    summs)`: gcc contracts ggml's `summs += m * s` under -std=gnu11, seen in
    the disassembly of 0c1e570's build), added last;
  - FLASH_ATTN_EXT's F16 dot products (on the shapes it walks row by row) in
    `ggml_vec_dot_f16`'s order: 4 accumulators of 16 lanes (AVX512F) or 8
    (AVX2), then `_mm512_reduce_add_ps` or hadds;
  - SOFT_MAX, SILU and SWIGLU: `ggml_v_expf` (a polynomial of FMAs, its
    AVX512 or AVX2 variant) on blocks of 16 or 8 values, libm's `expf` on the
    rest of a row (`kernels/simd_math.py`);
  - ROPE (F32): the rotation's products as gcc contracts them into FMAs.
- "ref": ggml's reference C, what ggml runs without SIMD:
  `quantize_row_q8_0_ref`/`q8_1_ref` (value times `1 / d` with
  `d = amax / 127`, `roundf` = half away from zero), scalar F16 dots (float
  products summed in double), libm's `expf` for every exp, the rotation
  without FMAs; pyggml's quantized dots keep four accumulators there
  (faster; only float summation order differs from ggml's scalar code).

On both: libm's cosf/sinf/expf/powf where ggml calls them (numba's math
functions on float32 are libm's; numpy's float32 ones are its own SIMD
code), RMS_NORM's sum of squares in double, and flash attention's
row-by-row online softmax with an f16 V accumulator for F16 K and V.

The quantizers differ in about one quant in 1e5 (a value whose scaled
magnitude lands within an ulp of a half) and the summation orders in last
bits, and a quantized model grows any such difference (a flipped Q8 quant
moves a logit by ~1e-3 relative, and the next layers' quants flip in turn): pyggml
serving llama.cpp over RPC must compute as llama.cpp's own CPU does to write
the same greedy text.

Default: "x86" where numba compiles for a CPU with AVX2 and FMA (the CPUs
where ggml takes those paths; every machine here), else "ref".
`PYGGML_CPU_NUMERICS` in the environment (either value) overrides the
default; an explicit `numerics` argument overrides both, so tests that name
a setting get it on every machine.
"""

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
