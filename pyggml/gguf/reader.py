"""`GGUFFile`: a GGUF file read through `gguf.GGUFReader`, memory-mapped and validated.

The gguf package parses the header, the metadata and the tensor infos, and
maps the file with numpy (`mode="c"`: copy-on-write, so the mapping is
writable for `cpu_buffer_from_ptr` while the file itself never changes).
Everything the package lets through that would break a model later is checked
here, once, and raised as `GGUFError` naming the file and the numbers: a bad
magic or version, a file cut short inside the header or the tensor data, a
tensor type pyggml does not know, a tensor whose size does not match its
shape. Missing tensors and metadata are reported when asked for.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from pyggml.core.errors import GGUFError
from pyggml.core.types import TYPE_TRAITS, GGMLType

_MISSING = object()


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: ggml type and `ne` (innermost first), where its bytes lie in the file."""

    name: str
    type: GGMLType
    ne: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int

    def nelements(self) -> int:
        return int(np.prod(self.ne, dtype=np.int64)) if self.ne else 1


def _reader_class() -> type:
    """gguf.GGUFReader with the tensor infos checked before the package builds numpy views of them,
    so a bad type or a file cut short inside the tensor data is reported by tensor name."""
    import gguf

    class Reader(gguf.GGUFReader):  # type: ignore[misc]
        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            size = int(self.data.nbytes)
            for field in fields:
                _, name_data, _, dims, raw_dtype, offset_tensor = field.parts
                name = bytes(name_data).decode("utf-8", errors="replace")
                raw = int(raw_dtype[0])
                try:
                    t = GGMLType(raw)
                except ValueError:
                    raise GGUFError(f"tensor '{name}' has unsupported type {raw}") from None
                tr = TYPE_TRAITS[t]
                ne = [int(d) for d in dims]
                n = int(np.prod(ne, dtype=np.int64)) if ne else 1
                if ne and ne[0] % tr.blck_size:
                    raise GGUFError(f"tensor '{name}' ({t.name}) has ne[0]={ne[0]}, not a multiple of the block "
                                    f"size {tr.blck_size}")
                begin = start_offs + int(offset_tensor[0])
                end = begin + n // tr.blck_size * tr.type_size
                if end > size:
                    raise GGUFError(f"is truncated: tensor '{name}' ({t.name}, ne={ne}) needs bytes {begin}..{end}, "
                                    f"the file has {size} bytes")
            super()._build_tensors(start_offs, fields)

    return Reader


class GGUFFile:
    """A memory-mapped GGUF file: metadata by key, tensor infos by name, tensor bytes zero-copy.

    `fields` and `get_field` are the gguf reader's own (so code written for
    `gguf.GGUFReader` reads this object too); `get(key)` gives plain Python values.
    """

    def __init__(self, path: str | os.PathLike[str], mode: str = "c") -> None:
        self.path = os.fspath(path)
        self.name = os.path.basename(self.path)
        try:
            self.file_size = os.path.getsize(self.path)
        except OSError as e:
            raise GGUFError(f"cannot open GGUF file '{self.path}': {e.strerror or e}") from None
        if self.file_size < 24:
            raise GGUFError(f"'{self.name}' is truncated: {self.file_size} bytes is shorter than a GGUF header "
                            f"(24 bytes)")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise GGUFError(f"'{self.name}' is not a GGUF file (magic {magic!r}, expected b'GGUF')")
        try:
            self.reader = _reader_class()(self.path, mode)
        except GGUFError as e:
            sep = " " if str(e).startswith("is ") else ": "
            raise GGUFError(f"'{self.name}'{sep}{e}") from None
        except Exception as e:  # the package raises ValueError, IndexError, KeyError, ... on bad bytes
            raise GGUFError(f"'{self.name}' is corrupt or truncated ({self.file_size} bytes): "
                            f"{type(e).__name__}: {e}") from None
        self.fields = self.reader.fields
        self.alignment = int(self.reader.alignment)
        self.data_offset = int(self.reader.data_offset)
        self.data: np.ndarray = self.reader.data  # the whole file, mapped
        self.tensors: dict[str, TensorInfo] = {}
        for rt in self.reader.tensors:
            self.tensors[rt.name] = self._check_tensor(rt)
        self._values: dict[str, Any] = {}

    # --- validation ---

    def _check_tensor(self, rt: Any) -> TensorInfo:
        raw_type = int(rt.tensor_type)
        try:
            t = GGMLType(raw_type)
        except ValueError:
            raise GGUFError(f"'{self.name}': tensor '{rt.name}' has unsupported type {raw_type}") from None
        tr = TYPE_TRAITS.get(t)
        if tr is None or tr.type_size == 0:
            raise GGUFError(f"'{self.name}': tensor '{rt.name}' has unsupported type {t.name}")
        ne = tuple(int(x) for x in rt.shape)
        if any(n < 0 for n in ne):
            raise GGUFError(f"'{self.name}': tensor '{rt.name}' has a negative dimension, ne={list(ne)}")
        if ne and ne[0] % tr.blck_size:
            raise GGUFError(f"'{self.name}': tensor '{rt.name}' ({t.name}) has ne[0]={ne[0]}, not a multiple of "
                            f"the block size {tr.blck_size}")
        n = int(np.prod(ne, dtype=np.int64)) if ne else 1
        nbytes = n // tr.blck_size * tr.type_size
        offset = int(rt.data_offset)
        if (offset - self.data_offset) % self.alignment:
            raise GGUFError(f"'{self.name}': tensor '{rt.name}' at data offset {offset - self.data_offset} is not "
                            f"aligned to the file's alignment {self.alignment}")
        if offset + nbytes > self.file_size:
            raise GGUFError(f"'{self.name}' is truncated: tensor '{rt.name}' ({t.name}, ne={list(ne)}) needs bytes "
                            f"{offset}..{offset + nbytes}, the file has {self.file_size} bytes")
        return TensorInfo(rt.name, t, ne, offset, nbytes)

    # --- metadata ---

    def keys(self) -> list[str]:
        return [k for k in self.fields if not k.startswith("GGUF.")]

    def get_field(self, key: str) -> Any:
        """The gguf package's ReaderField of `key`, or None (as GGUFReader.get_field)."""
        return self.fields.get(key)

    def get(self, key: str, default: Any = _MISSING) -> Any:
        """The value of metadata `key` as Python (int, float, str, bool, list); `default` if absent,
        else GGUFError naming the key."""
        if key in self._values:
            return self._values[key]
        field = self.fields.get(key)
        if field is None:
            if default is _MISSING:
                raise GGUFError(f"'{self.name}': metadata key '{key}' is missing")
            return default
        try:
            value = field.contents()
        except Exception as e:
            raise GGUFError(f"'{self.name}': metadata key '{key}' cannot be read: {e}") from None
        self._values[key] = value
        return value

    @property
    def architecture(self) -> str:
        return str(self.get("general.architecture"))

    # --- tensors ---

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __iter__(self) -> Iterator[TensorInfo]:
        return iter(self.tensors.values())

    def tensor(self, name: str) -> TensorInfo:
        """The info of tensor `name`, or GGUFError naming the file and tensor."""
        info = self.tensors.get(name)
        if info is None:
            raise GGUFError(f"'{self.name}': tensor '{name}' is missing ({len(self.tensors)} tensors in the file)")
        return info

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The tensor's bytes in the mapping (uint8, zero-copy)."""
        info = self.tensor(name)
        return self.data[info.offset: info.offset + info.nbytes]

    def tensor_float(self, name: str) -> np.ndarray:
        """The tensor's values as float32, shape reversed `ne` (dequantized for quantized types)."""
        from pyggml.core.types import to_float

        info = self.tensor(name)
        tr = TYPE_TRAITS[info.type]
        raw = np.asarray(self.tensor_bytes(name))
        ne = list(info.ne) or [1]
        rows = int(np.prod(ne[1:], dtype=np.int64))
        if tr.blck_size > 1 or tr.np_dtype is None:
            values = to_float(info.type, raw.reshape(rows, -1), ne[0])
        else:
            values = to_float(info.type, raw.view(tr.np_dtype).reshape(rows, ne[0]))
        return np.asarray(values, dtype=np.float32).reshape(tuple(reversed(ne)))

    def close(self) -> None:
        """Drop the mapping (views handed out keep their memory alive)."""
        self.data = np.empty(0, dtype=np.uint8)
        self.reader = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"GGUFFile('{self.name}', {len(self.tensors)} tensors, {len(self.keys())} keys)"


def read_gguf(path: str | os.PathLike[str], mode: str = "c") -> GGUFFile:
    """Open and validate a GGUF file (memory-mapped copy-on-write by default)."""
    return GGUFFile(path, mode)
