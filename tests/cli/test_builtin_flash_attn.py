"""The built-in model with flash attention on and off: the same greedy tokens, and the ones the graph of
late 2023 (CPY KV writes, SILU * MUL, n_kv padded to 32) gave before the graph moved to today's idiom."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.cli._common import builtin_model_path
from pyggml.models.model import load

PROMPT = "Once upon a time, there was a little"
# greedy tokens of the 2023 graph (pyggml before SET_ROWS / GLU / flash attention), reuse_graphs on and off alike
BEFORE = [1922, 2, 1, 357, 264, 567, 299, 264, 552, 470] * 2


@pytest.mark.parametrize("reuse_graphs", [True, False])
@pytest.mark.slow
def test_builtin_greedy_tokens_flash_attn_on_off(reuse_graphs: bool) -> None:
    got = {}
    last = {}
    for fa in ("on", "off"):
        model = load(builtin_model_path(), n_ctx=512, progress=False, reuse_graphs=reuse_graphs, flash_attn=fa)
        assert model.flash_attn == (fa == "on")
        ids = model.tokenize(PROMPT)
        logits = model.eval(ids)[-1]
        out = []
        for _ in range(len(BEFORE)):
            t = int(np.argmax(logits))
            out.append(t)
            logits = np.asarray(model.eval_last([t])).reshape(-1, logits.size)[-1]
        got[fa], last[fa] = out, logits
        model.free()
    assert got["on"] == got["off"] == BEFORE
    assert np.array_equal(last["on"], last["off"])  # F32 cache: flash attention has the bits of the plain path
