"""`GGUFFile`: a GGUF file memory-mapped and parsed by pyggml's own checked parser.

The file is mapped with numpy (`mode="c"`: copy-on-write, so the mapping is
writable for `cpu_buffer_from_ptr` while the file itself never changes) and
its header is walked once, front to back. Every number the file gives is
checked before anything loops over it or allocates for it: counts (tensors,
keys, array entries) and lengths (keys, strings, names) against the bytes left
in the file and against the named limits below, value types against GGUF's,
tensor dimensions (at most `GGML_MAX_DIMS`, each >= 0 as llama.cpp's gguf.cpp
allows: 0 is an empty tensor; product within int64), tensor types against
ggml's, `general.alignment` (UINT32, a power of two, at most
`GGUF_MAX_ALIGNMENT`), and each tensor's offset (aligned) and extent (inside
the data section). A claim of 2^62 entries costs one comparison. Every failure
is a `GGUFError` naming the file, the key or tensor, the byte offset in the
file and the numbers, e.g. "'m.gguf': GGUF key 'tokenizer.ggml.tokens' at byte
560: array of 4611686018427387904 STRING entries (length at byte 597) needs at
least 36893488147419103232 bytes but only 6878947 remain (the file has 6879552
bytes: truncated or corrupt)".

The metadata comes out as the gguf package's `ReaderField`s (so code written
for `gguf.GGUFReader` reads this object too: `fields`, `get_field`,
`contents()`), views of the mapping. One difference: an array of numbers is
one part holding all its entries (the package makes one numpy array per
entry). The package's own reader is still there as `reader`, built on first
use, after these checks have passed.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from gguf import GGUFValueType as VT
from gguf.gguf_reader import ReaderField

from pyggml.core.errors import ArgumentError, GGUFError
from pyggml.core.tensor import GGML_MAX_DIMS, GGML_MAX_NAME
from pyggml.core.types import TYPE_TRAITS, GGMLType

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)  # v1 (32-bit counts) is gone from llama.cpp and the gguf package too
GGUF_DEFAULT_ALIGNMENT = 32
GGUF_HEADER_SIZE = 24  # magic, version, n_tensors, n_kv

# Sane limits, far above any real model (largest vocabularies ~262k tokens, ~1k tensors per file, ~50 keys).
# They bound the Python objects a hostile file can make us build before the bytes-left checks would.
GGUF_MAX_KV = 1 << 16
GGUF_MAX_TENSORS = 1 << 20
GGUF_MAX_KEY_LENGTH = 65535  # the GGUF spec's limit on keys
GGUF_MAX_ARRAY_ENTRIES = 1 << 30  # llama.cpp's GGUF_MAX_ARRAY_ELEMENTS
GGUF_MAX_STRING_ARRAY_ENTRIES = 1 << 22  # each string is two numpy views: ~250 bytes of Python objects
GGUF_MAX_ALIGNMENT = 1 << 24
INT64_MAX = 2**63 - 1

_MISSING = object()

# (struct format, numpy dtype) of the fixed-size value types; GGUF is little-endian
_SCALARS: dict[VT, tuple[str, np.dtype]] = {
    VT.UINT8: ("<B", np.dtype("<u1")), VT.INT8: ("<b", np.dtype("<i1")),
    VT.UINT16: ("<H", np.dtype("<u2")), VT.INT16: ("<h", np.dtype("<i2")),
    VT.UINT32: ("<I", np.dtype("<u4")), VT.INT32: ("<i", np.dtype("<i4")),
    VT.FLOAT32: ("<f", np.dtype("<f4")), VT.BOOL: ("<?", np.dtype(np.bool_)),
    VT.UINT64: ("<Q", np.dtype("<u8")), VT.INT64: ("<q", np.dtype("<i8")),
    VT.FLOAT64: ("<d", np.dtype("<f8")),
}
_U32 = np.dtype("<u4")
_U64 = np.dtype("<u8")
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, a 1-byte key, value type, a 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset (empty name, no dims)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: ggml type and `ne` (innermost first), where its bytes lie in the file."""

    name: str
    type: GGMLType
    ne: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int
    info_offset: int = -1  # byte offset of the tensor's info (its name length) in the header

    def nelements(self) -> int:
        return math.prod(self.ne)


class _Info(NamedTuple):
    """A tensor info as parsed, before the data section is known."""

    name: str
    type: GGMLType
    ne: tuple[int, ...]
    rel: int  # data offset relative to the data section
    nbytes: int
    info_offset: int


class _Parser:
    """One pass over a GGUF header in `buf`: every read is checked against the bytes left first."""

    def __init__(self, name: str, base: np.ndarray) -> None:
        self.name = name
        self.base = base  # the mapping as a plain uint8 ndarray (slicing a np.memmap is slower)
        self.buf = memoryview(base)
        self.size = len(base)

    def fail(self, where: str, what: str) -> GGUFError:
        return GGUFError(f"'{self.name}': {where}: {what}")

    def need(self, off: int, nbytes: int, where: str, what: str, at_least: bool = False, verb: str = "needs") -> None:
        """Raise unless `nbytes` bytes from `off` lie in the file. `what` says what they are."""
        left = self.size - off
        if nbytes > left:
            raise self.fail(where, f"{what} {verb} {'at least ' if at_least else ''}{nbytes} bytes but only "
                                   f"{max(left, 0)} remain (the file has {self.size} bytes: truncated or corrupt)")

    def u32(self, off: int, where: str, what: str) -> int:
        self.need(off, 4, where, what)
        return struct.unpack_from("<I", self.buf, off)[0]

    def u64(self, off: int, where: str, what: str) -> int:
        self.need(off, 8, where, what)
        return struct.unpack_from("<Q", self.buf, off)[0]

    def view(self, off: int, nbytes: int, dtype: np.dtype | None = None) -> np.ndarray:
        part = self.base[off: off + nbytes]
        return part if dtype is None else part.view(dtype)

    # --- values ---

    def string(self, off: int, where: str, what: str, limit: int | None = None) -> tuple[int, int, int]:
        """(offset of the bytes, their length, offset after them) of the string whose length is at `off`."""
        n = self.u64(off, where, f"the length of {what}")
        self.need(off + 8, n, where, f"{what} of {n} bytes")
        if limit is not None and n > limit:
            raise self.fail(where, f"{what} of {n} bytes is longer than the limit of {limit} bytes")
        return off + 8, n, off + 8 + n

    def text(self, off: int, n: int, where: str, what: str) -> str:
        try:
            return bytes(self.buf[off: off + n]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(where, f"{what} is not valid UTF-8 (byte {off + e.start})") from None

    def value(self, off: int, vtype: VT, where: str) -> tuple[list[np.ndarray], list[int], list[VT], int]:
        """(parts, data indices into parts, types, offset after) of a value of `vtype` at `off`."""
        if vtype in _SCALARS:
            dtype = _SCALARS[vtype][1]
            self.need(off, dtype.itemsize, where, f"a {vtype.name} value")
            return [self.view(off, dtype.itemsize, dtype)], [0], [vtype], off + dtype.itemsize
        if vtype == VT.STRING:
            start, n, end = self.string(off, where, "a string")
            return [self.view(off, 8, _U64), self.view(start, n)], [1], [vtype], end
        # an array: entry type, count, entries
        raw = self.u32(off, where, "the array's entry type")
        itype = self.value_type(raw, where, f"array entry type {raw} at byte {off}")
        if itype == VT.ARRAY:
            raise self.fail(where, f"an array of arrays at byte {off}: nested arrays are not supported "
                                   f"(llama.cpp rejects them too)")
        count = self.u64(off + 4, where, "the array's length")
        parts = [self.view(off, 4, _U32), self.view(off + 4, 8, _U64)]
        types = [VT.ARRAY, itype] if count else [VT.ARRAY]  # as the package's reader: no entry, no entry type
        pos = off + 12
        per_entry = _SCALARS[itype][1].itemsize if itype in _SCALARS else 8  # a string is >= its length field
        limit = GGUF_MAX_STRING_ARRAY_ENTRIES if itype == VT.STRING else GGUF_MAX_ARRAY_ENTRIES
        self.need(pos, count * per_entry, where, f"array of {count} {itype.name} entries (length at byte {off + 4})",
                  at_least=itype == VT.STRING)
        if count > limit:
            raise self.fail(where, f"array of {count} {itype.name} entries (length at byte {off + 4}) is longer "
                                   f"than the limit of {limit} entries")
        if itype != VT.STRING:
            nbytes = count * per_entry
            return [*parts, self.view(pos, nbytes, _SCALARS[itype][1])], [2], types, pos + nbytes
        data: list[int] = []
        unpack = struct.Struct("<Q").unpack_from
        size = self.size
        for i in range(count):
            if pos + 8 > size:
                self.need(pos, 8, where, f"the length of string [{i}] of {count}")
            n = unpack(self.buf, pos)[0]
            if n > size - pos - 8:
                self.need(pos + 8, n, where, f"string [{i}] of {count} ({n} bytes, length at byte {pos})")
            parts.append(self.view(pos, 8, _U64))
            parts.append(self.view(pos + 8, n))
            data.append(len(parts) - 1)
            pos += 8 + n
        return parts, data, types, pos

    def value_type(self, raw: int, where: str, what: str) -> VT:
        try:
            return VT(raw)
        except ValueError:
            valid = ", ".join(f"{t.value} {t.name}" for t in VT)
            raise self.fail(where, f"unknown GGUF value type: {what} (valid: {valid})") from None

    # --- the file ---

    def header(self) -> tuple[int, int, int]:
        """(version, n_tensors, n_kv), each checked."""
        version = struct.unpack_from("<I", self.buf, 4)[0]
        where = "GGUF header"
        if version not in GGUF_VERSIONS:
            if version and version & 0xFFFF == 0:
                raise self.fail(where, f"unsupported GGUF version {version} at byte 4 (0x{version:08x}: a "
                                       f"big-endian file?); pyggml reads little-endian GGUF versions 2 and 3")
            raise self.fail(where, f"unsupported GGUF version {version} at byte 4 (pyggml reads versions 2 and 3)")
        n_tensors, n_kv = struct.unpack_from("<QQ", self.buf, 8)
        self.need(GGUF_HEADER_SIZE, n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES, where,
                  f"{n_tensors} tensor infos (count at byte 8) and {n_kv} metadata keys (count at byte 16)",
                  at_least=True, verb="need")
        if n_tensors > GGUF_MAX_TENSORS:
            raise self.fail(where, f"tensor count {n_tensors} at byte 8 is above the limit of {GGUF_MAX_TENSORS}")
        if n_kv > GGUF_MAX_KV:
            raise self.fail(where, f"metadata key count {n_kv} at byte 16 is above the limit of {GGUF_MAX_KV}")
        return version, n_tensors, n_kv

    def kv(self, off: int, i: int, n_kv: int, fields: dict[str, ReaderField]) -> int:
        """Parse metadata pair `i` at `off` into `fields`; return the offset after it."""
        where = f"GGUF key #{i} of {n_kv} at byte {off}"
        start, n, pos = self.string(off, where, "the key", GGUF_MAX_KEY_LENGTH)
        if n == 0:
            raise self.fail(where, "the key is empty")
        key = self.text(start, n, where, "the key")
        where = f"GGUF key '{key}' at byte {off}"
        if key in fields:
            raise self.fail(where, f"duplicate key (first at byte {fields[key].offset})")
        raw = self.u32(pos, where, "the value type")
        vtype = self.value_type(raw, where, f"{raw} at byte {pos}")
        parts, data, types, end = self.value(pos + 4, vtype, where)
        head = [self.view(off, 8, _U64), self.view(start, n), self.view(pos, 4, _U32)]
        fields[key] = ReaderField(off, key, head + parts, [d + 3 for d in data], types)
        return end

    def tensor_info(self, off: int, i: int, n_tensors: int, seen: dict[str, int]) -> tuple[_Info, int]:
        """Tensor info `i` at `off` (its data offset still relative to the data section), and the offset after it."""
        where = f"tensor #{i} of {n_tensors} at byte {off}"
        start, n, pos = self.string(off, where, "the tensor name")
        if n >= GGML_MAX_NAME:
            raise self.fail(where, f"the tensor name of {n} bytes is too long (ggml's GGML_MAX_NAME is "
                                   f"{GGML_MAX_NAME}: at most {GGML_MAX_NAME - 1} bytes)")
        name = self.text(start, n, where, "the tensor name")
        where = f"tensor '{name}' at byte {off}"
        if name in seen:
            raise self.fail(where, f"duplicate tensor name (first at byte {seen[name]})")
        n_dims = self.u32(pos, where, "the number of dimensions")
        if n_dims > GGML_MAX_DIMS:
            raise self.fail(where, f"{n_dims} dimensions at byte {pos}; ggml tensors have at most {GGML_MAX_DIMS}")
        dims_off = pos + 4
        self.need(dims_off, 8 * n_dims, where, f"{n_dims} dimensions")
        ne = struct.unpack_from(f"<{n_dims}Q", self.buf, dims_off)
        nelements = 1
        for j, d in enumerate(ne):
            if d > INT64_MAX:  # negative as int64; 0 is an empty tensor, as in llama.cpp's gguf.cpp
                raise self.fail(where, f"ne[{j}] = {d} ({d - 2**64} as int64) at byte {dims_off + 8 * j}: every "
                                       f"dimension must be >= 0 (ne={list(ne)})")
            nelements *= d
        if nelements > INT64_MAX:
            raise self.fail(where, f"ne={list(ne)} has {nelements} elements, more than int64 holds ({INT64_MAX})")
        type_off = dims_off + 8 * n_dims
        raw_type = self.u32(type_off, where, "the tensor type")
        try:
            t = GGMLType(raw_type)
        except ValueError:
            known = ", ".join(f"{x.value} {x.name}" for x in GGMLType)
            raise self.fail(where, f"unknown ggml type {raw_type} at byte {type_off} (pyggml knows: {known})") from None
        tr = TYPE_TRAITS[t]
        if ne and ne[0] % tr.blck_size:
            raise self.fail(where, f"{t.name} tensor with ne[0]={ne[0]}, not a multiple of the block size "
                                   f"{tr.blck_size}")
        rel = self.u64(type_off + 4, where, "the tensor data offset")
        nbytes = nelements // tr.blck_size * tr.type_size
        return _Info(name, t, tuple(ne), rel, nbytes, off), type_off + 12

    def alignment(self, fields: dict[str, ReaderField]) -> int:
        field = fields.get("general.alignment")
        if field is None:
            return GGUF_DEFAULT_ALIGNMENT
        where = f"GGUF key 'general.alignment' at byte {field.offset}"
        if field.types != [VT.UINT32]:
            found = " of ".join(t.name for t in field.types)
            raise self.fail(where, f"has GGUF type {found}, must be UINT32 (as llama.cpp requires)")
        a = int(field.parts[-1][0])
        if a == 0 or a & (a - 1):
            raise self.fail(where, f"alignment {a} is not a power of two")
        if a > GGUF_MAX_ALIGNMENT:
            raise self.fail(where, f"alignment {a} is above the limit of {GGUF_MAX_ALIGNMENT}")
        return a


class GGUFFile:
    """A memory-mapped GGUF file: metadata by key, tensor infos by name, tensor bytes zero-copy.

    `fields` and `get_field` are shaped like the gguf reader's (so code written for
    `gguf.GGUFReader` reads this object too); `get(key)` gives plain Python values.
    """

    def __init__(self, path: str | os.PathLike[str], mode: str = "c") -> None:
        if mode not in ("r", "c", "r+"):
            raise ArgumentError(f"read_gguf: mode must be 'r', 'c' or 'r+' (as numpy.memmap), got {mode!r}")
        self.path = os.fspath(path)
        self.name = os.path.basename(self.path)
        self.mode = mode
        self._reader: Any = None
        try:
            self.file_size = os.path.getsize(self.path)
            if self.file_size >= GGUF_HEADER_SIZE:
                self.data: np.ndarray = np.memmap(self.path, dtype=np.uint8, mode=mode)  # type: ignore[call-overload]
                self.file_size = len(self.data)  # what is mapped is what counts (the file may have changed)
        except OSError as e:
            raise GGUFError(f"cannot open GGUF file '{self.path}': {e.strerror or e}") from None
        if self.file_size < GGUF_HEADER_SIZE:
            raise GGUFError(f"'{self.name}' is truncated: {self.file_size} bytes is shorter than a GGUF header "
                            f"({GGUF_HEADER_SIZE} bytes)")
        self._advise("MADV_RANDOM")  # the header page by page: no read-around into the tensors behind it
        base = self.data.view(np.ndarray)
        magic = bytes(base[:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"'{self.name}' is not a GGUF file (magic {magic!r} at byte 0, expected b'GGUF')")
        p = _Parser(self.name, base)
        self.version, n_tensors, n_kv = p.header()
        fields: OrderedDict[str, ReaderField] = OrderedDict()
        fields["GGUF.version"] = ReaderField(4, "GGUF.version", [p.view(4, 4, _U32)], [0], [VT.UINT32])
        fields["GGUF.tensor_count"] = ReaderField(8, "GGUF.tensor_count", [p.view(8, 8, _U64)], [0], [VT.UINT64])
        fields["GGUF.kv_count"] = ReaderField(16, "GGUF.kv_count", [p.view(16, 8, _U64)], [0], [VT.UINT64])
        off = GGUF_HEADER_SIZE
        for i in range(n_kv):
            off = p.kv(off, i, n_kv, fields)
        seen: dict[str, int] = {}
        infos: list[_Info] = []
        for i in range(n_tensors):
            info, off = p.tensor_info(off, i, n_tensors, seen)
            seen[info.name] = info.info_offset
            infos.append(info)
        self.alignment = p.alignment(fields)
        self.data_offset = -(-off // self.alignment) * self.alignment  # the data section starts aligned
        self.fields = fields
        self.tensors: dict[str, TensorInfo] = {}
        data_size = self.file_size - self.data_offset
        if infos and data_size < 0:
            raise GGUFError(f"'{self.name}' is truncated: the tensor data of {n_tensors} tensors starts at byte "
                            f"{self.data_offset} (header end {off} padded to alignment {self.alignment}), "
                            f"the file has {self.file_size} bytes")
        for name, t, ne, rel, nbytes, info_offset in infos:
            where = f"'{self.name}': tensor '{name}' at byte {info_offset}"
            if rel % self.alignment:
                raise GGUFError(f"{where}: data offset {rel} is not a multiple of the file's alignment "
                                f"{self.alignment}")
            begin = self.data_offset + rel
            if rel > data_size or nbytes > data_size - rel:
                raise GGUFError(f"'{self.name}' is truncated or corrupt: tensor '{name}' ({t.name}, ne={list(ne)}, "
                                f"info at byte {info_offset}) needs bytes {begin}..{begin + nbytes}, the file has "
                                f"{self.file_size} bytes")
            self.tensors[name] = TensorInfo(name, t, ne, begin, nbytes, info_offset)
        self._values: dict[str, Any] = {}
        self._advise("MADV_NORMAL")

    @property
    def reader(self) -> Any:
        """The gguf package's own `GGUFReader` of this file (built on first use; the checks above passed first,
        so its loops are bounded by the file), for code that wants the package's objects (`ReaderTensor`)."""
        if self._reader is None:
            import gguf

            try:
                self._reader = gguf.GGUFReader(self.path, self.mode)  # type: ignore[arg-type]
            except Exception as e:  # the package raises ValueError, KeyError, ... on what it dislikes
                raise GGUFError(f"'{self.name}': the gguf package cannot read it: {type(e).__name__}: {e}") from None
        return self._reader

    # --- metadata ---

    def keys(self) -> list[str]:
        return [k for k in self.fields if not k.startswith("GGUF.")]

    def get_field(self, key: str) -> Any:
        """The `ReaderField` of `key`, or None (as GGUFReader.get_field)."""
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
        except Exception as e:  # a string that is not UTF-8
            raise GGUFError(f"'{self.name}': metadata key '{key}' at byte {field.offset} cannot be read: "
                            f"{type(e).__name__}: {e}") from None
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

    def read_pages_on_demand(self) -> None:
        """A page fault in the mapping reads that page's neighbourhood alone (MADV_RANDOM), not the kernel's
        read-around of megabytes, which from any tensor's page would pull in the experts beside it: the experts
        a token does not use stay on disk."""
        self._advise("MADV_RANDOM")

    def release_pages(self, name: str) -> None:
        """Drop from this process the mapping's pages wholly inside tensor `name` (MADV_DONTNEED), once its bytes
        are copied elsewhere (a repacked weight): they would stay resident beside the copy; a later read of them
        faults them in again from the file."""
        mapping = getattr(self.data, "_mmap", None)
        if mapping is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        info = self.tensor(name)
        start = -(-info.offset // mmap.PAGESIZE) * mmap.PAGESIZE
        end = (info.offset + info.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if end > start:
            mapping.madvise(mmap.MADV_DONTNEED, start, end - start)

    def _advise(self, advice: str) -> None:
        """madvise the whole mapping, where the platform has `advice`."""
        mapping = getattr(self.data, "_mmap", None)  # numpy.memmap's mmap.mmap of the whole file
        if mapping is not None and hasattr(mmap, advice):
            mapping.madvise(getattr(mmap, advice))

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
        rows = math.prod(ne[1:])
        if tr.blck_size > 1 or tr.np_dtype is None:
            values = to_float(info.type, raw.reshape(rows, -1), ne[0])
        else:
            values = to_float(info.type, raw.view(tr.np_dtype).reshape(rows, ne[0]))
        return np.asarray(values, dtype=np.float32).reshape(tuple(reversed(ne)))

    def close(self) -> None:
        """Drop the mapping (views handed out keep their memory alive)."""
        self.data = np.empty(0, dtype=np.uint8)
        self._reader = None

    def __repr__(self) -> str:
        return f"GGUFFile('{self.name}', {len(self.tensors)} tensors, {len(self.keys())} keys)"


def read_gguf(path: str | os.PathLike[str], mode: str = "c") -> GGUFFile:
    """Open and validate a GGUF file (memory-mapped copy-on-write by default)."""
    return GGUFFile(path, mode)
