"""ggml-cpu's per-element functions (unary-ops.cpp, vec.h), float for float: libm's f32 functions (numba's
math.* on float32 calls them) in ggml's expression order, NaN going where ggml's comparisons send it, and
`1 + a*x*x` contracted to one fma as GCC compiles ggml (-ffp-contract=fast); and ggml's f16 tables of GELU and
GELU_QUICK, built from them as ggml_cpu_init builds its own.

Each function is a float32 ufunc compiled at its first use."""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, vectorize

from pyggml.backends.cpu.kernels.vec_dot.ir import fma_f32
from pyggml.core.errors import ArgumentError

# ggml-cpu's constants (vec.h, unary-ops.cpp)
GELU_COEF_A = np.float32(0.044715)
GELU_QUICK_COEF = np.float32(-1.702)
SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)
SQRT_2_INV = np.float32(0.70710678118654752440084436210484)
SOFTPLUS_THRESHOLD = np.float32(20.0)  # softplus(x) is x above it
_ONE, _HALF = np.float32(1.0), np.float32(0.5)

_SIG = ["float32(float32)"]


def _gelu(x):  # pragma: no cover - compiled
    """ggml_gelu_f32: 0.5x (1 + tanh(sqrt(2/pi) x (1 + a x x)))."""
    return _HALF * x * (_ONE + math.tanh(SQRT_2_OVER_PI * x * fma_f32(GELU_COEF_A * x, x, _ONE)))


def _gelu_quick(x):  # pragma: no cover - compiled
    """ggml_gelu_quick_f32: x (1 / (1 + exp(-1.702 x)))."""
    return x * (_ONE / (_ONE + math.exp(GELU_QUICK_COEF * x)))


def _gelu_erf(x):  # pragma: no cover - compiled
    """ggml_vec_gelu_erf_f32's element: 0.5x (1 + erf(x / sqrt(2)))."""
    return _HALF * x * (_ONE + math.erf(x * SQRT_2_INV))


def _sgn(x):  # pragma: no cover - compiled
    return _ONE if x > 0 else (-_ONE if x < 0 else np.float32(0.0))


def _relu(x):  # pragma: no cover - compiled
    return x if x > 0 else np.float32(0.0)


@njit(cache=True, inline="always")
def _hard_sigmoid_of(x):  # pragma: no cover - compiled
    """op_hardsigmoid: fminf(1, fmaxf(0, (x + 3) / 6)), where fmaxf(0, NaN) is 0."""
    t = (x + np.float32(3.0)) / np.float32(6.0)
    t = t if t > 0 else np.float32(0.0)
    return t if t < _ONE else _ONE


def _hardsigmoid(x):  # pragma: no cover - compiled
    return _hard_sigmoid_of(x)


def _hardswish(x):  # pragma: no cover - compiled
    return x * _hard_sigmoid_of(x)


def _tanh(x):  # pragma: no cover - compiled
    return math.tanh(x)


def _elu(x):  # pragma: no cover - compiled
    return x if x > 0 else math.expm1(x)


def _sigmoid(x):  # pragma: no cover - compiled
    return _ONE / (_ONE + math.exp(-x))


def _exp(x):  # pragma: no cover - compiled
    return math.exp(x)


def _expm1(x):  # pragma: no cover - compiled
    """op_expm1: expf(x) - 1, not expm1f."""
    return math.exp(x) - _ONE


def _softplus(x):  # pragma: no cover - compiled
    return x if x > SOFTPLUS_THRESHOLD else math.log(_ONE + math.exp(x))


def _log(x):  # pragma: no cover - compiled
    return math.log(x)


_FUNCTIONS = {"gelu": _gelu, "gelu_quick": _gelu_quick, "gelu_erf": _gelu_erf, "sgn": _sgn, "relu": _relu,
              "hardsigmoid": _hardsigmoid, "hardswish": _hardswish, "tanh": _tanh, "elu": _elu, "sigmoid": _sigmoid,
              "exp": _exp, "expm1": _expm1, "softplus": _softplus, "log": _log}


@functools.cache
def ufunc(name: str) -> np.ufunc:
    """The float32 ufunc of ggml-cpu's function `name` (a key of _FUNCTIONS)."""
    if name not in _FUNCTIONS:
        raise ArgumentError(f"ggml-cpu has no per-element function {name!r} here (there are {', '.join(_FUNCTIONS)})")
    return vectorize(_SIG, cache=True)(_FUNCTIONS[name])


@functools.cache
def f16_table(name: str) -> np.ndarray:
    """ggml's table of `name` ("gelu" or "gelu_quick") over every f16: f32 values, indexed by the f16's bits,
    each the function of that f16 rounded to f16 (ggml_table_gelu_f16, ggml_table_gelu_quick_f16)."""
    if name not in ("gelu", "gelu_quick"):
        raise ArgumentError(f"ggml has no f16 table of {name!r} (it has one of gelu and gelu_quick)")
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(all="ignore"):
        table = ufunc(name)(x).astype(np.float16).astype(np.float32)
    table.flags.writeable = False
    return table


def take_f16_table(name: str, x: np.ndarray, out: np.ndarray, shortcuts: bool, h: np.ndarray | None = None) -> None:
    """out = ggml's f16 table `name` at x rounded to f16 (out may be x; `h`: float16 scratch of x's shape). With
    `shortcuts` (GELU and GEGLU of F32 data, ggml_vec_gelu_f32 / ggml_vec_geglu_f32), 0 where x <= -10 and x
    itself where x >= 10."""
    if h is None:
        h = np.empty(x.shape, np.float16)
    np.copyto(h, x, casting="same_kind")
    if shortcuts:
        low, high = x <= -10.0, x >= 10.0
        kept = x[high]
    np.take(f16_table(name), h.view(np.uint16), out=out)
    if shortcuts:
        out[low] = 0.0
        out[high] = kept
