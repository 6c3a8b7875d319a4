"""The real files people download, against real llama.cpp: SmolLM2-135M-Instruct (llama, Q4_1) and Gemma 3
270M (gemma3, Q4_K_M). pyggml's logits of every prompt position follow llama.cpp's (f32 KV cache, flash
attention off: the reference of DESIGN.md's "Oracles"); SmolLM2 answers a chat question, Gemma 3 (a pretrained
model) continues text as llama.cpp does.

The logits are not bit-equal: llama.cpp rounds activations to Q8_K/Q8_0/Q8_1 per block in SIMD order and
sums in another order, which the quantized weights amplify; a cosine of 0.99 per position is the bar.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from pyggml.backends.cpu.numerics import host_x86_level, resolve_numerics, resolve_x86_level
from pyggml.models import load
from pyggml.models.attn_rot import ATTN_ROT_DISABLE_ENV
from pyggml.testing.tiny_archs import llamacpp_logits

PROMPTS = ("The capital of France is Paris, and the capital of Germany is",
           "def fibonacci(n):\n    if n < 2:\n        return n\n",
           "東京は日本の首都です。 Numbers: 1234, 56.7 and emoji 😀.")
# a question in each file's own turn format
TURNS = {"llama": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
         "gemma3": "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"}


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def real_model(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{request.param}_path")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_logits_of_every_position_follow_llamacpp(real_model: Path, tmp_path: Path) -> None:
    model = load(real_model, n_ctx=256, n_threads=2, progress=False)
    try:
        arch = model.hparams.arch.name
        prompts = (*PROMPTS, TURNS[arch])
        if arch == "gemma3":  # its sliding layers, 262144-token head, head size 256
            assert model.hparams.any_swa and model.tokenize(TURNS[arch])[:2] == [2, 105]  # <bos> <start_of_turn>
        id_lists = [model.tokenize(p) for p in prompts]
        ours = []
        for ids in id_lists:
            model.reset()
            ours.append(model.eval(ids))
    finally:
        model.free()
    theirs = llamacpp_logits([(real_model, ids) for ids in id_lists], tmp_path)
    for prompt, ids, a, b in zip(prompts, id_lists, ours, theirs, strict=True):
        assert a.shape == b.shape == (len(ids), a.shape[1]), (a.shape, b.shape)
        cos = _cosines(a, b)
        assert cos.min() >= 0.99, f"{real_model.name}, {prompt!r}: cosine per position {np.round(cos, 4)}"
        # the prediction where the model is sure (a clear top token) is llama.cpp's
        top = np.sort(b, axis=1)[:, -2:]
        sure = (top[:, 1] - top[:, 0]) > 1.0
        assert (a.argmax(axis=1)[sure] == b.argmax(axis=1)[sure]).all(), f"{real_model.name}, {prompt!r}"


def test_smollm2_answers_a_chat_question(smollm2_path: Path) -> None:
    model = load(smollm2_path, n_ctx=512, n_threads=2, progress=False)
    try:
        reply = model.chat([{"role": "user", "content": "What is the capital of France? Answer in one word."}],
                           max_tokens=24, temperature=0, repeat_penalty=1.0)
    finally:
        model.free()
    assert isinstance(reply, str) and "Paris" in reply, reply


# The Gemma 3 270M file on the package index is the pretrained model (no chat template, no instruction
# tuning): asked a question in Gemma's turn format, llama.cpp's greedy answer repeats the question. What it
# does well is continue text, as `pyggml run` asks it to.
RUN_PROMPTS = ("The capital of France is", "Once upon a time, there was a little")
RUN_TOKENS = 16


def follows_host_ggml() -> bool:
    """Whether pyggml's CPU defaults are ggml-cpu's arithmetic as built for this host: numerics "x86" at the
    host's x86 level (what llama.cpp's tools here were compiled for)."""
    return resolve_numerics() == "x86" and resolve_x86_level() == host_x86_level()


def _parted_at_a_tie(model: object, path: Path, ids: list[int], ours: list[int], theirs: str, tmp: Path) -> str:
    """Why pyggml's greedy tokens may part from llama.cpp's text: the first token where pyggml's differs from
    llama.cpp's argmax (its logits over the prompt and pyggml's tokens) must be one llama.cpp's top two are
    closer than twice pyggml's deviation from llama.cpp's logits at those two tokens, pyggml's logits as its
    generation computed them (the prompt in one batch, then token by token); '' if that holds."""
    rows = llamacpp_logits([(path, ids + ours)], tmp)[0]
    model.reset()
    mine = np.concatenate([model.eval(ids), *(model.eval([t]) for t in ours)])
    for i, token in enumerate(ours):
        row, my_row = rows[len(ids) - 1 + i], mine[len(ids) - 1 + i]
        best = int(row.argmax())
        if token == best:
            continue
        gap = float(row[best] - row[token])
        dev = float(max(abs(my_row[best] - row[best]), abs(my_row[token] - row[token])))
        prefix = model.detokenize(ours[:i]).strip()
        if gap > 2 * dev or not theirs.strip().startswith(prefix):
            return f"token {i} ({token} for {best}): llama.cpp's gap {gap:.3f}, pyggml's deviation {dev:.3f}"
        return ""
    return "the tokens agree but the text does not"


def test_gemma3_run_continues_text_as_llamacpp(gemma3_path: Path, llamacpp_tools: dict[str, Path],
                                               tmp_path: Path) -> None:
    model = load(gemma3_path, n_ctx=256, n_threads=2, progress=False)
    try:
        for prompt in RUN_PROMPTS:
            r = subprocess.run([str(llamacpp_tools["llama-completion"]), "-m", str(gemma3_path), "-p", prompt,
                                "-n", str(RUN_TOKENS), "--temp", "0", "-no-cnv", "--no-warmup", "-t", "2",
                                "-c", "256", "-ctk", "f32", "-ctv", "f32", "-fa", "off", "--no-display-prompt"],
                               capture_output=True, timeout=300)
            assert r.returncode == 0, r.stderr[-2000:]
            theirs = r.stdout.decode("utf-8").strip("\n")
            ids = model.tokenize(prompt)
            tokens = list(model.generate(ids, RUN_TOKENS, stop_at_eos=False))
            ours = model.detokenize(tokens)
            assert ours.strip()
            if ours.strip() != theirs.strip():
                # pyggml's defaults at the host's x86 level compute llama-completion's bits (its greedy text);
                # other numerics may part from it only at a near tie
                assert not follows_host_ggml(), f"after {prompt!r}: {ours!r} != llama-completion's {theirs!r}"
                why = _parted_at_a_tie(model, gemma3_path, ids, tokens, theirs, tmp_path)
                assert not why, f"after {prompt!r}: {ours!r} != {theirs!r}: {why}"
            model.reset()
    finally:
        model.free()


@pytest.mark.parametrize("cache_type", ["q8_0", "q4_0"])
def test_smollm2_quantized_cache_follows_llamacpp_as_closely_as_its_f16_cache(
        cache_type: str, smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """-ctk T -ctv T -fa on over every prompt, T q8_0 or q4_0: pyggml's logits are as close to llama.cpp's (same
    flags, llama.cpp's defaults otherwise) as llama.cpp's T cache is to its f16 cache, by NMSE. Both rotate K and
    V by Hadamard matrices (llama-kv-cache.cpp's attn_rot_k/attn_rot_v; SmolLM2's heads are 64 wide)."""
    monkeypatch.delenv(ATTN_ROT_DISABLE_ENV, raising=False)  # llama.cpp's default run, and pyggml's
    model = load(smollm2_path, n_ctx=256, n_threads=2, progress=False, kv_type=cache_type, kv_type_v=cache_type,
                 flash_attn="on")
    try:
        assert (model.kv.k[0].type.name, model.kv.v[0].type.name) == (cache_type.upper(),) * 2
        assert (model.kv.n_rot_k, model.kv.n_rot_v) == (64, 64)
        id_lists = [model.tokenize(p) for p in (*PROMPTS, TURNS["llama"])]
        ours = []
        for ids in id_lists:
            model.reset()
            ours.append(model.eval(ids))
    finally:
        model.free()
    jobs = [(smollm2_path, ids) for ids in id_lists]
    quantized = np.concatenate(llamacpp_logits(jobs, tmp_path, type_k=cache_type, type_v=cache_type, flash_attn=True))
    f16 = np.concatenate(llamacpp_logits(jobs, tmp_path, type_k="f16", type_v="f16", flash_attn=True))

    def nmse(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.mean((a - b) ** 2) / np.mean(b**2))

    ours_to_theirs, theirs_to_f16 = nmse(np.concatenate(ours), quantized), nmse(quantized, f16)
    assert theirs_to_f16 > 0  # llama.cpp's quantized cache is not its f16 cache
    assert ours_to_theirs <= theirs_to_f16, (ours_to_theirs, theirs_to_f16)
