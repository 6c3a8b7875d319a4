"""LLaMA end to end against HF transformers: logits, quantized files, KV cache, batches, generation, splits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from tiny_llama import TinyLlama, make_tiny_llama

import pyggml.models as pm
from pyggml.backends.cpu import CPUBackend, cpu_init
from pyggml.core.errors import ArgumentError
from pyggml.core.graph import Graph
from pyggml.gguf import read_gguf
from pyggml.models.convert import hf_state_from_gguf, write_llama_gguf


def load(path: object, **kw: object) -> pm.Model:
    kw.setdefault("n_ctx", 64)
    return pm.load(path, n_threads=2, progress=False, **kw)  # type: ignore[arg-type]


def test_f32_logits_match_transformers(tiny_llama: TinyLlama, tiny_gguf: object, prompt32: np.ndarray) -> None:
    model = load(tiny_gguf("F32"))
    assert model.hparams.n_head_kv == 2 and model.hparams.n_head == 4  # GQA on
    assert model.hparams.rope_freq_base == 5000.0
    logits = model.eval(prompt32)
    ref = tiny_llama.logits(prompt32)
    assert logits.shape == (32, 320)
    assert np.abs(ref).max() > 1.0  # the comparison is not between near-zero numbers
    assert np.abs(logits - ref).max() < 1e-4
    model.free()


@pytest.mark.slow
def test_tied_embeddings_and_linear_rope_scaling(tmp_path: object, prompt32: np.ndarray) -> None:
    """No output.weight in the file: the head is token_embd (llama.cpp's tied case); RoPE positions
    scaled by 1/factor from llama.rope.scaling.factor."""
    tl = make_tiny_llama(seed=3, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    path = tmp_path / "tied.gguf"  # type: ignore[operator]
    write_llama_gguf(path, tl.config, tl.state)
    gf = read_gguf(path)
    assert "output.weight" not in gf and gf.get("llama.rope.scaling.factor") == 2.0
    model = load(path)
    assert model.hparams.rope_freq_scale == 0.5
    assert np.abs(model.eval(prompt32) - tl.logits(prompt32)).max() < 1e-4


# Tolerances of quantized files, as max |difference| / max |logit| against HF run on the file's own
# dequantized weights (so weight rounding is not counted, only what the kernels add):
# - F16: ggml converts the activations to F16 before the dot products (vec_dot_type F16): a relative
#   rounding of 2^-11 per element, accumulated over 2 layers and the head, ~1e-3 of the logits.
#   Measured: 1.0e-3.
# - Q8_0 and Q4_0: activations are quantized to Q8_0 before every matmul (8 bits per 32-block: a step of
#   1/127 of the block's max, ~0.5% of a dot product each), compounding over the 15 matmuls on the way
#   to a logit and through the softmaxes. Measured: 2.4e-2 for both; 5e-2 leaves room while a wrong
#   graph (a missing permutation, mask or norm) moves the logits by their whole scale, and Q4_0's own
#   weight rounding alone moves them by ~0.5.
QUANT_TOL = {"F16": 3e-3, "Q8_0": 5e-2, "Q4_0": 5e-2}


@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "Q4_0"])
@pytest.mark.slow
def test_quantized_files_match_reference_on_their_weights(tiny_llama: TinyLlama, tiny_gguf: object,
                                                          prompt32: np.ndarray, qtype: str) -> None:
    import transformers

    path = tiny_gguf(qtype)
    gf = read_gguf(path)
    assert gf.tensor("blk.0.attn_q.weight").type.name == qtype
    ref_model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**tiny_llama.config)).eval()
    state = {k: torch.from_numpy(v) for k, v in hf_state_from_gguf(gf, 4, 2).items()}
    ref_model.load_state_dict(state, strict=True)
    with torch.no_grad():
        ref = ref_model(torch.tensor(prompt32)[None]).logits[0].numpy()
    logits = load(path).eval(prompt32)
    err = np.abs(logits - ref).max() / np.abs(ref).max()
    assert err < QUANT_TOL[qtype], f"{qtype}: relative error {err:.2e}"
    # and the file's rounding of the weights is what separates it from the original model
    if qtype == "Q4_0":
        assert np.abs(logits - tiny_llama.logits(prompt32)).max() > np.abs(logits - ref).max()


@pytest.mark.parametrize("reuse_graphs", [True, False])
@pytest.mark.slow
def test_token_by_token_equals_whole_sequence(tiny_gguf: object, reuse_graphs: bool) -> None:
    """40 tokens one at a time (one planned graph: n_kv is n_ctx, 64, below the 256 padding) == one batch."""
    ids = np.random.default_rng(1).integers(3, 320, 40)
    model = load(tiny_gguf("F32"), reuse_graphs=reuse_graphs)
    whole = model.eval(ids)
    model.reset()
    steps = np.concatenate([model.eval(ids[:3])] + [model.eval([t]) for t in ids[3:]])
    assert model.n_past == 40
    assert np.abs(steps - whole).max() < 1e-5


def test_f16_kv_cache(tiny_llama: TinyLlama, tiny_gguf: object, prompt32: np.ndarray) -> None:
    """llama.cpp's default cache type: keys and values rounded to F16 (relative 2^-11), and the
    queries / softmax rows converted to F16 for the dot products with them: ~1e-3 of the logits."""
    model = load(tiny_gguf("F32"), kv_type="F16")
    assert model.memory()["CPU#0"]["kv_cache"] == 2 * 2 * 64 * 32 * 2
    whole = model.eval(prompt32)
    ref = tiny_llama.logits(prompt32)
    assert np.abs(whole - ref).max() / np.abs(ref).max() < 3e-3
    model.reset()
    steps = np.concatenate([model.eval([t]) for t in prompt32])
    assert np.abs(steps - whole).max() / np.abs(ref).max() < 3e-3


def test_quantized_token_by_token(tiny_gguf: object) -> None:
    ids = np.random.default_rng(2).integers(3, 320, 12)
    model = load(tiny_gguf("Q4_0"))
    whole = model.eval(ids)
    model.reset()
    steps = np.concatenate([model.eval([t]) for t in ids])
    assert np.abs(steps - whole).max() < 1e-4


def test_batches_reset_and_last_only(tiny_gguf: object, prompt32: np.ndarray) -> None:
    model = load(tiny_gguf("F32"), n_batch=8)
    batched = model.eval(prompt32)  # 4 batches of 8
    model.reset()
    again = model.eval(prompt32)
    assert np.array_equal(batched, again)  # reset starts over at position 0
    one = load(tiny_gguf("F32")).eval(prompt32)
    assert np.abs(batched - one).max() < 1e-5
    model.reset()
    last = model.eval_last(prompt32)
    assert np.abs(last - one[-1]).max() < 1e-5


@pytest.mark.slow
def test_generate_greedy_matches_transformers(tiny_llama: TinyLlama, tiny_gguf: object) -> None:
    prompt = [1, 40, 41, 42, 100, 7]
    model = load(tiny_gguf("F32"))
    got = list(model.generate(prompt, 10, stop_at_eos=False))
    with torch.no_grad():
        out = tiny_llama.hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False,
                                     min_new_tokens=10, pad_token_id=0)
    assert got == out[0, len(prompt):].tolist()
    assert model.n_past == len(prompt) + 9  # the last token is yielded, not evaluated


def test_generate_with_a_sampler(tiny_gguf: object) -> None:
    class Greedy:
        def __init__(self) -> None:
            self.histories: list[int] = []

        def sample(self, logits: np.ndarray, history: list[int]) -> int:
            assert logits.shape == (320,)
            self.histories.append(len(history))
            return int(np.argmax(logits))

    model = load(tiny_gguf("F32"))
    s = Greedy()
    toks = list(model.generate([1, 5, 6], 4, s, stop_at_eos=False))
    assert s.histories == [3, 4, 5, 6]
    model.reset()
    assert toks == list(model.generate([1, 5, 6], 4, stop_at_eos=False))


def test_kv_cache_full_and_bad_ids_leave_the_model_usable(tiny_gguf: object) -> None:
    model = load(tiny_gguf("F32"), n_ctx=16)
    model.eval(list(range(3, 13)))
    with pytest.raises(ArgumentError, match="KV cache full"):
        model.eval(list(range(3, 10)))
    with pytest.raises(ArgumentError, match="out of the vocabulary"):
        model.eval([5, 320])
    assert model.n_past == 10
    assert model.eval([3]).shape == (1, 320)


def test_generate_stops_when_the_context_is_full(tiny_gguf: object) -> None:
    model = load(tiny_gguf("F32"), n_ctx=16)
    toks = list(model.generate(list(range(3, 13)), 20, stop_at_eos=False))
    assert len(toks) == 7 and model.n_past == 16


def test_memory_figures(tiny_gguf: object) -> None:
    model = load(tiny_gguf("F32"), n_ctx=64)
    model.eval([1, 2, 3])
    mem = model.memory()
    (fig,) = mem.values()
    n_weights = sum(v.size for v in make_state_sizes(model))
    assert fig["weights"] == 4 * n_weights
    assert fig["kv_cache"] >= 2 * 2 * 64 * 32 * 4  # K and V, 2 layers, 64 cells, n_embd_gqa 32, f32
    assert fig["compute"] > 0


def make_state_sizes(model: pm.Model) -> list[np.ndarray]:
    return [np.empty(t.nelements(), dtype=np.uint8) for t in model.w.values()]


class CountingCPU(CPUBackend):
    """A CPU backend that counts the nodes it computes (to see a split really used both backends)."""

    def __init__(self, n_threads: int) -> None:
        super().__init__(n_threads)
        self.n_computed = 0

    def _graph_compute(self, graph: Graph) -> None:
        self.n_computed += graph.n_nodes
        super()._graph_compute(graph)

    def _graph_plan_compute(self, plan: Any) -> None:
        self.n_computed += plan.graph.n_nodes
        super()._graph_plan_compute(plan)


@pytest.mark.slow
def test_split_over_two_backends_gives_the_same_tokens(tiny_gguf: object, prompt32: np.ndarray) -> None:
    """Layer 0 on one CPU backend, layer 1 on another (joined by the scheduler): the same logits and greedy
    tokens as on one backend."""
    one = load(tiny_gguf("F32"))
    a, b = CountingCPU(1), CountingCPU(1)
    split = pm.load(tiny_gguf("F32"), backends=[a, b], n_layers_on=[1], n_ctx=64, progress=False)
    assert split.layer_backend == [a, b]
    assert np.abs(split.eval(prompt32) - one.eval(prompt32)).max() < 1e-4
    assert a.n_computed > 20 and b.n_computed > 20
    one.reset()
    split.reset()
    assert list(split.generate([1, 9, 8], 8, stop_at_eos=False)) == list(one.generate([1, 9, 8], 8,
                                                                                      stop_at_eos=False))
    mem = split.memory()
    assert all(m["weights"] > 0 and m["kv_cache"] > 0 and m["compute"] > 0 for m in mem.values())


@pytest.mark.slow
def test_split_with_torch_backend(tiny_gguf: object, prompt32: np.ndarray) -> None:
    from pyggml.ggml_backend.registry import init_backend

    one = load(tiny_gguf("F32"))
    split = pm.load(tiny_gguf("F32"), backends=[init_backend("torch"), cpu_init(2)], n_layers_on=[1], n_ctx=64,
                    progress=False)
    assert np.abs(split.eval(prompt32) - one.eval(prompt32)).max() < 1e-4
    one.reset()
    split.reset()
    assert list(split.generate([1, 9, 8], 8, stop_at_eos=False)) == list(one.generate([1, 9, 8], 8,
                                                                                      stop_at_eos=False))


@pytest.mark.parametrize("flash_attn", ["on", "off"])
@pytest.mark.slow
def test_flash_attn_logits_and_greedy_tokens(tiny_llama: TinyLlama, tiny_gguf: object, prompt32: np.ndarray,
                                             flash_attn: str) -> None:
    """FLASH_ATTN_EXT (V stored as K, F16 mask) or MUL_MAT + SOFT_MAX_EXT (V transposed): the same logits as
    transformers, the same greedy tokens, a batch and token by token alike."""
    model = load(tiny_gguf("F32"), flash_attn=flash_attn)
    assert model.flash_attn == (flash_attn == "on") and model.kv.v_trans == (flash_attn == "off")
    logits = model.eval(prompt32)
    assert np.abs(logits - tiny_llama.logits(prompt32)).max() < 1e-4
    model.reset()
    steps = np.concatenate([model.eval(prompt32[:3])] + [model.eval([t]) for t in prompt32[3:]])
    assert np.abs(steps - logits).max() < 1e-5
    model.reset()
    prompt = [1, 40, 41, 42, 100, 7]
    got = list(model.generate(prompt, 10, stop_at_eos=False))
    with torch.no_grad():
        out = tiny_llama.hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False,
                                     min_new_tokens=10, pad_token_id=0)
    assert got == out[0, len(prompt):].tolist()
    model.free()


@pytest.mark.parametrize("flash_attn", ["on", "off"])
@pytest.mark.slow
def test_decode_graph_in_todays_idiom(tiny_gguf: object, flash_attn: str) -> None:
    """KV writes by SET_ROWS through I64 index inputs, SwiGLU by GLU, the mask an input ([n_kv, n_tokens], F16
    with flash attention), n_kv padded as llama.cpp pads it (256, at most n_ctx): one decode graph, its
    shapes the same from token to token, serves every token."""
    from pyggml.core.tensor import GGMLOp
    from pyggml.core.types import GGMLType

    model = load(tiny_gguf("F32"), n_ctx=300, flash_attn=flash_attn)
    assert model._n_kv(1) == 256 and model._n_kv(256) == 256 and model._n_kv(257) == 300
    model.eval([1, 40, 41])
    for t in range(60):
        model.eval([50 + t])
    # two graphs built: the prompt's, and one decode graph the scheduler reused for tokens 4..62
    assert model.n_graphs_built == 2 and model.runner.sched.reused
    # tokens, cells, outputs, last only, embeddings, recurrent state cell and cell zeroed (none: 0, -1)
    assert model._last_key == (1, 256, 1, False, False, 0, -1)
    inp = model._graphs[model._last_key][1]
    ops = {n.op for n in model.runner.graph.nodes}
    assert GGMLOp.SET_ROWS in ops and GGMLOp.GLU in ops and GGMLOp.CPY not in ops
    assert (GGMLOp.FLASH_ATTN_EXT in ops) == (flash_attn == "on")
    assert (GGMLOp.SOFT_MAX in ops) == (flash_attn == "off")
    assert inp.k_idxs.type == GGMLType.I64 and inp.v_idxs.type == GGMLType.I64
    assert inp.mask.type == (GGMLType.F16 if flash_attn == "on" else GGMLType.F32)
    assert tuple(inp.mask.ne[:2]) == (256, 1)
    model.free()


def test_flash_attn_option_is_checked(tiny_gguf: object) -> None:
    with pytest.raises(ArgumentError, match="flash_attn"):
        load(tiny_gguf("F32"), flash_attn="yes")


def test_the_memory_check_counts_the_repacked_copies(tiny_gguf: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With repack, the copies the CPU makes of the Q4_0 layer matrices (CPU_REPACK) are host memory the load
    takes besides the mapped file: the check before loading counts exactly them; without repack, none. And
    memory() counts them."""
    import pyggml.models.model as model_module

    path = tiny_gguf("Q4_0")
    asked: dict[bool, list[tuple[int, str]]] = {True: [], False: []}
    models = {}
    for repack in (True, False):
        monkeypatch.setattr(model_module, "check_host_alloc",
                            lambda nbytes, what, r=repack: asked[r].append((nbytes, what)))
        models[repack] = pm.load(path, n_ctx=64, repack=repack)
    try:
        w = models[True].w
        repacked = sum(t.nbytes() for t in w.values()
                       if t.buffer is not None and t.buffer.buft is not None and t.buffer.buft.name() == "CPU_REPACK")
        assert repacked > 0
        (with_repack,), (without,) = asked[True], asked[False]
        assert with_repack[0] - without[0] == repacked
        assert f"copied weights {repacked} bytes" in with_repack[1] and "copied weights" not in without[1]
        # memory() counts the weight buffers, as llama.cpp's load log: the mapped range and the repacked copies
        for m in models.values():
            assert m.memory()["CPU#0"]["weights"] == sum(b.get_size() for b in m.weights.buffers)
        assert {b.buft.name() for b in models[True].weights.buffers} == {"CPU_Mapped", "CPU_REPACK"}
    finally:
        for m in models.values():
            m.free()
