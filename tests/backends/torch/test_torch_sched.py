"""A LLaMA graph split between the torch and CPU backends by the scheduler gives the CPU-only result."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pyggml.backends.cpu import cpu_init
from pyggml.backends.torch import torch_init
from pyggml.core.context import Context, tensor_overhead
from pyggml.core.graph import graph_overhead
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import GGMLType, from_float, to_float
from pyggml.ggml_backend import Backend, tensor_get_numpy, tensor_set, tensor_set_numpy
from pyggml.models.kv_cache import KVCache
from pyggml.models.llama import LlamaHParams, build_llama, graph_size, layer_of, tensor_names
from pyggml.seed import Scheduler
from pyggml.testing import alloc_ctx_tensors

HP = LlamaHParams(n_vocab=96, n_ctx_train=128, n_embd=64, n_layer=3, n_ff=128, n_head=4, n_head_kv=2, n_rot=16,
                  f_norm_rms_eps=1e-5, rope_freq_base=10000.0, rope_freq_scale=1.0)
N_CTX = 32


def _shape(name: str) -> list[int]:
    e, f, kv = HP.n_embd, HP.n_ff, HP.n_embd_gqa
    base = name.split(".")[-2]
    return {"token_embd": [e, HP.n_vocab], "output_norm": [e], "output": [e, HP.n_vocab], "attn_norm": [e],
            "attn_q": [e, e], "attn_k": [e, kv], "attn_v": [e, kv], "attn_output": [e, e], "ffn_norm": [e],
            "ffn_gate": [e, f], "ffn_up": [e, f], "ffn_down": [f, e]}[base]


class Llama:
    """Random LLaMA weights (`wtype` matrices, F32 norms) on per-layer backends, a KV cache, a scheduler."""

    def __init__(self, backends: list[Backend], layer_backend: list[Backend], embd: Backend, out: Backend,
                 wtype: GGMLType, dequantized: frozenset[str] = frozenset()) -> None:
        """`dequantized`: weights given as F32 holding what `wtype` would hold (quantized, then dequantized)."""
        rng = np.random.default_rng(42)
        self.backends = backends
        self.ctxs: list[Context] = []
        self.buffers = []
        self.w: dict[str, Tensor] = {}
        groups: dict[int, tuple[Backend, list[str]]] = {}
        for name in tensor_names(HP):
            il = layer_of(name)
            b = layer_backend[il] if il is not None else (embd if name == "token_embd.weight" else out)
            groups.setdefault(id(b), (b, []))[1].append(name)
        values = {name: rng.standard_normal(_shape(name)[::-1]).astype(np.float32)
                  * (1.0 if "norm" in name else 1 / math.sqrt(_shape(name)[0])) + (1.0 if "norm" in name else 0.0)
                  for name in tensor_names(HP)}
        for b, names in groups.values():
            ctx = Context(mem_size=64 * tensor_overhead(), no_alloc=True)
            for name in names:
                type = GGMLType.F32 if "norm" in name or name in dequantized else wtype
                self.w[name] = ctx.new_tensor(type, _shape(name)).set_name(name)
            self.buffers.append(alloc_ctx_tensors(ctx, b))
            for name in names:
                v = values[name]
                if name in dequantized:
                    v = np.asarray(to_float(wtype, from_float(wtype, v)), dtype=np.float32).reshape(v.shape)
                tensor_set_numpy(self.w[name], v)
            self.ctxs.append(ctx)
        self.kv = KVCache(HP.n_layer, N_CTX, HP.n_embd_gqa, layer_backend)
        self.input_backend = embd
        self.sched = Scheduler(backends)
        ctx, graph, inputs = self._graph(8, N_CTX - 8)
        talloc = self.sched.get_tallocr(embd)
        for t in inputs:
            talloc.alloc(t)
        self.sched.init_measure(graph)
        ctx.free()

    def _graph(self, n_tokens: int, n_past: int) -> tuple[Context, object, list[Tensor]]:
        size = graph_size(HP)
        ctx = Context(mem_size=size * tensor_overhead() + graph_overhead(size), no_alloc=True)
        graph, inp = build_llama(ctx, HP, self.w, self.kv, n_tokens, n_past, set_rows=False,
                                   glu=False)
        self.last_inputs = inp
        return ctx, graph, [inp.tokens, inp.pos, inp.mask]

    def eval(self, ids: list[int], n_past: int) -> tuple[np.ndarray, list[str]]:
        """Logits of `ids` at positions n_past.., and the backend of each split."""
        ctx, graph, (tokens, pos, mask) = self._graph(len(ids), n_past)
        talloc = self.sched.get_tallocr(self.input_backend)
        for t in (tokens, pos, mask):
            talloc.alloc(t)
        p = np.arange(n_past, n_past + len(ids), dtype=np.int32)
        tensor_set(tokens, np.asarray(ids, dtype=np.int32))
        tensor_set(pos, p)
        n_kv = n_past + len(ids)
        tensor_set(mask, np.where(np.arange(n_kv)[None, :] <= p[:, None], 0.0, -np.inf).astype(np.float32))
        self.sched.graph_compute(graph)
        logits = tensor_get_numpy(self.last_inputs.logits).reshape(len(ids), HP.n_vocab)
        where = [s.backend.name() for s in self.sched.splits]
        ctx.free()
        return logits, where

    def free(self) -> None:
        self.sched.free()
        self.kv.free()
        for b in self.buffers:
            b.free()


def _run(model: Llama) -> tuple[list[np.ndarray], list[list[str]]]:
    outs, wheres = [], []
    for ids, n_past in (([5, 17, 3, 88, 42, 7], 0), ([11], 6), ([60], 7)):
        logits, where = model.eval(ids, n_past)
        outs.append(logits)
        wheres.append(where)
    return outs, wheres


def _nmse(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.sum((g.astype(np.float64) - w) ** 2) / np.sum(w.astype(np.float64) ** 2))
               for g, w in zip(got, want, strict=True))


def _split_model(wtype: GGMLType, precision: str, dequantized: frozenset[str] = frozenset()) -> tuple[Llama, Backend]:
    """Layer 1 and the output head on torch (with `precision`), the embedding and layers 0 and 2 on the CPU."""
    tb, cpu = torch_init(matmul_precision=precision), cpu_init(2)
    return Llama([tb, cpu], [cpu, tb, cpu], cpu, tb, wtype, dequantized), tb


# NMSE bounds by weight type and precision (measured: F32 2e-13 under each; F16 6.5e-8 with f32, 8.5e-7 with
# f16/bf16, where the prompt's 6 and the decoded 1 columns multiply in F16 (kernels.matmul: fewer than
# HALF_NATIVE_MAX_COLS); BF16 6e-15 with f32, 6.9e-5 with f16/bf16 (products rounded to BF16))
@pytest.mark.parametrize("wtype, precision, tol", [
    *[(GGMLType.F32, p, 1e-10) for p in ("f32", "f16", "bf16")],
    (GGMLType.F16, "f32", 3e-7), (GGMLType.F16, "f16", 5e-6), (GGMLType.F16, "bf16", 5e-6),
    (GGMLType.BF16, "f32", 1e-10), (GGMLType.BF16, "f16", 5e-4), (GGMLType.BF16, "bf16", 5e-4),
])
@pytest.mark.slow
def test_llama_split_between_torch_and_cpu_matches_cpu_only(wtype: GGMLType, precision: str, tol: float) -> None:
    """A prompt, then two decoded tokens (reading the KV cache written on both backends)."""
    cpu_ref = cpu_init(2)
    ref = Llama([cpu_ref], [cpu_ref] * HP.n_layer, cpu_ref, cpu_ref, wtype)
    split, _ = _split_model(wtype, precision)
    try:
        want, _ = _run(ref)
        got, wheres = _run(split)
    finally:
        ref.free()
        split.free()
    assert _nmse(got, want) < tol
    for where in wheres:
        # CPU (embedding, layer 0), torch (layer 1), CPU (layer 2), torch (output head)
        assert where.count("Torch(cpu)") >= 2 and where.count("CPU") >= 2, where


# NMSE against the exact run (measured: f32 1e-13; f16 4.9e-5, bf16 1.9e-4: the dequantized weights and the
# activations rounded to the half type) and against the all-Q8_0 CPU run, whose activations are quantized
# to Q8_0 in every layer (1.2e-3 to 1.3e-3 under each)
@pytest.mark.parametrize("precision, tol_exact", [("f32", 1e-10), ("f16", 3e-4), ("bf16", 1e-3)])
@pytest.mark.slow
def test_llama_split_with_q8_0_weights(precision: str, tol_exact: float) -> None:
    """Q8_0 on torch is the dequantized weight times f32 activations (the CPU also quantizes the
    activations): with f32 products the split equals a CPU run of the dequantized values in F32; with half
    products it is that run rounded as the precision rounds. Either way it is close to the all-Q8_0 CPU run.

    The CPU-side weights of the split are the dequantized values in F32 too: a Q8_0 CPU layer after the
    torch layer would quantize its input to Q8_0, and a last-bit difference of summation order (torch's
    f32 GEMM against the CPU's, which differ by machine) would flip some of those roundings."""
    q8 = GGMLType.Q8_0
    on_torch = frozenset(n for n in tensor_names(HP) if (layer_of(n) == 1 or n == "output.weight")
                         and "norm" not in n)
    matrices = frozenset(n for n in tensor_names(HP) if "norm" not in n)
    cpu_a, cpu_b = cpu_init(2), cpu_init(2)
    exact = Llama([cpu_a], [cpu_a] * HP.n_layer, cpu_a, cpu_a, q8, dequantized=matrices)
    all_q8 = Llama([cpu_b], [cpu_b] * HP.n_layer, cpu_b, cpu_b, q8)
    split, tb = _split_model(q8, precision, dequantized=matrices - on_torch)
    try:
        want_exact, _ = _run(exact)
        want_q8, _ = _run(all_q8)
        got, _ = _run(split)
    finally:
        exact.free()
        all_q8.free()
        split.free()
    nmse_exact = _nmse(got, want_exact)
    assert nmse_exact < tol_exact
    if precision != "f32":
        assert nmse_exact > 1e-8  # the half precision was used, not f32
    assert 1e-8 < _nmse(got, want_q8) < 4e-3
    assert tb.weight_cache.hits > 0  # the dequantized weights were reused by the later steps


def test_torch_computes_the_ops_of_its_layer() -> None:
    """Every node that reads a torch layer's weights is computed on the torch backend."""
    tb, cpu = torch_init(matmul_precision="f32"), cpu_init(2)
    model = Llama([tb, cpu], [cpu, tb, cpu], cpu, cpu, GGMLType.F32)
    try:
        ctx, graph, (tokens, pos, mask) = model._graph(3, 0)
        talloc = model.sched.get_tallocr(cpu)
        for t in (tokens, pos, mask):
            talloc.alloc(t)
        tensor_set(tokens, np.int32([1, 2, 3]))
        tensor_set(pos, np.int32([0, 1, 2]))
        tensor_set(mask, np.where(np.arange(3)[None, :] <= np.arange(3)[:, None], 0.0, -np.inf).astype(np.float32))
        model.sched.graph_compute(graph)
        layer1 = [n for n in graph.nodes if n.op == GGMLOp.MUL_MAT and n.name.endswith("-1")]
        assert layer1 and all(model.sched.get_node_backend(n) is tb or model.sched.tensor_backend(n) is tb
                              for n in layer1)
        ctx.free()
    finally:
        model.free()


@pytest.mark.slow
def test_smollm2_runs_todays_graph_on_torch_alone(smollm2_path: Path) -> None:
    """SmolLM2 (Q4_1 weights) on the torch backend alone: its graph has SET_ROWS and GLU, and is one split (no
    node on the CPU)."""
    import pyggml.models as pm
    model = pm.load(smollm2_path, backends=[torch_init("cpu", matmul_precision="f32")], n_ctx=64, progress=False)
    try:
        tokens = list(model.generate(model.tokenize("Hello"), 3, stop_at_eos=False))
        assert len(tokens) == 3
        graph = model.runner.graph
        assert graph is not None
        ops = {n.op.name for n in graph.nodes}
        assert {"SET_ROWS", "GLU", "MUL_MAT", "ROPE"} <= ops, ops
        assert model.runner.sched.n_splits == 1
    finally:
        model.free()
