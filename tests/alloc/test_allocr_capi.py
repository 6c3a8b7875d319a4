"""The legacy Allocr and ggml-alloc.h by C name in pyggml.capi."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import pyggml.capi as capi
from pyggml import Context, GGMLType
from pyggml.alloc import GraphAllocator, HashSet, TensorAllocator
from pyggml.backends.cpu import cpu_init
from pyggml.core.errors import ArgumentError
from pyggml.seed.allocr import Allocr

SEED = Path(__file__).resolve().parents[3] / "shared" / "seeds" / "002_c877712a8251d4e9.code-only.c"

# The allocator functions of the seed's ggml-alloc.c (lines 1-767 of the code-only seed), as
# `seed_alloc_names` reads them; kept here so the check also runs where the seeds are not beside the checkout.
SEED_ALLOC_NAMES = {
    "ggml_allocr_alloc", "ggml_allocr_alloc_graph", "ggml_allocr_free", "ggml_allocr_get_buffer",
    "ggml_allocr_is_measure", "ggml_allocr_max_size", "ggml_allocr_new", "ggml_allocr_new_from_backend",
    "ggml_allocr_new_from_buffer", "ggml_allocr_new_impl", "ggml_allocr_new_measure",
    "ggml_allocr_new_measure_from_backend", "ggml_allocr_reset", "ggml_allocr_set_parse_seq",
    "ggml_gallocr_alloc_graph", "ggml_gallocr_alloc_graph_n", "ggml_gallocr_free", "ggml_gallocr_new",
    "ggml_gallocr_set_parse_seq", "ggml_tallocr_alloc", "ggml_tallocr_alloc_graph_impl", "ggml_tallocr_free",
    "ggml_tallocr_free_tensor", "ggml_tallocr_get_buffer", "ggml_tallocr_is_measure", "ggml_tallocr_is_own",
    "ggml_tallocr_max_size", "ggml_tallocr_new", "ggml_tallocr_new_from_backend", "ggml_tallocr_new_from_buffer",
    "ggml_tallocr_new_measure", "ggml_tallocr_new_measure_from_backend", "ggml_tallocr_reset",
}


def seed_alloc_names() -> set[str]:
    """The names in the seed file when it is beside the checkout (as in the workplace), else the list above."""
    if not SEED.exists():
        return SEED_ALLOC_NAMES
    lines = SEED.read_text(encoding="utf-8", errors="replace").splitlines()[:767]  # ggml-alloc.c
    return set(re.findall(r"\b(ggml_[tg]?allocr_\w+)\s*\(", "\n".join(lines)))


def test_every_seed_alloc_function_is_in_capi() -> None:
    names = seed_alloc_names()
    assert names == SEED_ALLOC_NAMES
    missing = sorted(n for n in names if not callable(getattr(capi, n, None)))
    assert missing == []


def chain(ctx: Context, n: int = 32):
    a = ctx.new_tensor_1d(GGMLType.F32, n).set_name("a")
    b = ctx.cont(a).set_name("b")
    c = ctx.cont(b).set_name("c")
    d = ctx.cont(c).set_name("d")
    g = ctx.new_graph()
    g.build_forward_expand(d)
    return g, (a, b, c, d)


def test_allocr_measure_then_backend_buffer() -> None:
    backend = cpu_init()
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    g, (a, *_rest) = chain(ctx)
    m = capi.ggml_allocr_new_measure_from_backend(backend)
    assert capi.ggml_allocr_is_measure(m)
    capi.ggml_allocr_alloc(m, a)  # an input placed first, as llama.cpp does
    assert capi.ggml_allocr_max_size(m) == 128
    need = capi.ggml_allocr_alloc_graph(m, g)
    assert need == 256 == capi.ggml_allocr_max_size(m)
    m_buffer = capi.ggml_allocr_get_buffer(m)
    capi.ggml_allocr_free(m)
    assert m_buffer.freed  # the measure allocator made its probe buffer, so it frees it

    ctx = Context(mem_size=1 << 20, no_alloc=True)
    g, (a, b, c, d) = chain(ctx)
    r = capi.ggml_allocr_new_from_backend(backend, need)
    assert not capi.ggml_allocr_is_measure(r)
    capi.ggml_allocr_alloc(r, a)
    assert capi.ggml_allocr_alloc_graph(r, g) == need
    base = capi.ggml_allocr_get_buffer(r).get_base()
    assert [t.data - base for t in (a, b, c, d)] == [0, 128, 0, 128]
    # reset: everything free again, max_size kept
    capi.ggml_allocr_reset(r)
    assert r.talloc.n_free_blocks == 1 and r.talloc.free_blocks[0].size == need
    buf = capi.ggml_allocr_get_buffer(r)
    capi.ggml_allocr_free(r)
    assert buf.freed
    capi.ggml_allocr_free(None)


def test_allocr_over_caller_memory_and_buffer() -> None:
    mem = np.zeros(1024, dtype=np.uint8)
    al = Allocr.new(mem, 1024, 32)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    t = ctx.new_tensor_1d(GGMLType.F32, 10)
    al.alloc(t)
    assert al.talloc.base <= t.data < al.talloc.base + 1024
    al.free()

    backend = cpu_init()
    buf = backend.alloc_buffer(512)
    al = capi.ggml_allocr_new_from_buffer(buf)
    capi.ggml_allocr_free(al)
    assert not buf.freed  # the caller's buffer stays the caller's
    buf.free()

    al = capi.ggml_allocr_new(mem, 1024, 32)
    assert capi.ggml_allocr_get_buffer(al).get_size() == 1024
    with pytest.raises(ArgumentError):
        Allocr.new(mem, 1024, 24)  # alignment must be a power of 2


def test_set_parse_seq_takes_n_entries() -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    g, (a, b, c, d) = chain(ctx)
    al = capi.ggml_allocr_new_measure(32)
    capi.ggml_allocr_set_parse_seq(al, [0, 1, -1, 2, -1, 99, 99], 5)  # entries past n are ignored
    assert al.galloc.parse_seq == [0, 1, -1, 2, -1]
    capi.ggml_allocr_alloc_graph(al, g)
    base = al.talloc.base
    assert [t.data - base for t in (a, b, c, d)] == [0, 128, 256, 0]


def test_tallocr_and_gallocr_by_c_name() -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    g, (a, b, c, d) = chain(ctx)
    t = capi.ggml_tallocr_new_measure(32)
    assert capi.ggml_tallocr_is_measure(t)
    galloc = capi.ggml_gallocr_new()
    assert isinstance(galloc, GraphAllocator)
    capi.ggml_gallocr_set_parse_seq(galloc, [], 0)
    assert capi.ggml_gallocr_alloc_graph(galloc, t, g) == 256
    assert capi.ggml_tallocr_is_own(t, d)
    capi.ggml_tallocr_free_tensor(t, d)
    assert capi.ggml_tallocr_max_size(t) == 256
    capi.ggml_tallocr_reset(t)
    assert t.n_free_blocks == 1

    # alloc_graph_n with one allocator per tensor
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    g, (a, b, c, d) = chain(ctx)
    hs = HashSet.for_graph(g.n_nodes + g.n_leafs)
    t1 = capi.ggml_tallocr_new_measure(32)
    allocs: list[TensorAllocator | None] = [t1] * hs.size
    capi.ggml_gallocr_alloc_graph_n(galloc, g, hs, allocs)
    assert [x.data - t1.base for x in (a, b, c, d)] == [0, 128, 0, 128]
    capi.ggml_gallocr_free(galloc)
    capi.ggml_gallocr_free(None)
    capi.ggml_tallocr_free(t1)
    capi.ggml_tallocr_free(None)

    backend = cpu_init()
    tb = capi.ggml_tallocr_new_from_backend(backend, 64)
    x = ctx.new_tensor_1d(GGMLType.F32, 16)
    capi.ggml_tallocr_alloc(tb, x)
    assert x.buffer is capi.ggml_tallocr_get_buffer(tb)
    capi.ggml_tallocr_free(tb)
    assert x.buffer.freed
    mem = np.zeros(256, dtype=np.uint8)
    tn = capi.ggml_tallocr_new(mem, 256, 16)
    assert tn.alignment == 16
    tm = capi.ggml_tallocr_new_measure_from_backend(backend)
    assert tm.is_measure() and tm.alignment == backend.get_alignment()
    buf = backend.alloc_buffer(64)
    tf = capi.ggml_tallocr_new_from_buffer(buf)
    assert tf.buffer is buf and not tf.buffer_owned
    capi.ggml_tallocr_free(tf)
    assert not buf.freed
    buf.free()
    al = capi.ggml_allocr_new_impl(tn)
    assert al.talloc is tn
