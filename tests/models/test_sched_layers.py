"""A model split over several CPU backends by the scheduler's five passes: each layer's nodes go with its
weights (each CPU backend instance has its own buffer type, so two CPU backends stay two), the graph is cut
where the layers change backend, plus where the output head's weight lives.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pyggml.models as pm
from pyggml.backends.cpu import cpu_init
from pyggml.gguf.reader import read_gguf
from pyggml.models.builtin import builtin_model_path
from pyggml.models.convert import write_llama_gguf
from pyggml.models.llama import LlamaHParams
from pyggml.sched.backend_sched import BackendSched

CONFIG = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0)
PROMPT = [1, 17, 42, 99, 7, 250]


@pytest.fixture(scope="module")
def untied_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-layer model with random weights and its own output head (lm_head), as numpy in HF names."""
    rng = np.random.default_rng(11)
    e, f, v = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["vocab_size"]
    kv = e // CONFIG["num_attention_heads"] * CONFIG["num_key_value_heads"]

    def w(*shape: int) -> np.ndarray:
        return (0.2 * rng.standard_normal(shape)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.2 * rng.standard_normal(e)).astype(np.float32)

    state = {"model.embed_tokens.weight": w(v, e), "model.norm.weight": norm(), "lm_head.weight": w(v, e)}
    for i in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{i}."
        state.update({p + "input_layernorm.weight": norm(), p + "self_attn.q_proj.weight": w(e, e),
                      p + "self_attn.k_proj.weight": w(kv, e), p + "self_attn.v_proj.weight": w(kv, e),
                      p + "self_attn.o_proj.weight": w(e, e), p + "post_attention_layernorm.weight": norm(),
                      p + "mlp.gate_proj.weight": w(f, e), p + "mlp.up_proj.weight": w(f, e),
                      p + "mlp.down_proj.weight": w(e, f)})
    path = tmp_path_factory.mktemp("sched_layers") / "untied.gguf"
    write_llama_gguf(path, CONFIG, state)
    return path


def split_over_two(path: Path) -> tuple[pm.Model, pm.Model]:
    """The model on one CPU backend, and over two CPU backends with layers 0-1 on the first, 2-3 on the second."""
    one = pm.load(path, n_ctx=32, progress=False)
    two = pm.load(path, backends=[cpu_init(1), cpu_init(1)], n_layers_on=[2], n_ctx=32, progress=False)
    assert isinstance(two.runner.sched, BackendSched) and two.runner.sched.n_backends == 2
    return one, two


def check_layers_on_their_backends(model: pm.Model) -> None:
    """Every split computes nodes of one backend, and each layer's nodes are in splits of its backend."""
    sched = model.runner.sched
    graph_nodes = sched.graph.nodes  # the graph the scheduler allocated: each split's input copies, then its nodes
    assert graph_nodes
    for split in sched.splits:
        for node in split.graph.nodes:
            assert sched.tensor_backend(node) is split.backend, node.name
            name = node.name.split(" ")[0]
            il = int(name.rsplit("-", 1)[1]) if name.rsplit("-", 1)[-1].isdigit() else None
            if il is not None and name.split("-")[0] in ("Qcur", "Kcur", "kq", "kq_soft_max", "kqv", "ffn_out"):
                assert split.backend is model.layer_backend[il], node.name


def test_untied_model_over_two_backends_makes_two_splits(untied_gguf: Path) -> None:
    one, two = split_over_two(untied_gguf)
    np.testing.assert_allclose(two.eval(PROMPT), one.eval(PROMPT), rtol=1e-4, atol=1e-4)
    sched = two.runner.sched
    a, b = two.backends
    # one backend change (layer 1 -> layer 2); the output norm and head weights are on the last layer's backend
    assert sched.n_splits == 2
    assert [s.backend for s in sched.splits] == [a, b]
    # the graph inputs live on the last backend (ggml's pass 1: "1.inp") and are copied to the first; layer 2
    # needs only the residual stream from the first backend (its norm is pinned to its backend, as llama.cpp's
    # graph callback pins "norm")
    assert sorted(t.name for t in sched.splits[0].inputs) == ["KQ_mask", "inp_k_idxs", "inp_pos", "inp_tokens",
                                                              "inp_v_idxs"]
    assert [t.name for t in sched.splits[1].inputs] == ["l_out-1"]
    check_layers_on_their_backends(two)
    # generation (one-token graphs through the scheduler) keeps the plan and the tokens
    one.reset()
    two.reset()
    assert list(two.generate([1, 5, 9], 6, stop_at_eos=False)) == list(one.generate([1, 5, 9], 6, stop_at_eos=False))
    assert sched.n_splits == 2


def test_builtin_model_tied_head_adds_one_split() -> None:
    """The built-in model ties its head to token_embd (on the first backend): one more split at the end."""
    one, two = split_over_two(builtin_model_path())
    np.testing.assert_allclose(two.eval(PROMPT), one.eval(PROMPT), rtol=1e-4, atol=1e-4)
    sched = two.runner.sched
    a, b = two.backends
    assert sched.n_splits == 3
    assert [s.backend for s in sched.splits] == [a, b, a]
    assert [t.name for t in sched.splits[2].inputs] == ["result_norm"]
    assert [n.name for n in sched.splits[2].graph.nodes] == ["result_output"]
    check_layers_on_their_backends(two)


def _splits(n_layer: int, n_backends: int) -> list[list[int]]:
    """Every n_layers_on list for n_backends backends: layers on each but the last (the rest go there)."""
    if n_backends == 1:
        return [[]]
    return [[k, *rest] for k in range(n_layer + 1) for rest in _splits(n_layer - k, n_backends - 1)
            if rest or n_backends == 2]


@pytest.mark.parametrize("n_backends", [2, 3, 4])
@pytest.mark.slow
def test_every_layer_split_of_the_builtin_model_gives_one_backends_tokens(n_backends: int,
                                                                          builtin_greedy_tokens: list[int]) -> None:
    """One to four CPU backends, every way of giving them the built-in model's layers: the greedy tokens of
    one backend. (Three backends once failed now and then: the loader's weight buffers, registered inside
    the mapped file, hid the file's other bytes from the host-memory lookup.)"""
    path = builtin_model_path()
    want = builtin_greedy_tokens[:6]  # (greedy: the first 6 of one backend's 8)
    n_layer = LlamaHParams.from_gguf(read_gguf(path)).n_layer
    for split in _splits(n_layer, n_backends):
        model = pm.load(path, backends=[cpu_init(1) for _ in range(n_backends)], n_layers_on=split, n_ctx=64,
                        progress=False)
        try:
            got = list(model.generate(model.tokenize("The module"), 6, stop_at_eos=False))
        finally:
            model.free()
        assert got == want, f"n_layers_on={split} over {n_backends} backends"
