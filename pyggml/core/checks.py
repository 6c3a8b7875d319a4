"""Argument checks shared by every layer, one helper per kind; bools and floats are refused as sizes (C would
truncate 2.5 to 2 without a word)."""

from __future__ import annotations

import math
import numbers
import os

from pyggml.core.errors import ArgumentError, ArgumentTypeError, OutOfMemoryError


def check_int(value: object, what: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an int, refusing bools, floats and anything not integral; optionally within [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(f"{what} must be an integer, got {type(value).__name__} {value!r}")
    v = int(value)
    if minimum is not None and v < minimum:
        raise ArgumentError(f"{what} must be >= {minimum}, got {v}")
    if maximum is not None and v > maximum:
        raise ArgumentError(f"{what} must be <= {maximum}, got {v}")
    return v


def check_size(value: object, what: str) -> int:
    """A byte count or element count: an int >= 0."""
    return check_int(value, what, minimum=0)


def check_positive(value: object, what: str) -> int:
    """A count that must be at least 1 (threads, graph size)."""
    return check_int(value, what, minimum=1)


def check_instance(value: object, cls: type | tuple[type, ...], what: str) -> None:
    """Refuse a value of the wrong class (an int where a Tensor is expected)."""
    if not isinstance(value, cls):
        names = cls.__name__ if isinstance(cls, type) else " or ".join(c.__name__ for c in cls)
        raise ArgumentTypeError(f"{what} must be a {names}, got {type(value).__name__} {value!r:.80}")


def available_host_memory() -> int:
    """Bytes of host memory an allocation may still get (MemAvailable on Linux; physical memory elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: let the allocation itself decide


def check_host_alloc(nbytes: int, what: str) -> None:
    """Raise OutOfMemoryError naming `what` when `nbytes` exceed the host memory still available."""
    avail = available_host_memory()
    if nbytes > avail:
        raise OutOfMemoryError(
            f"{what}: cannot allocate {nbytes} bytes ({nbytes / 2**30:.2f} GiB) of host memory, "
            f"{avail} bytes ({avail / 2**30:.2f} GiB) available"
        )


def check_real(value: object, what: str, *, finite: bool = False, minimum: float | None = None) -> float:
    """`value` as a float: a real number (ints too; bools and strings refused), optionally finite and >= minimum."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{what} must be a real number, got {type(value).__name__} {value!r:.80}")
    v = float(value)
    if finite and not math.isfinite(v):
        raise ArgumentError(f"{what} must be finite, got {v}")
    if minimum is not None and v < minimum:
        raise ArgumentError(f"{what} must be >= {minimum}, got {v}")
    return v
