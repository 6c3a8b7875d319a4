"""The KV cache's types (llama.cpp's -ctk/-ctv): each one's round trip through SET_ROWS into the cache and back
through the attention views, K and V apart, and the refusals (a quantized transposed V, a quantized V without
flash attention)."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.backends.cpu.backend import cpu_init
from pyggml.core import quants
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError
from pyggml.core.graph import Graph
from pyggml.core.types import TYPE_TRAITS, GGMLType, row_size
from pyggml.ggml_backend.tensor_io import tensor_get, tensor_set
from pyggml.models import load
from pyggml.models.builtin import builtin_model_path
from pyggml.models.kv_cache import CACHE_TYPES, KVCache
from pyggml.testing import alloc_ctx_tensors

G, N_CTX, HEAD_DIM = 64, 8, 32  # a cell's values (two heads), the cells


@pytest.mark.parametrize("t", CACHE_TYPES, ids=lambda t: t.name)
def test_each_type_round_trips_through_the_cache(t: GGMLType) -> None:
    """Two tokens' K (the type under test) and V (F16) written by SET_ROWS into cells 5 and 2 hold the CPU's
    conversion of the values (ggml's from_float), the other cells stay zero, and the attention views read those
    rows back as that type's values; then the same with the types swapped."""
    backend = cpu_init(1)
    for type_k, type_v in ((t, GGMLType.F16), (GGMLType.F16, t)):
        kv = KVCache(1, N_CTX, G, [backend], type_k, v_trans=False, type_v=type_v)
        ctx = Context(mem_size=1 << 20, no_alloc=True)
        try:
            rng = np.random.default_rng(int(t))
            values = {"k": rng.standard_normal((2, G)).astype(np.float32),
                      "v": rng.standard_normal((2, G)).astype(np.float32)}
            k_cur, v_cur = (ctx.new_tensor_2d(GGMLType.F32, G, 2) for _ in range(2))
            k_idxs, v_idxs = (ctx.new_tensor_1d(GGMLType.I64, 2) for _ in range(2))
            graph = Graph()
            kv.store(ctx, graph, 0, k_cur, v_cur, 2, k_idxs, v_idxs)
            k_view, v_view = kv.k_view(ctx, 0, N_CTX, HEAD_DIM, G // HEAD_DIM), kv.v_view(ctx, 0, N_CTX, HEAD_DIM,
                                                                                           G // HEAD_DIM)
            buf = alloc_ctx_tensors(ctx, backend)
            cells = np.array([5, 2], dtype=np.int64)
            for cur, name in ((k_cur, "k"), (v_cur, "v")):
                tensor_set(cur, values[name])
            for idxs in (k_idxs, v_idxs):
                tensor_set(idxs, kv.k_idxs(cells))
            backend.graph_compute(graph)
            for name, cache, view, typ in (("k", kv.k[0], k_view, type_k), ("v", kv.v[0], v_view, type_v)):
                assert cache.type == typ and view.type == typ
                raw = np.empty(cache.nbytes(), dtype=np.uint8)
                tensor_get(cache, raw)
                rows = raw.reshape(N_CTX, row_size(typ, G))
                want = quants.from_float_cpu(typ, values[name]).view(np.uint8).reshape(2, -1)
                assert np.array_equal(rows[cells], want), f"{name} ({typ.name}): the cells' bytes"
                assert not rows[[0, 1, 3, 4, 6, 7]].any(), f"{name} ({typ.name}): other cells written"
                assert view.ne[:3] == [HEAD_DIM, N_CTX, G // HEAD_DIM]
                assert view.nb[1] == row_size(typ, G) and view.nb[2] == row_size(typ, HEAD_DIM)
                back = quants.to_float(typ, rows[cells]).reshape(2, G)
                tol = 0 if typ == GGMLType.F32 else 0.3  # q4 types: a block's step of amax / 8
                assert np.abs(back - values[name]).max() <= tol * np.abs(values[name]).max() + 1e-6
            buf.free()
        finally:
            kv.free()
            ctx.free()


def test_a_quantized_transposed_v_is_refused() -> None:
    with pytest.raises(ArgumentError, match="V type Q8_0 is quantized and needs V stored as K"):
        KVCache(1, N_CTX, G, [cpu_init(1)], GGMLType.F16, v_trans=True, type_v=GGMLType.Q8_0)
    with pytest.raises(ArgumentError, match="a cell of 48 values is not a whole number of Q4_0 blocks of 32"):
        KVCache(1, N_CTX, 48, [cpu_init(1)], GGMLType.Q4_0, v_trans=False)
    with pytest.raises(ArgumentError, match="type Q2_K is not supported"):
        KVCache(1, N_CTX, G, [cpu_init(1)], GGMLType.Q2_K, v_trans=False)


def test_a_quantized_v_needs_flash_attention_as_llama_cpp() -> None:
    """flash_attn off: llama.cpp's words; auto: turned on, as llama.cpp does; a quantized K alone needs nothing."""
    with pytest.raises(ArgumentError, match="quantized V cache requires flash_attn to be enabled"):
        load(builtin_model_path(), n_ctx=16, progress=False, kv_type="f16", kv_type_v="q4_0", flash_attn="off")
    model = load(builtin_model_path(), n_ctx=16, progress=False, kv_type="f16", kv_type_v="q4_0", flash_attn="auto")
    try:
        assert model.flash_attn and model.kv.type_v == GGMLType.Q4_0
    finally:
        model.free()
    model = load(builtin_model_path(), n_ctx=16, progress=False, kv_type="q4_0", kv_type_v="f16", flash_attn="off")
    try:
        assert not model.flash_attn and (model.kv.type_k, model.kv.type_v) == (GGMLType.Q4_0, GGMLType.F16)
    finally:
        model.free()


def test_the_memory_check_counts_each_type() -> None:
    model = load(builtin_model_path(), n_ctx=16, progress=False, kv_type="q8_0", kv_type_v="f16", flash_attn="on")
    try:
        hp = model.hparams
        per_layer = 16 * (row_size(GGMLType.Q8_0, hp.n_embd_gqa) + row_size(GGMLType.F16, hp.n_embd_gqa))
        assert sum(m["kv_cache"] for m in model.memory().values()) >= hp.n_layer * per_layer
        assert TYPE_TRAITS[model.kv.type_k].is_quantized
    finally:
        model.free()
