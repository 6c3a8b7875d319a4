"""Where a model's weights go when it is split over backends, the way llama.cpp places them.

Three ways to say it, as llama.cpp's options do:

- layer counts (`n_layers_on`, llama.cpp's `--n-gpu-layers` per device): the first `n_layers_on[0]`
  layers on the first backend, the next `n_layers_on[1]` on the second, the rest on the backend after
  the last count (the last backend when every backend has a count);
- proportions (`tensor_split`, llama.cpp's `--tensor-split`): layer `il` goes to the first backend whose
  cumulative share exceeds `il / (n_layer + 1)` (`std::upper_bound` over the normalized cumulative split),
  the output layer to the one that exceeds `n_layer / (n_layer + 1)`;
- overrides (`override_tensor`, llama.cpp's `--override-tensor`): a weight whose name a regex finds
  (`re.search`, as `std::regex_search`) goes to that backend whatever its layer; the first matching
  override wins.

Backends are named by position (`2`), by name when only one backend has it (`"CPU"`), or by both
(`"CPU#2"`, as `pyggml run -v` labels them); names are compared without case.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from pyggml.core.errors import ArgumentError, LimitExceededError
from pyggml.sched.backend_sched import GGML_SCHED_MAX_BACKENDS

_POSITION = re.compile(r"\s*(\d+)\s*")
_NAME_AT = re.compile(r"(.*\S)\s*#\s*(\d+)\s*")


def check_backend_count(n_backends: int, what: str = "load") -> None:
    """At most GGML_SCHED_MAX_BACKENDS backends: the scheduler that joins them takes no more."""
    if n_backends > GGML_SCHED_MAX_BACKENDS:
        raise LimitExceededError(f"{what}: {n_backends} backends exceed GGML_SCHED_MAX_BACKENDS = "
                                 f"{GGML_SCHED_MAX_BACKENDS}")


def backend_label(aliases: Sequence[Sequence[str]], i: int) -> str:
    """Backend i for messages: "cpu#1" (its first name and its position)."""
    return f"{aliases[i][0] if aliases[i] else '?'}#{i}"


def backend_labels(aliases: Sequence[Sequence[str]]) -> str:
    """The backends as a list for messages: "torch, cpu", with positions where names repeat ("cpu#0, cpu#1")."""
    firsts = [(names[0] if names else "?").lower() for names in aliases]
    return ", ".join(backend_label(aliases, i) if firsts.count(firsts[i]) > 1 else (aliases[i] or ["?"])[0]
                     for i in range(len(aliases)))


def backend_index(spec: str | int, aliases: Sequence[Sequence[str]], what: str) -> int:
    """The position of the backend `spec` names among backends known by `aliases` (the names of each).

    `spec` is a position (2 or "2"), "NAME#I" (backend I, which must be called NAME) or "NAME" (the one
    backend called so: a name several backends share needs the position). ArgumentError naming `what`."""
    n = len(aliases)
    if isinstance(spec, bool) or not isinstance(spec, int | str):
        raise ArgumentError(f"{what}: a backend is a position or a name, got {type(spec).__name__}")
    if isinstance(spec, str) and (m := _POSITION.fullmatch(spec)):
        spec = int(m.group(1))
    if isinstance(spec, int):
        if not 0 <= spec < n:
            raise ArgumentError(f"{what}: there is no backend {spec}: the {n} backend(s) are "
                                f"{backend_labels(aliases)} (positions from 0)")
        return spec
    folded = [{a.lower() for a in names} for names in aliases]
    if m := _NAME_AT.fullmatch(spec):
        name, i = m.group(1), int(m.group(2))
        if not 0 <= i < n:
            raise ArgumentError(f"{what}: there is no backend {i} ('{spec}'): the {n} backend(s) are "
                                f"{backend_labels(aliases)} (positions from 0)")
        if name.lower() not in folded[i]:
            raise ArgumentError(f"{what}: backend {i} is {backend_label(aliases, i)}, not '{name}'")
        return i
    name = spec.strip()
    matches = [i for i, names in enumerate(folded) if name.lower() in names]
    if not matches:
        raise ArgumentError(f"{what}: '{name}' is not one of the backends ({backend_labels(aliases)})")
    if len(matches) > 1:
        at = ", ".join(str(i) for i in matches)
        raise ArgumentError(f"{what}: '{name}' names {len(matches)} backends (positions {at}): say which by "
                            f"position, as {name}#{matches[0]} or {matches[0]}")
    return matches[0]


def layers_by_counts(n_layer: int, n_backends: int, n_layers_on: int | Sequence[int] | None) -> list[int]:
    """The backend (position) of each layer from layer counts: `n_layers_on[i]` layers on backend i in order,
    the rest on the backend after the last count, or on the last backend (None: all on the first)."""
    if n_layers_on is None:
        return [0] * n_layer
    counts = [n_layers_on] if isinstance(n_layers_on, int) else [int(n) for n in n_layers_on]
    if any(n < 0 for n in counts):
        raise ArgumentError(f"n_layers_on must be >= 0 layer counts, got {counts}")
    if len(counts) > n_backends:
        raise ArgumentError(f"n_layers_on gives {len(counts)} counts for {n_backends} backends")
    out: list[int] = []
    for i, n in enumerate(counts):
        out += [i] * n
    out = out[:n_layer]
    rest = len(counts) if len(counts) < n_backends else n_backends - 1
    return out + [rest] * (n_layer - len(out))


def check_tensor_split(tensor_split: Sequence[float], n_backends: int, what: str = "tensor_split") -> list[float]:
    """The proportions as floats: one per backend, each finite and >= 0, not all 0 (ArgumentError otherwise).

    llama.cpp reads an all-zero split as "by free memory"; pyggml's backends report no comparable free
    memory, so it is refused rather than guessed."""
    try:
        values = [float(x) for x in tensor_split]
    except (TypeError, ValueError):
        raise ArgumentError(f"{what}: proportions must be numbers, got {list(tensor_split)!r}") from None
    if len(values) != n_backends:
        raise ArgumentError(f"{what}: {len(values)} proportion(s) for {n_backends} backend(s): give one per backend")
    bad = [x for x in values if not math.isfinite(x) or x < 0]
    if bad:
        raise ArgumentError(f"{what}: proportions must be finite and >= 0, got {bad[0]} in {values}")
    if not any(values):
        raise ArgumentError(f"{what}: the proportions are all 0 ({values}): at least one must be > 0")
    return values


def layers_by_split(n_layer: int, tensor_split: Sequence[float]) -> tuple[list[int], int]:
    """(backend of each layer, backend of the output layer) from proportions, as llama.cpp's load_tensors:
    the cumulative split normalized to end at 1, and layer `il` (the output layer is `n_layer`) on
    `std::upper_bound(splits, float(il) / (n_layer + 1))`, every layer offloaded.

    In float32 as llama.cpp computes it, so a layer that falls on a split point lands where it does there
    (on the next backend: upper_bound looks for the first split point greater than the layer's)."""
    values = check_tensor_split(tensor_split, len(tensor_split))
    splits = np.cumsum(np.asarray(values, dtype=np.float32), dtype=np.float32)  # sequential, as the C loop
    splits = splits / splits[-1]
    act = np.float32(n_layer + 1)  # act_gpu_layers: the repeating layers and the output layer
    last = len(values) - 1

    def device(il: int) -> int:
        # searchsorted(side="right") is std::upper_bound; min() guards rounding at the very end
        return min(int(np.searchsorted(splits, np.float32(il) / act, side="right")), last)

    return [device(il) for il in range(n_layer)], device(n_layer)


def compile_overrides(override_tensor: Sequence[tuple[Any, Any]] | None,
                      resolve: Any) -> list[tuple[re.Pattern[str], int]]:
    """(compiled regex, backend position) of each (regex, backend) pair; `resolve(backend) -> int`.
    ArgumentError for a bad regex or pair, naming it."""
    out: list[tuple[re.Pattern[str], int]] = []
    for item in override_tensor or []:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise ArgumentError(f"override_tensor: each override is a (regex, backend) pair, got {item!r}")
        pattern, backend = item
        if isinstance(pattern, re.Pattern):
            compiled = pattern
        elif isinstance(pattern, str):
            try:
                compiled = re.compile(pattern)
            except re.error as e:
                raise ArgumentError(f"override_tensor: bad regex {pattern!r}: {e}") from None
        else:
            raise ArgumentError(f"override_tensor: the regex of {item!r} is not a string")
        out.append((compiled, resolve(backend)))
    return out
