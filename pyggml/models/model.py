"""`Model`: a GGUF model loaded over backends and evaluated with a KV cache, as llama.cpp's llama-model.cpp and
llama-context.cpp (llama_decode); layers placed as -ngl / -ts / -ot place them (`pyggml.models.placement`).

    model = pyggml.models.load("model.gguf", backends=["torch", "cpu"], n_layers_on=[20])
    logits = model.eval(model.tokenize("Hello"))         # (n_ids, n_vocab), extends the KV cache
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pyggml.core.checks import check_host_alloc, check_positive
from pyggml.core.context import Context, tensor_overhead
from pyggml.core.errors import ArgumentError, GGMLError, NonFiniteError, UnsupportedOpError
from pyggml.core.graph import Graph, graph_overhead
from pyggml.core.tensor import Tensor, is_view_op
from pyggml.core.types import TYPE_TRAITS, GGMLType, as_type, row_size
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer_type import BufferType
from pyggml.ggml_backend.registry import (
    SET_BATCH_INVARIANT,
    dev_extra_bufts,
    init_backend,
    set_batch_invariant,
    set_n_threads,
)
from pyggml.ggml_backend.tensor_io import tensor_get_numpy
from pyggml.gguf.loader import LoadedTensors, load_tensors, maps_weights, weight_buft_supported
from pyggml.gguf.reader import GGUFFile, read_gguf
from pyggml.models.arch import (
    FFN_GEGLU,
    FFN_SWIGLU,
    FFN_SWIGLU_FUSED,
    FFN_SWIGLU_OAI,
    SWIGLU_OAI_ALPHA,
    SWIGLU_OAI_LIMIT,
    HParams,
    check_tensors,
    layer_of,
)
from pyggml.models.graph import GraphInputs, build_graph, graph_size
from pyggml.models.kv_cache import KVCache, check_type
from pyggml.models.metadata import read_int
from pyggml.models.placement import (
    backend_index,
    backend_labels,
    check_backend_count,
    check_tensor_split,
    compile_overrides,
    layers_by_counts,
    layers_by_split,
)
from pyggml.models.pooling import EMBD_NORMALIZE
from pyggml.models.recurrent_state import RecurrentState, state_bytes
from pyggml.models.runner import Runner, is_host_backend

log = logging.getLogger("pyggml.models")

KV_PAD = 256  # llama_kv_cache::get_n_kv's padding: one decode graph serves 256 consecutive tokens
FLASH_ATTN_MODES = ("on", "off", "auto")
# a server's batches come in a few shapes; rebuilding a graph costs more than keeping it (no compute memory)
KEEP_GRAPHS = 8
# (n_tokens, n_kv, n_outputs, last_only, embeddings, recurrent state's cell, cell zeroed)
GraphKey = tuple[int, int, int, bool, bool, int, int]


@dataclass
class Batch:
    """One llama_batch as computed; logits of the last token (last_only), of `out_rows`, or of all."""

    ids: np.ndarray
    pos: np.ndarray
    seq_ids: np.ndarray
    cells: np.ndarray
    n_kv: int
    last_only: bool = False
    out_rows: np.ndarray | None = None
    embeddings: bool = False
    rs_cell: tuple[int, int] = (0, -1)  # the recurrent state's cell of the batch's sequence, the cell zeroed (-1)

    @property
    def n_outputs(self) -> int:
        return 1 if self.last_only else len(self.ids) if self.out_rows is None else len(self.out_rows)


def resolve_flash_attn(mode: str | bool, batch_invariant: bool = False, quantized_v: bool = False) -> bool:
    """`flash_attn` as llama.cpp's -fa. "auto" is off (on the CPU backend it is no faster, benchmarks/README.md),
    but on, and "off" refused, with `batch_invariant` or a quantized V cache (as llama_init_from_model)."""
    if isinstance(mode, bool):
        on = mode
    elif not isinstance(mode, str) or mode.lower() not in FLASH_ATTN_MODES:
        raise ArgumentError(f"flash_attn must be one of {', '.join(FLASH_ATTN_MODES)} (or a bool), got {mode!r}")
    else:
        on = mode.lower() == "on" or (batch_invariant and mode.lower() == "auto")
        if quantized_v and mode.lower() == "auto" and not on:
            log.info("enabling flash_attn since it is required for quantized V cache")  # llama.cpp's words
            on = True
    if quantized_v and not on:
        raise ArgumentError("quantized V cache requires flash_attn to be enabled")  # llama.cpp's words
    if batch_invariant and not on:
        raise ArgumentError("flash_attn off cannot be batch-invariant: batch-invariant attention is flash attention "
                            "(give flash_attn on or auto)")
    return on


def all_support(backends: Sequence[Backend], op: str, kv_type: GGMLType = GGMLType.F32,
                ffn: str = FFN_SWIGLU) -> bool:
    """Whether every one of `backends` computes `op` ("set_rows", "glu", "flash_attn", "attention"), asked with a
    small node of that kind."""
    ctx = Context(mem_size=16 * tensor_overhead(), no_alloc=True)
    try:
        a = ctx.new_tensor_2d(GGMLType.F32, 8, 4)
        b = ctx.new_tensor_2d(GGMLType.F32, 8, 1)
        if op == "flash_attn":
            q = ctx.new_tensor_3d(GGMLType.F32, 64, 1, 4)
            k, v = (ctx.new_tensor_3d(kv_type, 64, 256, 2) for _ in range(2))
            nodes = [ctx.flash_attn_ext(q, k, v, ctx.new_tensor_2d(GGMLType.F16, 256, 1), 0.125)]
        elif op == "attention":
            q = ctx.new_tensor_3d(GGMLType.F32, 64, 1, 4)
            k = ctx.new_tensor_3d(kv_type, 64, 256, 2)
            kq = ctx.mul_mat(k, q)
            nodes = [kq, ctx.soft_max_ext(kq, ctx.new_tensor_2d(GGMLType.F32, 256, 1), 0.125, 0.0),
                     ctx.mul_mat(ctx.new_tensor_3d(kv_type, 256, 64, 2), ctx.new_tensor_3d(GGMLType.F32, 256, 1, 4))]
        elif op == "set_rows":
            nodes = [ctx.set_rows(ctx.new_tensor_2d(t, 8, 4), b, ctx.new_tensor_1d(GGMLType.I64, 1))
                     for t in (GGMLType.F32, GGMLType.F16)]
        else:
            b2 = ctx.new_tensor_2d(GGMLType.F32, 8, 4)
            glu_of = {FFN_GEGLU: lambda: ctx.geglu_split(a, b2), FFN_SWIGLU_FUSED: lambda: ctx.swiglu(a),
                      FFN_SWIGLU_OAI: lambda: ctx.swiglu_oai(a, b2, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT)}
            nodes = [glu_of.get(ffn, lambda: ctx.swiglu_split(a, b2))()]
        return all(backend.supports_op(n) for backend in {id(x): x for x in backends}.values() for n in nodes)
    finally:
        ctx.free()


def _layer_backends(n_layer: int, backends: list[Backend], n_layers_on: int | Sequence[int] | None) -> list[Backend]:
    """The backend of each layer: `n_layers_on[i]` layers on backends[i] in order, the rest on the last."""
    return [backends[i] for i in layers_by_counts(n_layer, len(backends), n_layers_on)]


def _placement(n_layer: int, backends: list[Backend], n_layers_on: int | Sequence[int] | None,
               tensor_split: Sequence[float] | None,
               override_tensor: Sequence[tuple[Any, Any]] | None) -> tuple[list[Backend], Backend,
                                                                          list[tuple[re.Pattern[str], Backend]]]:
    """(backend of each layer, of the output norm and head, overrides as (regex, backend))."""
    check_backend_count(len(backends))
    if tensor_split is not None and n_layers_on is not None:
        raise ArgumentError("load: give n_layers_on or tensor_split, not both (llama.cpp's -ngl per device or -ts)")
    if tensor_split is not None:
        check_tensor_split(tensor_split, len(backends), "load: tensor_split")
        layers, output = layers_by_split(n_layer, tensor_split)
        layer_backend, output_backend = [backends[i] for i in layers], backends[output]
    else:
        layer_backend = _layer_backends(n_layer, backends, n_layers_on)
        output_backend = layer_backend[-1]
    aliases = [[b.name()] for b in backends]

    def resolve(b: Any) -> int:
        if isinstance(b, Backend):  # by identity: two CPU backends are two backends
            for i, x in enumerate(backends):
                if x is b:
                    return i
            raise ArgumentError(f"override_tensor: backend {b.name()} is not one of the model's backends "
                                f"({backend_labels(aliases)})")
        return backend_index(b, aliases, "override_tensor")

    overrides = [(rx, backends[i]) for rx, i in compile_overrides(override_tensor, resolve)]
    return layer_backend, output_backend, overrides


def _extra_buft(weight: Tensor, backend: Backend) -> BufferType | None:
    """The device's first extra buffer type (CPU_REPACK) that multiplies a MUL_MAT-only weight or a 3-D stack of
    MUL_MAT_ID's experts, as llama.cpp's extra buffer types; the token embedding stays (GET_ROWS reads it)."""
    device = backend.get_device()
    if device is None or weight.name == "token_embd.weight" or weight.ne[3] != 1 or weight.ne[1] == 1:
        return None
    for buft in dev_extra_bufts(device):
        if weight_buft_supported(device, buft, weight):
            return buft
    return None


class Model:
    """A loaded model; the file, its shapes and host memory are checked before anything is allocated.

    `check_finite`: NaN or inf in a batch's logits raises NonFiniteError naming the first tensor where it appears.
    `repack`: weights go to the device's extra buffer type (llama.cpp's default; --no-repack). `batch_invariant`:
    a sequence's logits depend neither on its batch nor on its cells (flash attention, an ordered cache).
    `n_seq_max`: the sequences a model with recurrent layers keeps a state for (llama.cpp's n_seq_max); a failed
    batch of such a model ends its sequence, whose state the graph wrote in place.
    """

    def __init__(self, gf: GGUFFile, backends: list[Backend], n_ctx: int = 512,
                 n_layers_on: int | Sequence[int] | None = None, n_batch: int = 512,
                 kv_type: GGMLType | str = GGMLType.F32, use_mmap: bool = True, progress: bool = True,
                 reuse_graphs: bool = True, check_finite: bool = True,
                 flash_attn: str | bool = "auto", tensor_split: Sequence[float] | None = None,
                 override_tensor: Sequence[tuple[Any, Any]] | None = None, repack: bool = True,
                 batch_invariant: bool = False, kv_type_v: GGMLType | str | None = None, n_seq_max: int = 1) -> None:
        if not backends:
            raise ArgumentError("load: no backends given")
        if not isinstance(batch_invariant, bool):
            raise ArgumentError(f"load: batch_invariant must be a bool, got {batch_invariant!r}")
        kv_type = check_type(as_type(kv_type))  # llama.cpp's type_k
        kv_type_v = kv_type if kv_type_v is None else check_type(as_type(kv_type_v))
        fa = resolve_flash_attn(flash_attn, batch_invariant, TYPE_TRAITS[kv_type_v].is_quantized)
        if batch_invariant:
            for b in backends:
                if not set_batch_invariant(b, True):
                    raise ArgumentError(f"load: batch_invariant: backend '{b.name()}' cannot reduce in one order "
                                        f"whatever the batch (it has no {SET_BATCH_INVARIANT})")
        self.batch_invariant = batch_invariant
        self.n_ctx = check_positive(n_ctx, "load: n_ctx")
        self.n_batch = min(check_positive(n_batch, "load: n_batch"), self.n_ctx)
        self.check_finite = bool(check_finite)
        self.file = gf
        self.hparams = HParams.from_gguf(gf)
        hp = self.hparams
        self.backends = backends
        self.layer_backend, self.output_backend, overrides = _placement(hp.n_layer, backends, n_layers_on,
                                                                        tensor_split, override_tensor)
        first = self.layer_backend[0]
        # a mistyped special token id fails the load, not the first generation
        self._bos: int | None = read_int(gf, "tokenizer.ggml.bos_token_id", None, minimum=-1)
        self._eos: int | None = read_int(gf, "tokenizer.ggml.eos_token_id", None, minimum=-1)

        def backend_of(name: str) -> Backend:
            for rx, b in overrides:  # the first match wins, as in llama.cpp's loader
                if rx.search(name):
                    return b
            il = layer_of(name)
            if il is not None:
                return self.layer_backend[il]
            return first if name == "token_embd.weight" else self.output_backend

        names = check_tensors(hp, gf)
        self.overridden = {n: backend_of(n) for n in names if any(rx.search(n) for rx, _ in overrides)}
        for rx, _ in overrides:
            if not any(rx.search(n) for n in names):  # llama.cpp says nothing: a mistyped pattern would go unseen
                log.warning("override_tensor %r matches no weight of '%s'", rx.pattern, gf.name)
        chosen: dict[str, BufferType | None] = {}

        def extra_buft(weight: Tensor, backend: Backend) -> BufferType | None:
            if weight.name not in chosen:
                chosen[weight.name] = _extra_buft(weight, backend)
            return chosen[weight.name]

        buft_of = extra_buft if repack else None
        self.n_seq_max = check_positive(n_seq_max, "load: n_seq_max")
        self._check_memory(names, backend_of, (kv_type, kv_type_v), use_mmap, buft_of)
        self.weights: LoadedTensors = load_tensors(gf, names, backend_of, use_mmap=use_mmap, progress=progress,
                                                   buft_of=buft_of)
        self.w = self.weights.tensors
        if any("_exps." in name for name in names):  # a token reads n_expert_used of n_expert experts
            gf.read_pages_on_demand()
        self._measure_ctxs: list[Context] = []
        kv: KVCache | None = None
        self.rs: RecurrentState | None = None
        try:
            self.flash_attn: bool = fa
            # a layer's KV cache sits where its attention is computed (offload_kqv), else on the fallback
            fallback = backends[-1]
            attends = {id(b): all(all_support([b], "attention", t) for t in {kv_type, kv_type_v}) for b in backends}
            self.kv_backend = [b if attends[id(b)] else fallback for b in self.layer_backend]
            # SET_ROWS and GLU only where every backend has them, so no backend hands single nodes away
            workers = [b for b in self.layer_backend if attends[id(b)]] or [fallback]
            self._graph_kw = {"flash_attn": self.flash_attn, "set_rows": all_support(self.kv_backend, "set_rows"),
                              "glu": all_support(workers, "glu", ffn=hp.arch.ffn)}
            kv = self.kv = KVCache(hp.n_layer, self.n_ctx, hp.n_embd_gqa, self.kv_backend, kv_type,
                                   v_trans=not self.flash_attn, ordered=batch_invariant, type_v=kv_type_v,
                                   head_dim=hp.head_dim,
                                   layers=[il for il in range(hp.n_layer) if not hp.is_recurrent(il)])
            if hp.any_recurrent:
                self.rs = RecurrentState(hp, self.n_seq_max, self.kv_backend)
            # graphs are reused while the shapes match (llama.cpp's can_reuse), not the CPY graph (views at n_past)
            self.reuse_graphs = bool(reuse_graphs) and self._graph_kw["set_rows"]
            self.runner = Runner(backends, self._measure_graphs(), graph_size(hp),
                                 keep_graphs=KEEP_GRAPHS if self.reuse_graphs else 1)
        except BaseException:
            # nothing of a failed load stays behind
            if kv is not None:
                kv.free()
            if self.rs is not None:
                self.rs.free()
            self.weights.free()
            raise
        finally:
            for ctx in self._measure_ctxs:
                ctx.free()
            self._measure_ctxs = []
        self._tokenizer: Any = None
        # beyond llama.cpp (the last graph only): KEEP_GRAPHS graphs by shape, least recently used first
        self._graphs: dict[GraphKey, tuple[Context, GraphInputs, Graph]] = {}
        self.keep_graphs = KEEP_GRAPHS if self.reuse_graphs else 1
        self._last_key: GraphKey | None = None
        self.n_graphs_built = 0

    def _check_memory(self, names: list[str], backend_of: Any, kv_types: tuple[GGMLType, GGMLType], use_mmap: bool,
                      buft_of: Callable[[Tensor, Backend], BufferType | None] | None = None) -> None:
        """OutOfMemoryError before anything is allocated when the host backends' KV cache, a lower bound of the
        compute buffers and the copied (not mapped) weights exceed host memory."""
        hp = self.hparams
        host = {id(b): is_host_backend(b) for b in self.backends}
        cell_bytes = sum(row_size(t, hp.n_embd_gqa) for t in kv_types)
        kv_bytes = sum(self.n_ctx * cell_bytes for il, b in enumerate(self.layer_backend)
                       if host[id(b)] and not hp.is_recurrent(il))
        if hp.any_recurrent and any(host[id(b)] for b in self.layer_backend):
            kv_bytes += state_bytes(hp, self.n_seq_max)  # counted whole on the host, an upper bound
        compute = 0
        if any(host[id(b)] for b in self.layer_backend):
            compute = 4 * self.n_ctx * self.n_batch * (hp.n_head + 1)  # F32 KQ of n_head heads + KQ_mask
        weights = 0
        probe = Context(mem_size=len(names) * tensor_overhead(), no_alloc=True) if buft_of is not None else None
        try:
            for name in names:
                b = backend_of(name)
                if not host[id(b)]:
                    continue
                info = self.file.tensor(name)
                copied = not (use_mmap and maps_weights(b))
                if not copied and probe is not None:
                    t = probe.new_tensor(info.type, list(info.ne) or [1])
                    t.set_name(name)
                    copied = buft_of(t, b) is not None
                if copied:
                    weights += info.nbytes
        finally:
            if probe is not None:
                probe.free()
        total = kv_bytes + compute + weights
        check_host_alloc(total, f"'{self.file.name}' with n_ctx {self.n_ctx} (KV cache"
                                f"{' and recurrent state' if hp.any_recurrent else ''} {kv_bytes} bytes + "
                                f"compute buffers at least {compute} bytes"
                         + (f" + copied weights {weights} bytes)" if weights else ")"))

    def _new_ctx(self) -> Context:
        size = graph_size(self.hparams)
        return Context(mem_size=size * tensor_overhead() + graph_overhead(size), no_alloc=True)

    def _measure_graphs(self) -> list[tuple[Any, list[tuple[Any, Backend]]]]:
        """The worst-case graphs (n_batch tokens at the end of the context; all logits, the last) to reserve."""
        self._measure_ctxs = [self._new_ctx(), self._new_ctx()]
        out = []
        for ctx, last_only in zip(self._measure_ctxs, (False, True), strict=True):
            gf, inp = build_graph(ctx, self.hparams, self.w, self.kv, self.n_batch, self.n_ctx - self.n_batch,
                                  last_only, rs=self.rs, rs_cell=(0, 0), **self._graph_kw)
            out.append((gf, self._pins(inp)))
        return out

    def _inputs(self, inp: GraphInputs, batch: Batch) -> list[tuple[Any, np.ndarray]]:
        """The values of a batch's graph inputs (the masks F16 with flash attention)."""
        kv, hp = self.kv, self.hparams
        masks = [(inp.mask, kv.mask(batch.pos, batch.seq_ids, batch.n_kv))] if hp.any_attention else []
        if inp.mask_swa is not None:
            masks.append((inp.mask_swa, kv.mask(batch.pos, batch.seq_ids, batch.n_kv, hp.n_swa)))
        # what the graph does not read is not allocated (the positions where no layer ropes)
        out = [(inp.tokens, batch.ids)] + ([(inp.pos, batch.pos)] if hp.any_rope else [])
        out += [(t, m.astype(np.float16) if self.flash_attn else m) for t, m in masks]
        if inp.k_idxs is not None and inp.v_idxs is not None:
            out += [(inp.k_idxs, kv.k_idxs(batch.cells)), (inp.v_idxs, kv.v_idxs(batch.cells))]
        if inp.out_ids is not None:
            assert batch.out_rows is not None
            out.append((inp.out_ids, batch.out_rows))
        if inp.rs is not None and self.rs is not None:
            out += self.rs.input_values(inp.rs)
        return out

    def _decode(self, ids: np.ndarray, last_only: bool) -> np.ndarray:
        """Evaluate one batch of sequence 0 after its tokens in the KV cache; logits (n_outputs, n_vocab)."""
        n_past = self.kv.n
        pos = np.arange(n_past, n_past + len(ids), dtype=np.int32)
        return self._decode_batch(ids, pos, np.zeros(len(ids), dtype=np.int32), last_only, None)

    def _decode_batch(self, ids: np.ndarray, pos: np.ndarray, seq_ids: np.ndarray, last_only: bool,
                      out_rows: np.ndarray | None, written: list[np.ndarray] | None = None,
                      embeddings: bool = False) -> np.ndarray:
        """llama_decode of one batch of at most n_batch tokens, each to a free cell."""
        if self.rs is not None:
            if len(np.unique(seq_ids)) > 1:
                return self._decode_by_sequence(ids, pos, seq_ids, last_only, out_rows, written, embeddings)
            rs_cell = self.rs.slot(int(seq_ids[0]), pos)
        else:
            rs_cell = (0, -1)
        kv = self.kv
        n_tokens = len(ids)
        cells = kv.find_slot(n_tokens, seq_ids, pos)
        if cells is None:  # an ordered cache without free cells above a sequence's own: its cells moved down
            moved = kv.compact()
            if written is not None:
                written[:] = [moved[c] for c in written]
            cells = kv.find_slot(n_tokens, seq_ids, pos)
            assert cells is not None
        head = int(cells[0])
        if not self._graph_kw["set_rows"] and int(cells[-1]) != head + n_tokens - 1:
            raise UnsupportedOpError(f"a batch of {n_tokens} tokens goes to cells {cells.tolist()[:8]}...: cells that "
                                     f"are not one run need SET_ROWS, which a backend holding the cache lacks")
        kv.apply(cells, pos, seq_ids)
        if written is not None:
            written.append(cells)
        try:
            batch = Batch(ids, pos, seq_ids, cells, self._n_kv(kv.used_end()), last_only, out_rows, embeddings,
                          rs_cell)
            logits = self._compute(batch)
        except BaseException:
            kv.free_cells(cells)  # a failed batch adds nothing to the cache
            if self.rs is not None:  # its state may be written: the sequence ends
                self._seq_rm(int(seq_ids[0]))
            raise
        if self.rs is not None:
            self.rs.apply(int(seq_ids[0]), int(pos[-1]))
        return logits

    def _decode_by_sequence(self, ids: np.ndarray, pos: np.ndarray, seq_ids: np.ndarray, last_only: bool,
                            out_rows: np.ndarray | None, written: list[np.ndarray] | None,
                            embeddings: bool) -> np.ndarray:
        """A batch of several sequences as one batch per sequence (a recurrent state is read and written one
        sequence at a time, as llama.cpp's equal-length splits of one sequence each); the rows in token order."""
        wanted = np.zeros(len(ids), dtype=bool)
        if not last_only:
            wanted[np.arange(len(ids)) if out_rows is None else out_rows] = True
        parts, order = [], []
        for s in dict.fromkeys(seq_ids.tolist()):
            tokens = np.flatnonzero(seq_ids == s)
            rows = np.flatnonzero(wanted[tokens]).astype(np.int32)
            out = self._decode_batch(ids[tokens], pos[tokens], seq_ids[tokens], len(rows) == 0,
                                     None if len(rows) in (0, len(tokens)) else rows, written, embeddings)
            if len(rows):
                parts.append(out)
                order.append(tokens[rows])
        width = self.hparams.n_embd if embeddings else self.hparams.n_vocab
        if not parts:
            return np.zeros((0, width), dtype=np.float32)
        return np.concatenate(parts)[np.argsort(np.concatenate(order), kind="stable")]

    def _compute(self, batch: Batch) -> np.ndarray:
        n_tokens, n_kv = len(batch.ids), batch.n_kv
        key = (n_tokens, n_kv, batch.n_outputs, batch.last_only, batch.embeddings, *batch.rs_cell)
        kept = self._graphs.get(key) if self.reuse_graphs else None
        if kept is not None:
            inp = kept[1]
            try:
                if key == self._last_key:
                    self.runner.run_again(self._inputs(inp, batch))
                else:
                    self._graphs[key] = self._graphs.pop(key)
                    self._last_key = key
                    self.runner.run(kept[2], self._inputs(inp, batch), self._pins(inp))
            except BaseException:
                self._forget_graph()
                raise
        else:
            if not self.reuse_graphs:
                self._forget_graph()
            while len(self._graphs) >= self.keep_graphs:
                self._drop_graph(next(iter(self._graphs)))
            ctx = self._new_ctx()
            try:
                gf, inp = self._build(ctx, batch)
                self.n_graphs_built += 1
                self.runner.run(gf, self._inputs(inp, batch), self._pins(inp))
            except BaseException:
                self._forget_graph()
                ctx.free()
                raise
            self._graphs[key] = (ctx, inp, gf)
            self._last_key = key
        logits = tensor_get_numpy(inp.logits).reshape(-1, self.hparams.n_embd if batch.embeddings
                                                      else self.hparams.n_vocab)
        # NaN or inf anywhere upstream reaches the logits
        if self.check_finite and not np.isfinite(logits).all():
            raise self._non_finite_error(batch, logits)
        return logits

    def _build(self, ctx: Context, batch: Batch) -> tuple[Graph, GraphInputs]:
        return build_graph(ctx, self.hparams, self.w, self.kv, len(batch.ids), int(batch.cells.min()),
                           batch.last_only, n_kv=batch.n_kv,
                           n_outputs=None if batch.out_rows is None else len(batch.out_rows),
                           embeddings=batch.embeddings, rs=self.rs, rs_cell=batch.rs_cell, **self._graph_kw)

    def _pins(self, inp: GraphInputs) -> list[tuple[Any, Backend]]:
        """Each layer's norms on the layer's backend (llama.cpp's graph callback pins "norm" likewise)."""
        return [(norm, self.layer_backend[il]) for il, norm in inp.norms]

    def _forget_graph(self) -> None:
        self.runner.forget()
        for ctx, _, _ in self._graphs.values():
            ctx.free()
        self._graphs = {}
        self._last_key = None

    def set_keep_graphs(self, n: int) -> None:
        """Keep the last `n` graphs by their shapes (default KEEP_GRAPHS; 1 where graphs are not reused)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ArgumentError(f"keep_graphs must be an int >= 1, got {n!r}")
        if not self.reuse_graphs:
            return
        self.keep_graphs = n
        self.runner.sched.keep_graphs = n
        while len(self._graphs) > n:
            self._drop_graph(next(iter(self._graphs)))

    def _drop_graph(self, key: GraphKey) -> None:
        ctx, _, gf = self._graphs.pop(key)
        self.runner.forget(gf)
        ctx.free()
        if key == self._last_key:
            self._last_key = None

    def _n_kv(self, used: int) -> int:
        """llama.cpp's n_kv for `used` cells: min(n_ctx, max(256, GGML_PAD(used, 256)))."""
        return min(self.n_ctx, max(KV_PAD, (used + KV_PAD - 1) // KV_PAD * KV_PAD))

    def _non_finite_error(self, batch: Batch, logits: np.ndarray) -> NonFiniteError:
        """NonFiniteError naming the first tensor with NaN or inf; the batch's and free cells are zeroed, since a
        masked NaN in padded cells still spreads (0 * NaN is NaN)."""
        n_bad = int((~np.isfinite(logits)).sum())
        kind = "NaN" if np.isnan(logits).any() else "inf"
        try:
            where = self._first_non_finite(batch)
        except GGMLError as e:
            where = f"the tensor where it starts is unknown (computing the batch again with checks failed: {e})"
        finally:
            self.kv.clear_cells_at(np.union1d(batch.cells, np.flatnonzero(self.kv.cell_pos < 0)))
        p0, p1 = int(batch.pos.min()), int(batch.pos.max())
        return NonFiniteError(
            f"'{self.file.name}': the logits of positions {p0}..{p1} hold {kind} "
            f"({n_bad} of {logits.size} values are not finite); {where} (check_finite=False, or "
            f"--no-check-finite, skips this check)")

    def _first_non_finite(self, batch: Batch) -> str:
        """The batch computed again under the eval callback, describing the first node not all finite."""
        self._forget_graph()
        ctx = self._new_ctx()
        found: list[tuple[int, Any, int, int]] = []
        try:
            gf, inp = self._build(ctx, batch)
            order = {id(n): i for i, n in enumerate(gf.nodes)}
            # nodes built as views (a KV write's result is the cache): their values are the cache's, which may
            # hold what an earlier batch left; the nodes reading the cells are checked instead
            built_views = {id(n) for n in gf.nodes if n.view_src is not None}

            def observe(node: Any, ask: bool) -> bool:
                if ask:  # a view op shows its source's values (not an in-place op, which has view_src too)
                    return (not is_view_op(node.op) and id(node) not in built_views
                            and node.type in (GGMLType.F32, GGMLType.F16))
                values = tensor_get_numpy(node)
                n_nan, n_inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
                if n_nan or n_inf:
                    found.append((order.get(id(node), -1), node, n_nan, n_inf))
                    return False
                return True

            self.runner.set_eval_callback(observe)
            try:
                self.runner.run(gf, self._inputs(inp, batch), self._pins(inp))
            finally:
                self.runner.set_eval_callback(None)
                self.runner.forget()
            if not found:
                return "computing the batch again with every tensor checked found them all finite"
            i, node, n_nan, n_inf = found[0]
            layer = {id(t): il for il, nodes in enumerate(inp.layer_nodes) for t in nodes}
            il = layer.get(id(node))
            first_layer_node = min((order[id(t)] for nodes in inp.layer_nodes for t in nodes if id(t) in order),
                                   default=0)
            part = f"layer {il}" if il is not None else ("the output" if i > first_layer_node
                                                          else "the token embedding")
            srcs = ", ".join(f"'{s.name}'" for s in node.src if s is not None)
            values = n_nan + n_inf
            return (f"the first tensor that is not finite is '{node.name or f'node {i}'}' ({node.op.name} of "
                    f"{srcs}) in {part}: {values} of {node.nelements()} values ({n_nan} NaN, {n_inf} inf)"
                    f"{self._bad_sources(node, self.w, self.kv)}")
        finally:
            ctx.free()

    def _bad_sources(self, node: Any, w: dict[str, Any], kv: KVCache) -> str:
        """What is not finite among the node's weights and KV cache views."""
        cache = {id(t) for t in (*kv.k.values(), *kv.v.values())}
        out = ""
        for s in node.src:
            if s is None:
                continue
            if w.get(s.name) is s:
                values = self.file.tensor_float(s.name)
                what = f"weight '{s.name}'"
            elif s.view_src is not None and id(s.view_src) in cache:
                values = tensor_get_numpy(s)
                what = f"the KV cache cells it reads ('{s.name}')"
            else:
                continue
            n_nan, n_inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
            if n_nan or n_inf:
                out += f"; {what} holds {n_nan} NaN and {n_inf} inf"
        return out

    def eval(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Evaluate `ids` after the KV cache's tokens; logits (len(ids), n_vocab)."""
        arr = self._check_ids(ids)
        start = self.kv.n
        try:
            out = [self._decode(arr[i: i + self.n_batch], False) for i in range(0, len(arr), self.n_batch)]
        except BaseException:
            self._seq_rm(0, start)  # a failed call adds nothing to the cache
            raise
        if not out:
            return np.zeros((0, self.hparams.n_vocab), dtype=np.float32)
        return np.concatenate(out, axis=0)

    def eval_last(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """As `eval`, the last id's logits only."""
        arr = self._check_ids(ids)
        if len(arr) == 0:
            raise ArgumentError("eval_last: no ids given")
        logits = None
        start = self.kv.n
        try:
            for i in range(0, len(arr), self.n_batch):
                logits = self._decode(arr[i: i + self.n_batch], True)
        except BaseException:
            self._seq_rm(0, start)  # a failed call adds nothing to the cache
            raise
        assert logits is not None
        return logits[-1]

    def _check_ids(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        if arr.size and (arr.min() < 0 or arr.max() >= self.hparams.n_vocab):
            bad = int(arr[(arr < 0) | (arr >= self.hparams.n_vocab)][0])
            raise ArgumentError(f"token id {bad} is out of the vocabulary (n_vocab {self.hparams.n_vocab})")
        self.kv.check_room(int(arr.size))
        return arr.astype(np.int32)

    def reset(self) -> None:
        """Empty the KV cache (and recurrent state): the next eval starts at position 0."""
        self.kv.clear()
        if self.rs is not None:
            self.rs.clear()

    def truncate(self, n_keep: int) -> None:
        """Keep the first `n_keep` tokens of the KV cache (llama_memory_seq_rm from n_keep on)."""
        if isinstance(n_keep, bool) or not isinstance(n_keep, int | np.integer) or not 0 <= n_keep <= self.kv.n:
            raise ArgumentError(f"truncate: n_keep must be an integer in [0, {self.kv.n}] (the tokens in the KV "
                                f"cache), got {n_keep!r}")
        self._seq_rm(0, int(n_keep))

    @property
    def n_past(self) -> int:
        return self.kv.n

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from pyggml.models.tokenizer import Tokenizer

            try:
                self._tokenizer = Tokenizer.from_gguf(self.file)  # reads like a gguf.GGUFReader (fields, get_field)
            except (AttributeError, TypeError):
                self._tokenizer = Tokenizer.from_gguf(self.file.reader)
        return self._tokenizer

    def tokenize(self, text: str, add_bos: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text` as llama.cpp's tools tokenize a prompt (BOS/EOS as the file says, special tokens)."""
        return list(self.tokenizer.encode(text, add_bos, parse_special))

    def detokenize(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids)))

    def token_eos(self) -> int | None:
        """tokenizer.ggml.eos_token_id; None if absent, -1 or out of the vocabulary (llama.cpp ignores it)."""
        return self._eos if self._eos is not None and 0 <= self._eos < self.hparams.n_vocab else None

    def token_bos(self) -> int | None:
        """The file's beginning-of-sequence id (tokenizer.ggml.bos_token_id); None as for `token_eos`."""
        return self._bos if self._bos is not None and 0 <= self._bos < self.hparams.n_vocab else None

    def eog_ids(self) -> frozenset[int]:
        """llama_vocab_is_eog's tokens; EOS alone for a vocabulary pyggml cannot read."""
        try:
            return self.tokenizer.eog_ids
        except GGMLError:
            eos = self.token_eos()
            return frozenset() if eos is None else frozenset((eos,))

    def generate(self, prompt: str | Sequence[int], max_tokens: int, sampler: Any = None,
                 stop_at_eos: bool = True) -> Iterator[int]:
        """Yield up to `max_tokens` token ids after `prompt`, continuing the KV cache (sampler None: greedy)."""
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
        history = list(ids)
        if max_tokens <= 0:
            return
        logits = self.eval_last(ids)
        stop = self.eog_ids() if stop_at_eos else frozenset()
        for n in range(max_tokens):
            tok = int(np.argmax(logits)) if sampler is None else int(sampler.sample(logits, history))
            history.append(tok)
            yield tok
            if tok in stop or n == max_tokens - 1 or self.kv.n >= self.n_ctx:
                return  # the last token is yielded, not evaluated
            logits = self.eval_last([tok])

    # --- several sequences (llama.cpp's llama_decode over a unified KV cache, llama_memory_seq_*) ---

    def decode(self, tokens: Sequence[int] | np.ndarray, seq_ids: Sequence[int] | np.ndarray | int = 0,
               positions: Sequence[int] | np.ndarray | None = None,
               outputs: Sequence[bool] | np.ndarray | None = None, embeddings: bool = False) -> np.ndarray:
        """llama_decode over the shared KV cache: logits (n_outputs, n_vocab) of the tokens `outputs` marks
        (default: each sequence's last), or with `embeddings` their hidden states (n_outputs, n_embd)."""
        ids = self._check_ids(tokens)
        n = len(ids)
        if n == 0:
            raise ArgumentError("decode: no tokens given")
        seqs = np.broadcast_to(np.asarray(seq_ids, dtype=np.int64), (n,)).astype(np.int32)
        present = np.unique(seqs)
        for s in present:
            self.kv.seq_pos_max(int(s))
        if positions is None:
            pos = np.empty(n, dtype=np.int32)
            for s in present:
                where = np.flatnonzero(seqs == s)
                start = self.kv.seq_pos_max(int(s)) + 1
                pos[where] = np.arange(start, start + len(where), dtype=np.int32)
        else:
            pos = np.asarray(positions, dtype=np.int64).reshape(-1)
            if pos.shape != (n,) or pos.min() < 0 or pos.max() > np.iinfo(np.int32).max:
                raise ArgumentError(f"decode: positions must be {n} integers in [0, 2^31), got shape {pos.shape}")
            pos = pos.astype(np.int32)
        if outputs is None:
            wanted = np.zeros(n, dtype=bool)
            for s in present:
                wanted[np.flatnonzero(seqs == s)[-1]] = True
        else:
            wanted = np.asarray(outputs, dtype=bool).reshape(-1)
            if wanted.shape != (n,):
                raise ArgumentError(f"decode: outputs must be {n} flags, got shape {wanted.shape}")
        if self.rs is not None:  # each sequence's tokens continue its state: checked before any is computed
            for s in present:
                self.rs.slot(int(s), pos[seqs == s])
        done: list[np.ndarray] = []
        written: list[np.ndarray] = []
        try:
            for i in range(0, n, self.n_batch):
                part = slice(i, i + self.n_batch)
                rows = np.flatnonzero(wanted[part]).astype(np.int32)
                logits = self._decode_batch(ids[part], pos[part], seqs[part], len(rows) == 0,
                                            None if len(rows) in (0, len(ids[part])) else rows, written, embeddings)
                if len(rows):
                    done.append(logits)
        except BaseException:
            for cells in written:  # a failed call adds nothing to the cache
                self.kv.free_cells(cells)
            if self.rs is not None and written:  # states the call may have written: their sequences end
                for s in present:
                    self._seq_rm(int(s))
            raise
        if not done:
            return np.zeros((0, self.hparams.n_embd if embeddings else self.hparams.n_vocab), dtype=np.float32)
        return np.concatenate(done, axis=0)

    def embed(self, inputs: str | Sequence[int] | Sequence[str | Sequence[int]], pooling: str | None = None,
              embd_normalize: int = EMBD_NORMALIZE) -> np.ndarray | list[np.ndarray]:
        """Embeddings of a text or ids (or a list of them) as llama-embedding computes them, each input in a free
        sequence, pooled by `pooling` (default the file's) and normalized."""
        from pyggml.models.pooling import check_pooling, normalize, pool

        mode = check_pooling(pooling if pooling is not None else self.pooling_type)
        single = isinstance(inputs, str) or (len(inputs) > 0 and all(isinstance(t, int | np.integer)
                                                                     and not isinstance(t, bool) for t in inputs))
        items: list[Any] = [inputs] if single else list(inputs)
        if not items:
            raise ArgumentError("embed: no inputs given")
        out = []
        for item in items:
            ids = self.tokenize(item) if isinstance(item, str) else [int(t) for t in item]
            if not ids:
                raise ArgumentError("embed: an input has no tokens")
            seq = self._spare_seq()
            try:
                hidden = self.decode(ids, seq, positions=np.arange(len(ids)), outputs=np.ones(len(ids), dtype=bool),
                                     embeddings=True)
            finally:
                self._seq_rm(seq)
            out.append(normalize(pool(hidden, mode), embd_normalize))
        if single:
            return out[0]
        return np.stack(out) if mode != "none" else out

    @property
    def pooling_type(self) -> str:
        """`<arch>.pooling_type`'s name, "none" without one, as llama.cpp."""
        from pyggml.models.pooling import file_pooling

        return file_pooling(self.file, self.hparams.arch.name)

    def _spare_seq(self) -> int:
        from pyggml.models.kv_cache import N_SEQ_MAX

        for seq in range((N_SEQ_MAX if self.rs is None else self.n_seq_max) - 1, -1, -1):
            if self.kv.seq_pos_max(seq) < 0:
                return seq
        raise ArgumentError(f"embed: all {N_SEQ_MAX} sequences of the KV cache hold tokens: none is free")

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> None:
        """Remove sequence `seq_id`'s positions [p0, p1) from the KV cache (p1 < 0: to the end); a recurrent state
        is dropped whole or kept (RecurrentStateError for a range that would cut it, nothing changed)."""
        self._seq_rm(seq_id, p0, p1)

    def _seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> None:
        """llama_memory_hybrid's seq_rm: the recurrent state first (it may refuse), then the KV cache."""
        if self.rs is not None:
            self.rs.seq_rm(seq_id, p0, p1)
        self.kv.seq_rm(seq_id, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Let sequence `dst` share `src`'s cached positions [p0, p1) (a prompt evaluated once for both); a
        recurrent state is copied whole, as llama.cpp copies it."""
        if self.rs is not None:
            self.rs.seq_cp(src, dst)
        self.kv.seq_cp(src, dst, p0, p1)

    def seq_pos_max(self, seq_id: int) -> int:
        """The last position of `seq_id` in the KV cache, -1 if it has none."""
        return self.kv.seq_pos_max(seq_id)

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], max_tokens: int,
                       samplers: Sequence[Any] | None = None, stop_at_eos: bool = True) -> list[list[int]]:
        """Sequences decoded together from an empty KV cache, one batch per step; the new ids of each."""
        ids = [self.tokenize(p) if isinstance(p, str) else [int(t) for t in p] for p in prompts]
        if not ids or any(not x for x in ids):
            raise ArgumentError(f"generate_batch: {len(ids)} prompts, each needs at least one token")
        if samplers is not None and len(samplers) != len(ids):
            raise ArgumentError(f"generate_batch: {len(samplers)} samplers for {len(ids)} prompts")
        self.reset()
        out: list[list[int]] = [[] for _ in ids]
        if max_tokens <= 0:
            return out
        histories = [list(x) for x in ids]
        stop = self.eog_ids() if stop_at_eos else frozenset()
        active = list(range(len(ids)))
        logits = self.decode(np.concatenate([np.asarray(x, dtype=np.int64) for x in ids]),
                             np.repeat(np.arange(len(ids)), [len(x) for x in ids]))
        while active:
            step_tokens, still = [], []
            for row, s in enumerate(active):
                sampler = samplers[s] if samplers is not None else None
                tok = int(np.argmax(logits[row])) if sampler is None else int(sampler.sample(logits[row],
                                                                                           histories[s]))
                out[s].append(tok)
                histories[s].append(tok)
                if tok not in stop and len(out[s]) < max_tokens:
                    step_tokens.append(tok)
                    still.append(s)
            active = still
            if not active or self.kv.n_free() < len(active):
                break
            logits = self.decode(step_tokens, active)
        return out

    def chat(self, messages: Sequence[Mapping[str, Any]], *, max_tokens: int = 256, stream: bool = False,
             sampler: Any = None, template: Any = None, template_kwargs: Mapping[str, Any] | None = None,
             **sampling: Any) -> str | Iterator[str]:
        """The reply to `messages` through the file's chat template (ChatML without one), from an empty KV cache;
        text, or with `stream=True` pieces. Sampler keywords as `Sampler`'s; multi-turn: `chat.ChatSession`."""
        from pyggml.models.chat import chat

        return chat(self, messages, max_tokens=max_tokens, stream=stream, sampler=sampler, template=template,
                    template_kwargs=template_kwargs, **sampling)

    def memory(self) -> dict[str, dict[str, int]]:
        """Bytes per backend ("<name>#<index>"): weights (as llama.cpp's load log counts them), KV cache (with the
        recurrent state), compute."""
        compute = self.runner.buffer_sizes()
        out: dict[str, dict[str, int]] = {}
        for i, b in enumerate(self.backends):
            out[f"{b.name()}#{i}"] = {"weights": self.weights.nbytes.get(id(b), 0),
                                      "kv_cache": self.kv.nbytes.get(id(b), 0)
                                      + (self.rs.nbytes.get(id(b), 0) if self.rs is not None else 0),
                                      "compute": compute.get(id(b), 0)}
        return out

    def free(self) -> None:
        self._forget_graph()
        self.runner.free()
        self.kv.free()
        if self.rs is not None:
            self.rs.free()
        self.weights.free()

    def __repr__(self) -> str:
        hp = self.hparams
        return (f"Model('{self.file.name}', n_layer={hp.n_layer}, n_embd={hp.n_embd}, n_vocab={hp.n_vocab}, "
                f"n_ctx={self.n_ctx}, backends={[b.name() for b in self.backends]})")


def load(path: str | os.PathLike[str], backends: Sequence[Backend | str] | None = None, n_ctx: int = 512,
         n_layers_on: int | Sequence[int] | None = None, n_threads: int | None = None, **kwargs: Any) -> Model:
    """Load a GGUF model (a family of `ARCHS`) over `backends` (Backends or registry names; default
    CPU): `n_layers_on` as -ngl, `tensor_split` as -ts, `override_tensor` as -ot; other keywords go to `Model`."""
    if n_threads is not None:
        check_positive(n_threads, "load: n_threads")
    bs: list[Backend] = []
    for b in backends if backends is not None else ["cpu"]:
        bs.append(init_backend(b) if isinstance(b, str) else b)
    if n_threads is not None:
        for b in bs:
            set_n_threads(b, n_threads)
    gf = read_gguf(path)
    try:
        return Model(gf, bs, n_ctx=n_ctx, n_layers_on=n_layers_on, **kwargs)
    except BaseException:
        gf.close()
        raise
