"""Bad-input catalog of GGUF files: every count, length, type id, dimension, offset and alignment of a file.

Each bad file is a small valid GGUF (`VALID`, built byte by byte with the helpers below) with one thing
changed. Each case asserts GGUFError, that the message names the file, the key or tensor, the byte
offset and the numbers, and that a valid file still reads afterwards. The cases whose file claims
2^62 entries or bytes (which made the old reader loop and allocate without bound) run in a child
process with a time and address-space limit. Then the writer: every key llama.cpp reads is written
with llama.cpp's type, values that do not fit raise ArgumentError and leave no file. Last, the CLI on
bad files: one line on stderr, exit 1, no traceback.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFValueType as VT

import pyggml.gguf.reader as reader_mod
from pyggml.core.errors import ArgumentError, ArgumentTypeError, GGUFError
from pyggml.core.types import GGMLType
from pyggml.gguf import RawTensor, read_gguf, write_gguf
from pyggml.gguf.writer import llama_cpp_key_type
from pyggml.models.builtin import builtin_model_path
from robustness.conftest import expect_error

HUGE = 2**62  # a count or length no file can back
U64_MAX = 2**64 - 1

# --- GGUF bytes by hand ---


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def gstr(text: str | bytes, length: int | None = None) -> bytes:
    """A GGUF string: u64 length (or a lying `length`), then the bytes."""
    raw = text.encode() if isinstance(text, str) else text
    return u64(len(raw) if length is None else length) + raw


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + u32(vtype) + payload


def kv_str(key: str, text: str) -> bytes:
    return kv(key, VT.STRING, gstr(text))


def kv_u32(key: str, v: int) -> bytes:
    return kv(key, VT.UINT32, u32(v))


def kv_arr(key: str, itype: int, items: bytes, count: int) -> bytes:
    return kv(key, VT.ARRAY, u32(itype) + u64(count) + items)


def tinfo(name: str | bytes, dims: list[int], ggml_type: int, offset: int, n_dims: int | None = None) -> bytes:
    """A tensor info: name, n_dims, dims (u64, innermost first), type, data offset."""
    return (gstr(name) + u32(len(dims) if n_dims is None else n_dims) + b"".join(u64(d) for d in dims)
            + u32(ggml_type) + u64(offset))


def gguf(kvs: list[bytes], infos: list[bytes], data: bytes = b"", *, n_kv: int | None = None,
         n_tensors: int | None = None, version: int = 3, magic: bytes = b"GGUF", alignment: int = 32) -> bytes:
    """A whole file: header, the metadata pairs, the tensor infos, padding to `alignment`, then `data`."""
    head = (magic + u32(version) + u64(len(infos) if n_tensors is None else n_tensors)
            + u64(len(kvs) if n_kv is None else n_kv))
    body = head + b"".join(kvs) + b"".join(infos)
    return body + bytes(-len(body) % alignment) + data


VALID_KVS = [kv_str("general.architecture", "llama"), kv_str("general.name", "tiny"),
             kv_arr("test.ids", VT.UINT32, u32(1) + u32(2) + u32(3), 3),
             kv_arr("test.words", VT.STRING, gstr("a") + gstr("bc"), 2)]
A_VALUES = np.arange(8, dtype=np.float32)
VALID_INFOS = [tinfo("a", [4, 2], GGMLType.F32, 0), tinfo("b", [8], GGMLType.F32, 32)]
VALID_DATA = A_VALUES.tobytes() + np.full(8, 0.5, np.float32).tobytes()
VALID = gguf(VALID_KVS, VALID_INFOS, VALID_DATA)


def offset_of(blob: bytes, part: bytes) -> int:
    """Where `part` starts in `blob` (it must be there once)."""
    assert blob.count(part) == 1, part
    return blob.index(part)


def check_valid(path: Path) -> None:
    """The follow-up of every case: a valid file reads, with its metadata and tensor values."""
    path.write_bytes(VALID)
    gf = read_gguf(path)
    assert gf.get("general.name") == "tiny" and gf.get("test.ids") == [1, 2, 3] and gf.get("test.words") == ["a", "bc"]
    assert gf.tensor("a").ne == (4, 2) and np.array_equal(gf.tensor_float("a"), A_VALUES.reshape(2, 4))
    assert np.array_equal(gf.tensor_float("b"), np.full(8, 0.5, np.float32))


def expect_bad(tmp_path: Path, blob: bytes, *fragments: str) -> GGUFError:
    """Write `blob`, assert read_gguf raises GGUFError naming the file and `fragments`, then read a valid file."""
    path = tmp_path / "bad.gguf"
    path.write_bytes(blob)
    err = expect_error(lambda: read_gguf(path), GGUFError, "'bad.gguf'", *fragments)
    check_valid(tmp_path / "good.gguf")
    return err  # type: ignore[return-value]


# --- the catalog ---
# (id, file bytes, fragments of the message); offsets are computed from the bytes so they are exact

K0 = 24  # the first metadata pair starts right after the header
NAME_KV = offset_of(VALID, kv_str("general.name", "tiny"))
IDS_KV = offset_of(VALID, VALID_KVS[2])
WORDS_KV = offset_of(VALID, VALID_KVS[3])
T_A = offset_of(VALID, VALID_INFOS[0])
T_B = offset_of(VALID, VALID_INFOS[1])


def with_kv(i: int, replacement: bytes) -> bytes:
    kvs = list(VALID_KVS)
    kvs[i] = replacement
    return gguf(kvs, VALID_INFOS, VALID_DATA)


def with_info(i: int, replacement: bytes, data: bytes = VALID_DATA) -> bytes:
    infos = list(VALID_INFOS)
    infos[i] = replacement
    return gguf(VALID_KVS, infos, data)


def with_alignment(vtype: int, payload: bytes) -> bytes:
    return gguf([*VALID_KVS, kv("general.alignment", vtype, payload)], VALID_INFOS, VALID_DATA)


CASES: list[tuple[str, bytes, tuple[str, ...]]] = [
    # header
    ("bad-magic", b"GGML" + VALID[4:], ("is not a GGUF file", "magic b'GGML' at byte 0")),
    ("text-file", b"hello, this is not a model at all\n" * 3, ("is not a GGUF file", "b'hell'")),
    ("shorter-than-header", VALID[:10], ("truncated", "10 bytes is shorter than a GGUF header (24 bytes)")),
    ("version-0", gguf(VALID_KVS, VALID_INFOS, VALID_DATA, version=0), ("unsupported GGUF version 0 at byte 4",)),
    ("version-1", gguf(VALID_KVS, VALID_INFOS, VALID_DATA, version=1), ("unsupported GGUF version 1 at byte 4",
                                                                         "versions 2 and 3")),
    ("version-99", gguf(VALID_KVS, VALID_INFOS, VALID_DATA, version=99), ("unsupported GGUF version 99 at byte 4",)),
    ("version-big-endian", gguf(VALID_KVS, VALID_INFOS, VALID_DATA, version=3 << 24),
     ("unsupported GGUF version 50331648", "big-endian")),
    ("n-kv-beyond-file", gguf(VALID_KVS, VALID_INFOS, VALID_DATA, n_kv=10**6),
     ("GGUF header", "1000000 metadata keys (count at byte 16)", "need at least", f"only {len(VALID) - 24} remain")),
    ("n-tensors-beyond-file", gguf(VALID_KVS, VALID_INFOS, VALID_DATA, n_tensors=10**5),
     ("GGUF header", "100000 tensor infos (count at byte 8)", "need at least 2400056 bytes")),
    # metadata keys
    ("key-length-beyond-file", with_kv(0, gstr("general.architecture", 10**9) + b"llama"),
     (f"GGUF key #0 of 4 at byte {K0}", "the key of 1000000000 bytes needs 1000000000 bytes but only")),
    ("key-longer-than-spec", with_kv(1, kv_str("k" * 65536, "x")),
     (f"GGUF key #1 of 4 at byte {NAME_KV}", "the key of 65536 bytes is longer than the limit of 65535 bytes")),
    ("key-empty", with_kv(1, kv_str("", "x")), (f"GGUF key #1 of 4 at byte {NAME_KV}", "the key is empty")),
    ("key-not-utf8", with_kv(1, kv(b"general.\xff\xfe", VT.STRING, gstr("x"))),
     (f"GGUF key #1 of 4 at byte {NAME_KV}", "the key is not valid UTF-8", f"byte {NAME_KV + 8 + 8}")),
    ("key-duplicate", with_kv(1, kv_str("general.architecture", "gpt2")),
     (f"GGUF key 'general.architecture' at byte {NAME_KV}", f"duplicate key (first at byte {K0})")),
    ("value-type-unknown", with_kv(1, kv("general.name", 13, u32(0))),
     (f"GGUF key 'general.name' at byte {NAME_KV}", "unknown GGUF value type: 13", "12 FLOAT64")),
    ("value-type-negative", with_kv(1, kv("general.name", 0xFFFFFFFF, u32(0))),
     ("GGUF key 'general.name'", "unknown GGUF value type: 4294967295")),
    ("string-value-beyond-file", with_kv(1, kv("general.name", VT.STRING, gstr("tiny", 10**9))),
     (f"GGUF key 'general.name' at byte {NAME_KV}", "a string of 1000000000 bytes needs 1000000000 bytes")),
    ("array-entry-type-unknown", with_kv(2, kv_arr("test.ids", 77, u32(1), 1)),
     (f"GGUF key 'test.ids' at byte {IDS_KV}", "unknown GGUF value type: array entry type 77")),
    ("array-of-arrays", with_kv(2, kv_arr("test.ids", VT.ARRAY, u32(VT.UINT32) + u64(1) + u32(1), 1)),
     ("GGUF key 'test.ids'", "an array of arrays", "nested arrays are not supported")),
    ("array-beyond-file", with_kv(2, kv_arr("test.ids", VT.UINT64, u64(1), 10**8)),
     ("GGUF key 'test.ids'", "array of 100000000 UINT64 entries", "needs 800000000 bytes but only")),
    ("string-array-entry-beyond-file", with_kv(3, kv_arr("test.words", VT.STRING, gstr("a") + gstr("bc", 10**9), 2)),
     ("GGUF key 'test.words'", "string [1] of 2 (1000000000 bytes, length at byte", "needs 1000000000 bytes")),
    ("scalar-cut-short", VALID[:IDS_KV] + kv("test.u64", VT.UINT64, b"\x01\x02\x03"),
     ("GGUF key 'test.u64'", "a UINT64 value needs 8 bytes but only 3 remain", "truncated")),
    # tensor infos
    ("tensor-name-too-long", with_info(0, tinfo("x" * 64, [4, 2], GGMLType.F32, 0)),
     (f"tensor #0 of 2 at byte {T_A}", "the tensor name of 64 bytes is too long", "GGML_MAX_NAME is 64")),
    ("tensor-name-beyond-file", with_info(0, gstr("a", 10**9)),
     (f"tensor #0 of 2 at byte {T_A}", "the tensor name of 1000000000 bytes needs")),
    ("tensor-name-not-utf8", with_info(0, tinfo(b"\xc3\x28", [4, 2], GGMLType.F32, 0)),
     (f"tensor #0 of 2 at byte {T_A}", "the tensor name is not valid UTF-8")),
    ("tensor-duplicate", with_info(1, tinfo("a", [8], GGMLType.F32, 32)),
     (f"tensor 'a' at byte {T_B}", f"duplicate tensor name (first at byte {T_A})")),
    ("n-dims-9", with_info(0, tinfo("a", [4, 2], GGMLType.F32, 0, n_dims=9)),
     (f"tensor 'a' at byte {T_A}", "9 dimensions at byte", "at most 4")),
    ("n-dims-huge", with_info(0, tinfo("a", [4, 2], GGMLType.F32, 0, n_dims=0xFFFFFFFF)),
     ("tensor 'a'", "4294967295 dimensions")),
    ("dim-negative", with_info(0, tinfo("a", [U64_MAX, 2], GGMLType.F32, 0)),
     ("tensor 'a'", f"ne[0] = {U64_MAX} (-1 as int64)")),
    ("elements-overflow-int64", with_info(0, tinfo("a", [2**40, 2**40], GGMLType.F32, 0)),
     ("tensor 'a'", "has 1208925819614629174706176 elements, more than int64 holds")),
    ("ggml-type-unknown", with_info(0, tinfo("a", [4, 2], 77, 0)),
     (f"tensor 'a' at byte {T_A}", f"unknown ggml type 77 at byte {T_A + 9 + 4 + 16}", "0 F32")),
    ("ggml-type-removed-q4_2", with_info(0, tinfo("a", [4, 2], 4, 0)), ("tensor 'a'", "unknown ggml type 4")),
    ("block-size-mismatch", with_info(0, tinfo("a", [40, 1], GGMLType.Q4_0, 0)),
     ("tensor 'a'", "Q4_0 tensor with ne[0]=40, not a multiple of the block size 32")),
    ("offset-misaligned", with_info(1, tinfo("b", [8], GGMLType.F32, 36)),
     (f"tensor 'b' at byte {T_B}", "data offset 36 is not a multiple of the file's alignment 32")),
    ("offset-beyond-file", with_info(1, tinfo("b", [8], GGMLType.F32, 2**40)),
     ("truncated or corrupt", "tensor 'b' (F32, ne=[8]", f"info at byte {T_B}", f"the file has {len(VALID)} bytes")),
    ("offset-u64-max", with_info(1, tinfo("b", [8], GGMLType.F32, U64_MAX)),
     ("tensor 'b'", f"data offset {U64_MAX} is not a multiple of the file's alignment 32")),
    ("offset-u64-max-aligned", with_info(1, tinfo("b", [8], GGMLType.F32, U64_MAX - 31)),
     ("truncated or corrupt", "tensor 'b'", f"needs bytes {len(VALID) - 64 + U64_MAX - 31}..")),
    ("extent-past-end", with_info(1, tinfo("b", [16], GGMLType.F32, 32)),
     ("tensor 'b' (F32, ne=[16]", f"needs bytes {len(VALID) - 32}..{len(VALID) + 32}",
      f"the file has {len(VALID)} bytes")),
    ("data-section-missing", gguf(VALID_KVS, VALID_INFOS)[:-1],
     ("truncated", "the tensor data of 2 tensors starts at byte", "alignment 32")),
    # general.alignment
    ("alignment-0", with_alignment(VT.UINT32, u32(0)), ("GGUF key 'general.alignment'", "alignment 0 is not a power")),
    ("alignment-3", with_alignment(VT.UINT32, u32(3)), ("GGUF key 'general.alignment'", "alignment 3 is not a power")),
    ("alignment-huge", with_alignment(VT.UINT32, u32(2**31)),
     ("GGUF key 'general.alignment'", "alignment 2147483648 is above the limit of 16777216")),
    ("alignment-wrong-type", with_alignment(VT.UINT64, u64(32)),
     ("GGUF key 'general.alignment'", "has GGUF type UINT64, must be UINT32")),
]


@pytest.mark.parametrize("blob, fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_file(tmp_path: Path, blob: bytes, fragments: tuple[str, ...]) -> None:
    expect_bad(tmp_path, blob, *fragments)


# --- claims of 2^62: in a child process with limits, so a regression hangs or swells only the child ---

EXTENT_HUGE = with_info(0, tinfo("a", [HUGE], GGMLType.I8, 0))
HUGE_CASES: list[tuple[str, bytes, tuple[str, ...]]] = [
    ("n-tensors-2^62", gguf(VALID_KVS, VALID_INFOS, VALID_DATA, n_tensors=HUGE),
     ("GGUF header", f"{HUGE} tensor infos (count at byte 8)", f"need at least {HUGE * 24 + 4 * 14} bytes",
      f"only {len(VALID) - 24} remain")),
    ("n-kv-2^62", gguf(VALID_KVS, VALID_INFOS, VALID_DATA, n_kv=HUGE),
     (f"{HUGE} metadata keys (count at byte 16)", f"need at least {HUGE * 14 + 2 * 24} bytes")),
    ("n-kv-u64-max", gguf(VALID_KVS, VALID_INFOS, VALID_DATA, n_kv=U64_MAX), (f"{U64_MAX} metadata keys",)),
    ("key-length-2^62", with_kv(1, gstr("general.name", HUGE)),
     (f"GGUF key #1 of 4 at byte {NAME_KV}", f"the key of {HUGE} bytes needs {HUGE} bytes but only")),
    ("string-length-2^62", with_kv(1, kv("general.name", VT.STRING, gstr("tiny", HUGE))),
     (f"GGUF key 'general.name' at byte {NAME_KV}", f"a string of {HUGE} bytes needs {HUGE} bytes but only")),
    ("array-length-2^62", with_kv(2, kv_arr("test.ids", VT.UINT32, u32(1), HUGE)),
     (f"GGUF key 'test.ids' at byte {IDS_KV}", f"array of {HUGE} UINT32 entries (length at byte {IDS_KV + 24})",
      f"needs {HUGE * 4} bytes but only")),
    ("string-array-length-2^62", with_kv(3, kv_arr("test.words", VT.STRING, gstr("a"), HUGE)),
     (f"GGUF key 'test.words' at byte {WORDS_KV}", f"array of {HUGE} STRING entries",
      f"needs at least {HUGE * 8} bytes")),
    ("string-array-entry-2^62", with_kv(3, kv_arr("test.words", VT.STRING, gstr("a", HUGE) + gstr("bc"), 2)),
     ("GGUF key 'test.words'", f"string [0] of 2 ({HUGE} bytes")),
    ("tensor-name-2^62", with_info(0, gstr("a", HUGE)), (f"tensor #0 of 2 at byte {T_A}", f"{HUGE} bytes needs")),
    ("dims-2^62", with_info(0, tinfo("a", [HUGE, HUGE], GGMLType.F32, 0)),
     ("tensor 'a'", f"has {HUGE * HUGE} elements, more than int64 holds")),
    ("extent-2^62", EXTENT_HUGE, ("tensor 'a' (I8, ne=[4611686018427387904]",
                                  f"needs bytes {len(EXTENT_HUGE) - 64}..{len(EXTENT_HUGE) - 64 + HUGE}",
                                  f"the file has {len(EXTENT_HUGE)} bytes")),
]

_CHILD = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))  # a runaway allocation fails here, not on the machine
from pyggml.gguf import read_gguf
out = {{}}
for name, path in json.loads(sys.argv[1]).items():
    t0 = time.perf_counter()
    try:
        read_gguf(path)
        out[name] = ["ok", "", 0.0]
    except BaseException as e:
        out[name] = [type(e).__name__, str(e), time.perf_counter() - t0]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def huge_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    """Every HUGE case read in one child process (10 s, 4 GiB of address space at most): name -> (error class,
    message, seconds)."""
    d = tmp_path_factory.mktemp("huge")
    paths = {}
    for name, blob, _ in HUGE_CASES:
        paths[name] = str(d / f"{name.replace('^', '')}.gguf")
        Path(paths[name]).write_bytes(blob)
    code = _CHILD.format(limit=4 << 30)
    try:
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(paths)], capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("reading the 2^62 files did not finish within 60 s (a loop over a claimed count?)")
    assert proc.returncode == 0, f"child crashed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name, fragments", [(c[0], c[2]) for c in HUGE_CASES], ids=[c[0] for c in HUGE_CASES])
def test_huge_claim_fails_at_once(huge_results: dict[str, list], tmp_path: Path, name: str,
                                  fragments: tuple[str, ...]) -> None:
    cls, message, _seconds = huge_results[name]  # the time is not asserted: the child's 60 s timeout is the hang check
    assert cls in ("GGUFError", "ModelFileError"), (cls, message)
    for fragment in fragments:
        assert fragment in message, f"message {message!r} does not name {fragment!r}"
    blob = next(c[1] for c in HUGE_CASES if c[0] == name)
    expect_bad(tmp_path, blob, *fragments)  # the same in this process, and a valid file after it


# --- truncation at every byte ---


def test_truncated_at_every_byte(tmp_path: Path) -> None:
    """Every prefix of the valid file is refused with 'truncated' (or as too short / not GGUF) and the
    number of bytes the file has; none reads, none escapes as another exception."""
    path = tmp_path / "cut.gguf"
    for n in range(len(VALID)):
        path.write_bytes(VALID[:n])
        with pytest.raises(GGUFError) as info:
            read_gguf(path)
        msg = str(info.value)
        assert "'cut.gguf'" in msg and "truncated" in msg, (n, msg)
        assert f"{n} bytes" in msg, (n, msg)
    check_valid(tmp_path / "good.gguf")


@pytest.mark.parametrize("section, cut", [
    ("header", 20), ("key-length", K0 + 4), ("key", K0 + 10), ("value-type", K0 + 8 + 20 + 2),
    ("string-value", NAME_KV + 8 + 12 + 4 + 8 + 2), ("array-length", IDS_KV + 8 + 8 + 4 + 4 + 3),
    ("array-entries", IDS_KV + 8 + 8 + 4 + 4 + 8 + 5), ("tensor-name", T_A + 8), ("tensor-dims", T_A + 9 + 4 + 3),
    ("tensor-type", T_A + 9 + 4 + 16 + 1), ("tensor-offset", T_A + 9 + 4 + 16 + 4 + 2),
    ("tensor-data", len(VALID) - 5),
])
def test_truncated_in_each_section(tmp_path: Path, section: str, cut: int) -> None:
    err = expect_bad(tmp_path, VALID[:cut], "truncated", f"{cut} bytes")
    if section.startswith("tensor-") and section != "tensor-data":
        assert f"at byte {T_A}" in str(err)
    if section == "tensor-data":
        assert "tensor 'b'" in str(err) and f"needs bytes {len(VALID) - 32}..{len(VALID)}" in str(err)


# --- limits, reading values, the gguf package's reader ---


@pytest.mark.parametrize("limit, value, fragments", [
    ("GGUF_MAX_KV", 2, ("GGUF header", "metadata key count 4 at byte 16 is above the limit of 2")),
    ("GGUF_MAX_TENSORS", 1, ("GGUF header", "tensor count 2 at byte 8 is above the limit of 1")),
    ("GGUF_MAX_STRING_ARRAY_ENTRIES", 1, ("GGUF key 'test.words'", "array of 2 STRING entries",
                                          "longer than the limit of 1 entries")),
    ("GGUF_MAX_ARRAY_ENTRIES", 2, ("GGUF key 'test.ids'", "array of 3 UINT32 entries",
                                   "longer than the limit of 2 entries")),
])
def test_named_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: str, value: int,
                      fragments: tuple[str, ...]) -> None:
    """The sane limits are named module constants; a file over one is refused naming it and the numbers."""
    monkeypatch.setattr(reader_mod, limit, value)
    path = tmp_path / "bad.gguf"
    path.write_bytes(VALID)
    expect_error(lambda: read_gguf(path), GGUFError, "'bad.gguf'", *fragments)
    monkeypatch.undo()
    check_valid(tmp_path / "good.gguf")


def test_bad_mode_refused_before_the_file_is_touched(tmp_path: Path) -> None:
    """numpy.memmap's 'w+' would truncate the file: read_gguf takes 'r', 'c' and 'r+' only."""
    path = tmp_path / "good.gguf"
    path.write_bytes(VALID)
    expect_error(lambda: read_gguf(path, mode="w+"), ArgumentError, "read_gguf: mode", "'w+'")
    assert path.read_bytes() == VALID
    check_valid(path)


def test_string_value_not_utf8_fails_when_read(tmp_path: Path) -> None:
    """A value's bytes are checked when the value is read: the file opens, `get` names the key and its byte."""
    path = tmp_path / "bad.gguf"
    path.write_bytes(with_kv(1, kv("general.name", VT.STRING, gstr(b"ti\xffy"))))
    gf = read_gguf(path)
    expect_error(lambda: gf.get("general.name"), GGUFError, "'bad.gguf'", "metadata key 'general.name'",
                 f"at byte {NAME_KV}", "UnicodeDecodeError")
    assert gf.get("test.ids") == [1, 2, 3]  # the file object still works
    check_valid(tmp_path / "good.gguf")


def test_fields_read_like_the_gguf_package(tmp_path: Path) -> None:
    """`fields` hold the package's ReaderField with the same contents and types as its own reader's."""
    import gguf as gguf_pkg

    path = builtin_model_path()
    gf = read_gguf(path)
    ref = gguf_pkg.GGUFReader(path)
    assert list(gf.fields) == list(ref.fields)
    for key, field in gf.fields.items():
        assert field.types == ref.fields[key].types, key
        assert field.contents() == ref.fields[key].contents(), key
        assert field.offset == ref.fields[key].offset, key
    tensors = {t.name: t for t in ref.tensors}
    for info in gf:
        rt = tensors[info.name]
        assert (info.offset, info.nbytes, list(info.ne), int(info.type)) == (
            rt.data_offset, rt.n_bytes, rt.shape.tolist(), int(rt.tensor_type))
        assert info.info_offset == rt.field.offset
    assert gf.reader.tensors[0].name == ref.tensors[0].name  # the package's reader, built on demand


def test_zero_tensors_and_zero_dims(tmp_path: Path) -> None:
    """Accepted with their documented meaning: a file of metadata only (no data section needed), and a
    tensor with n_dims 0 (a scalar: ne=(), one element), and a dimension of 0 (an empty tensor, as
    llama.cpp's gguf.cpp allows)."""
    path = tmp_path / "meta.gguf"
    path.write_bytes(gguf(VALID_KVS, [], alignment=1))  # no padding: there is no data section
    gf = read_gguf(path)
    assert len(gf.tensors) == 0 and gf.get("test.words") == ["a", "bc"]
    path.write_bytes(gguf(VALID_KVS, [tinfo("s", [], GGMLType.F32, 0)], np.float32(2.5).tobytes()))
    gf = read_gguf(path)
    assert gf.tensor("s").ne == () and gf.tensor("s").nelements() == 1
    assert gf.tensor_float("s").tolist() == [2.5]
    path.write_bytes(gguf(VALID_KVS, [tinfo("e", [4, 0], GGMLType.F32, 0), tinfo("s", [], GGMLType.F32, 0)],
                          np.float32(2.5).tobytes()))
    gf = read_gguf(path)
    assert gf.tensor("e").ne == (4, 0) and gf.tensor("e").nelements() == 0
    assert gf.tensor_float("s").tolist() == [2.5]  # the empty tensor takes no bytes


# --- loading tensors into backends ---


@pytest.mark.parametrize("names, backend_of, cls, fragments", [
    (["a", "zz"], "cpu", GGUFError, ("'bad.gguf': tensor 'zz' is missing (2 tensors in the file)",)),
    (["a", 7], "cpu", ArgumentTypeError, ("load_tensors: a tensor name must be a str, got int 7",)),
    (["a", "b"], {"a": "cpu"}, ArgumentError, ("load_tensors: no backend given for tensor 'b'",)),
    (["a"], {"a": 3}, ArgumentTypeError, ("the backend of tensor 'a' must be a Backend, got int 3",)),
    (["a"], 3, ArgumentTypeError, ("backend_of must be a mapping or a function of the tensor name, got int",)),
], ids=["missing-tensor", "name-not-str", "no-backend", "backend-not-a-backend", "backend_of-not-a-mapping"])
def test_load_tensors_refuses(tmp_path: Path, names: list, backend_of: Any, cls: type, fragments: tuple) -> None:
    from pyggml.backends.cpu import cpu_init
    from pyggml.gguf import load_tensors

    cpu = cpu_init(1)
    if backend_of == "cpu":
        backend_of = {"a": cpu, "b": cpu, "zz": cpu}
    elif isinstance(backend_of, dict):
        backend_of = {k: cpu if v == "cpu" else v for k, v in backend_of.items()}
    path = tmp_path / "bad.gguf"
    path.write_bytes(VALID)
    gf = read_gguf(path)
    expect_error(lambda: load_tensors(gf, names, backend_of, progress=False), cls, *fragments)
    loaded = load_tensors(gf, ["a", "b"], {"a": cpu, "b": cpu}, progress=False)  # the file and backend still work
    assert np.array_equal(loaded.tensors["a"].numpy().reshape(2, 4), A_VALUES.reshape(2, 4))
    loaded.free()


# --- the writer: llama.cpp's key types ---


def test_builtin_model_has_llama_cpp_key_types() -> None:
    """Every key of the shipped model has the type llama.cpp reads it as (it refused token_type as UINT32)."""
    gf = read_gguf(builtin_model_path())
    arch = gf.architecture
    checked = 0
    for key in gf.keys():
        want = llama_cpp_key_type(key, arch)
        if want is None or key == "general.architecture":
            continue
        want_types = list(want) if isinstance(want, tuple) else [want]
        assert gf.get_field(key).types == want_types, key
        checked += 1
    assert checked >= 18
    assert gf.get_field("tokenizer.ggml.token_type").types == [VT.ARRAY, VT.INT32]


def test_writer_types_keys_as_llama_cpp_reads_them(tmp_path: Path) -> None:
    meta = {"llama.context_length": 64, "llama.embedding_length": 32, "llama.block_count": 2,
            "llama.feed_forward_length": [48, 64], "llama.attention.head_count": 4,
            "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.freq_base": 10000,
            "general.file_type": 1, "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>"],
            "tokenizer.ggml.scores": [0, -1, -2], "tokenizer.ggml.token_type": [2, 3, 3],
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.add_bos_token": True, "custom.count": 5}
    path = tmp_path / "w.gguf"
    write_gguf(path, "llama", meta, {"x": np.zeros(32, np.float32)})
    gf = read_gguf(path)
    types = {k: gf.get_field(k).types for k in meta}
    assert types["llama.feed_forward_length"] == [VT.ARRAY, VT.UINT32]
    assert types["llama.rope.freq_base"] == [VT.FLOAT32] and gf.get("llama.rope.freq_base") == 10000.0
    assert types["tokenizer.ggml.scores"] == [VT.ARRAY, VT.FLOAT32] and gf.get("tokenizer.ggml.scores") == [0, -1, -2]
    assert types["tokenizer.ggml.token_type"] == [VT.ARRAY, VT.INT32]
    assert types["tokenizer.ggml.bos_token_id"] == [VT.UINT32] and types["general.file_type"] == [VT.UINT32]
    assert types["tokenizer.ggml.add_bos_token"] == [VT.BOOL] and types["custom.count"] == [VT.UINT32]
    # an explicit type is written as given (to make files llama.cpp would refuse, on purpose)
    write_gguf(path, "llama", {"tokenizer.ggml.token_type": ([1, 2], VT.ARRAY, VT.UINT32),
                               "llama.block_count": (2, VT.UINT64)}, {})
    gf = read_gguf(path)
    assert gf.get_field("tokenizer.ggml.token_type").types == [VT.ARRAY, VT.UINT32]
    assert gf.get_field("llama.block_count").types == [VT.UINT64]


@pytest.mark.parametrize("meta, fragments", [
    ({"tokenizer.ggml.bos_token_id": -1}, ("'tokenizer.ggml.bos_token_id' = -1 does not fit UINT32",)),
    ({"llama.block_count": 2**32}, ("'llama.block_count' = 4294967296 does not fit UINT32",)),
    ({"llama.context_length": 2.5}, ("'llama.context_length' = 2.5 does not fit UINT32",)),
    ({"llama.attention.layer_norm_rms_epsilon": "1e-5"}, ("'llama.attention.layer_norm_rms_epsilon' = '1e-5'",
                                                          "FLOAT32")),
    ({"tokenizer.ggml.add_bos_token": 1}, ("'tokenizer.ggml.add_bos_token' = 1 does not fit BOOL",)),
    ({"tokenizer.ggml.token_type": [1, 2**31]}, ("'tokenizer.ggml.token_type'[1] = 2147483648 does not fit INT32",)),
    ({"tokenizer.ggml.scores": ["x"]}, ("'tokenizer.ggml.scores'[0] = 'x' does not fit FLOAT32",)),
    ({"tokenizer.ggml.tokens": "abc"}, ("'tokenizer.ggml.tokens' = 'abc': llama.cpp reads it as an ARRAY of STRING",)),
    ({"general.alignment": 3}, ("metadata 'general.alignment' must be a power of two", "got 3")),
    ({"custom.thing": object()}, ("metadata 'custom.thing' has a value of type object",)),
])
def test_writer_refuses_values_llama_cpp_cannot_read(tmp_path: Path, meta: dict, fragments: tuple[str, ...]) -> None:
    path = tmp_path / "w.gguf"
    expect_error(lambda: write_gguf(path, "llama", meta, {"x": np.zeros(32, np.float32)}), ArgumentError,
                 "write_gguf", *fragments)
    assert not path.exists()  # refused before the file was created
    write_gguf(path, "llama", {"llama.block_count": 2}, {"x": np.zeros(32, np.float32)})  # the writer still works
    assert read_gguf(path).get("llama.block_count") == 2


@pytest.mark.parametrize("make, fragments", [
    (lambda p: write_gguf(p, "llama", {}, {"q": RawTensor(np.zeros(10, np.uint8), GGMLType.Q4_0, (32, 1))}),
     ("tensor 'q' (Q4_0, ne=[32, 1]) needs 18 bytes, its data has 10",)),
    (lambda p: write_gguf(p, "llama", {}, {"q": RawTensor(np.zeros(18, np.uint8), GGMLType.Q4_0, (16, 1))}),
     ("tensor 'q' (Q4_0) has ne=[16, 1]", "block size 32")),
    (lambda p: write_gguf(p, "llama", {}, {"x": np.zeros(5, np.float32)}, types={"x": GGMLType.Q8_0}),
     ("tensor 'x' has rows of 5 elements, not a multiple of Q8_0's block size 32",)),
    (lambda p: write_gguf(p, "llama", {}, {}, alignment=48), ("alignment must be a power of two", "got 48")),
])
def test_writer_refuses_bad_tensors(tmp_path: Path, make: Callable[[Path], None], fragments: tuple[str, ...]) -> None:
    path = tmp_path / "w.gguf"
    expect_error(lambda: make(path), ArgumentError, "write_gguf", *fragments)
    assert not path.exists()
    raw = np.arange(32, dtype=np.float32)
    write_gguf(path, "llama", {}, {"r": RawTensor(raw.view(np.uint8), GGMLType.F32, (32,))}, alignment=64)
    gf = read_gguf(path)
    assert gf.alignment == 64 and np.array_equal(gf.tensor_float("r"), raw)


# --- the CLI on bad files: one line, exit 1, no traceback ---


@pytest.mark.parametrize("command, case", [("info", "array-length-2^62"), ("run", "array-length-2^62"),
                                           ("info", "n-tensors-2^62"), ("run", "ggml-type-unknown")])
@pytest.mark.slow
def test_cli_on_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, case: str) -> None:
    blob, fragments = next((c[1], c[2]) for c in HUGE_CASES + CASES if c[0] == case)
    path = tmp_path / "bad.gguf"
    path.write_bytes(blob)
    args = [command, str(path)] + (["-n", "1"] if command == "run" else [])
    try:
        proc = subprocess.run([sys.executable, "-m", "pyggml.cli", *args], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"pyggml {command} on {case} did not finish within 120 s")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"pyggml {command}: error: "), lines[0]
    for fragment in ("'bad.gguf'", *fragments[:2]):
        assert fragment in lines[0], (fragment, lines[0])
    from pyggml.cli.main import main

    assert main(["info", str(builtin_model_path())]) == 0  # the command still reads a good file
    assert "38 tensors, 21 metadata keys" in capsys.readouterr().out
