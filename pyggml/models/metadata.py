"""Reading a model's metadata with its GGUF types checked, and the error a bad model file raises.

`read_int`, `read_float` and `read_str` give a key's value when its GGUF type
is the kind expected (any integer type where llama.cpp writes UINT32, FLOAT32
or FLOAT64 for floats) and its value is in range, else `ModelFileError`
naming the file, the key and the value, or the type found and the one
expected.

`ModelFileError` is a `ModelError` and a `GGUFError` too, because `load`
raised GGUFError for such files before (an unsupported architecture, a
missing or wrong-shaped tensor): code that catches GGUFError around `load`
keeps working.
"""

from __future__ import annotations

import math
from typing import Any

from pyggml.core.errors import GGUFError, ModelError
from pyggml.gguf.reader import GGUFFile


class ModelFileError(ModelError, GGUFError):
    """A model file's hyper-parameters, tokenizer metadata or tensors are missing, mistyped or out of range."""


INT32_MAX = 2**31 - 1  # ggml keeps dimensions and op params (n_rot, n_ctx_orig) in int32 fields

_MISSING = object()
_INT_TYPES = frozenset({"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64"})
_FLOAT_TYPES = frozenset({"FLOAT32", "FLOAT64"})


def python_type(value: Any) -> str:
    """A GGUF type name for a value, where the reader gives no per-field types."""
    if isinstance(value, bool):
        return "BOOL"
    if isinstance(value, int):
        return "INT64"
    if isinstance(value, float):
        return "FLOAT64"
    if isinstance(value, str):
        return "STRING"
    if isinstance(value, list | tuple):
        return f"ARRAY of {python_type(value[0])}" if value else "ARRAY (empty)"
    return type(value).__name__


def field_type(field: Any) -> str | None:
    """The GGUF type of a gguf ReaderField ("UINT32", "ARRAY of STRING"); None where the reader gives none."""
    names = [getattr(t, "name", str(t)) for t in getattr(field, "types", None) or []]
    if not names:
        return None
    if names[0] == "ARRAY":
        return f"ARRAY of {names[1]}" if len(names) > 1 else "ARRAY (empty)"
    return names[0]


def gguf_type(gf: GGUFFile, key: str) -> str | None:
    """The GGUF type of metadata `key` as the file stores it ("UINT32", "ARRAY of STRING"), None if absent."""
    field = gf.get_field(key)
    if field is None:
        return None
    return field_type(field) or python_type(gf.get(key))


def _typed(gf: GGUFFile, key: str, accepted: frozenset[str], expected: str, default: Any) -> tuple[bool, Any]:
    """(True, the value of `key`) if its GGUF type is one of `accepted`; (False, `default`) if absent, or
    ModelFileError when there is no default."""
    found = gguf_type(gf, key)
    if found is None:
        if default is _MISSING:
            raise ModelFileError(f"'{gf.name}': metadata key '{key}' is missing")
        return False, default
    if found not in accepted:
        raise ModelFileError(f"'{gf.name}': '{key}' has GGUF type {found}, expected {expected}")
    return True, gf.get(key)


def read_int(gf: GGUFFile, key: str, default: Any = _MISSING, minimum: int = 1, maximum: int = INT32_MAX) -> Any:
    """Integer metadata `key` (any GGUF integer type, as llama.cpp's UINT32) within [minimum, maximum],
    or `default` when absent; else ModelFileError naming the key, the value or the type found."""
    present, value = _typed(gf, key, _INT_TYPES, "an integer type (UINT32)", default)
    if not present:
        return value
    v = int(value)
    if v < minimum:
        raise ModelFileError(f"'{gf.name}': '{key}' = {v} must be >= {minimum}")
    if v > maximum:
        raise ModelFileError(f"'{gf.name}': '{key}' = {v} must be <= {maximum}")
    return v


def read_float(gf: GGUFFile, key: str, default: Any = _MISSING, allow_zero: bool = False) -> Any:
    """Float metadata `key` (FLOAT32 or FLOAT64), finite and > 0 (>= 0 with `allow_zero`), or `default`
    when absent; else ModelFileError naming the key, the value or the type found."""
    present, value = _typed(gf, key, _FLOAT_TYPES, "FLOAT32", default)
    if not present:
        return value
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ModelFileError(f"'{gf.name}': '{key}' = {v:g} must be {'>=' if allow_zero else '>'} 0 and finite")
    return v


def read_bool(gf: GGUFFile, key: str, default: Any = _MISSING) -> Any:
    """Boolean metadata `key`, or `default` when absent; else ModelFileError naming the key and the type found."""
    present, value = _typed(gf, key, frozenset({"BOOL"}), "BOOL", default)
    return bool(value) if present else value


def read_str(gf: GGUFFile, key: str, default: Any = _MISSING) -> Any:
    """String metadata `key`, or `default` when absent; else ModelFileError naming the key and the type found."""
    return _typed(gf, key, frozenset({"STRING"}), "STRING", default)[1]
