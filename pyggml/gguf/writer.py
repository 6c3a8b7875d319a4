"""Writing GGUF files: a thin layer over `gguf.GGUFWriter` for tests and tools.

`write_gguf(path, arch, metadata, tensors)` writes a whole file at once.
Metadata values are typed from their Python type (bool, int, float, str, and
lists of those; ints become UINT32, or INT32/UINT64/INT64 when they do not
fit) unless given as `(value, gguf.GGUFValueType)`. Tensors are float arrays
written as F32/F16 or quantized with pyggml's byte-exact quantizers, or raw
bytes already in a type (`RawTensor`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pyggml.core.errors import ArgumentError, GGUFError
from pyggml.core.types import TYPE_TRAITS, GGMLType, as_type, from_float


@dataclass
class RawTensor:
    """Bytes already in ggml type `type`, with shape `ne` (innermost first)."""

    data: np.ndarray
    type: GGMLType
    ne: tuple[int, ...]


def _value_type(value: Any, key: str) -> Any:
    from gguf import GGUFValueType as VT

    if isinstance(value, bool):
        return VT.BOOL
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if 0 <= v < 2**32:
            return VT.UINT32
        if -(2**31) <= v < 0:
            return VT.INT32
        if 0 <= v < 2**64:
            return VT.UINT64
        return VT.INT64
    if isinstance(value, (float, np.floating)):
        return VT.FLOAT32
    if isinstance(value, (str, bytes)):
        return VT.STRING
    if isinstance(value, (list, tuple, np.ndarray)):
        return VT.ARRAY
    raise ArgumentError(f"write_gguf: metadata '{key}' has a value of type {type(value).__name__} "
                        f"that GGUF cannot hold")


def _add_metadata(writer: Any, key: str, value: Any) -> None:
    from gguf import GGUFValueType as VT

    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], VT):
        value, vtype = value
    else:
        vtype = _value_type(value, key)
    if vtype == VT.ARRAY:
        items = list(value)
        if not items:
            writer.add_key_value(key, [], VT.ARRAY, sub_type=VT.UINT32)
            return
        sub = _value_type(items[0], key)
        if sub == VT.UINT32 and any(int(x) < 0 for x in items):
            sub = VT.INT32
        if sub == VT.FLOAT32:
            items = [float(x) for x in items]
        writer.add_key_value(key, items, VT.ARRAY, sub_type=sub)
        return
    writer.add_key_value(key, value, vtype)


def _tensor_payload(name: str, value: Any, type: GGMLType | None) -> tuple[np.ndarray, GGMLType, tuple[int, ...]]:
    """(bytes or elements to write, ggml type, ne) of one tensor."""
    if isinstance(value, RawTensor):
        return np.ascontiguousarray(value.data), value.type, tuple(value.ne)
    arr = np.asarray(value)
    t = GGMLType.F32 if type is None else as_type(type)
    ne = tuple(reversed(arr.shape))
    tr = TYPE_TRAITS[t]
    if ne and ne[0] % tr.blck_size:
        raise ArgumentError(f"write_gguf: tensor '{name}' has rows of {ne[0]} elements, not a multiple of "
                            f"{t.name}'s block size {tr.blck_size}")
    rows = np.asarray(arr, dtype=np.float32).reshape(-1, ne[0] if ne else 1)
    return np.ascontiguousarray(from_float(t, rows)), t, ne


def write_gguf(path: str | os.PathLike[str], arch: str, metadata: Mapping[str, Any],
               tensors: Mapping[str, Any], types: Mapping[str, GGMLType] | None = None,
               alignment: int | None = None) -> None:
    """Write a GGUF file: `general.architecture` = `arch`, the `metadata`, and `tensors` in order.

    A tensor is a float array in numpy order (reversed `ne`), written as
    `types[name]` (default F32), or a `RawTensor`.
    """
    import gguf

    types = types or {}
    writer = gguf.GGUFWriter(os.fspath(path), arch)
    try:
        if alignment is not None:
            writer.add_custom_alignment(alignment)
        for key, value in metadata.items():
            if key == "general.architecture":
                continue
            _add_metadata(writer, key, value)
        for name, value in tensors.items():
            data, t, ne = _tensor_payload(name, value, types.get(name))
            raw_dtype = gguf.GGMLQuantizationType(int(t))
            if t in (GGMLType.F32, GGMLType.F16):
                writer.add_tensor(name, data.reshape(tuple(reversed(ne))) if ne else data)
            else:
                tr = TYPE_TRAITS[t]
                ne_bytes = [*ne] or [1]
                ne_bytes[0] = ne_bytes[0] // tr.blck_size * tr.type_size  # the package takes the byte shape
                writer.add_tensor(name, data.view(np.uint8).reshape(tuple(reversed(ne_bytes))), raw_dtype=raw_dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    except GGUFError:
        raise
    except (ValueError, TypeError) as e:
        raise GGUFError(f"write_gguf '{os.fspath(path)}': {e}") from None
    finally:
        writer.close()
