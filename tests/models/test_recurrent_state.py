"""The recurrent state beside the KV cache (pyggml.models.recurrent_state) under the sequence API, on tiny lfm2 and
granitehybrid checkpoints: what a sequence's logits are when it is alone is what they are when it shares batches,
is copied, or is removed and evaluated again; what llama.cpp's recurrent memory refuses raises a typed error and
changes nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pyggml.models as pm
from pyggml.core.errors import ArgumentError
from pyggml.models.metadata import ModelFileError
from pyggml.models.recurrent_state import RecurrentStateError
from pyggml.testing.tiny_archs import hparams_of

HYBRIDS = ("lfm2", "granitehybrid")
TOL = 1e-5  # of the logits' scale: the same arithmetic in other batches


@pytest.fixture(scope="session")
def hybrid_files(tmp_path_factory: pytest.TempPathFactory, llamacpp_models: Path) -> dict[str, Path]:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from pyggml.testing import tiny_archs

    root = tmp_path_factory.mktemp("hybrid")
    ckpts = {a: tiny_archs.make_checkpoint(a, root / a) for a in HYBRIDS}
    tiny_archs.convert([(ckpts[a], root / f"{a}.gguf", "f32") for a in HYBRIDS])
    return {a: root / f"{a}.gguf" for a in HYBRIDS}


def _close(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    scale = float(np.abs(ref).max())
    diff = float(np.abs(ours - ref).max())
    assert diff <= TOL * scale, f"{what}: max abs difference {diff:.3g} > {TOL:g} x scale {scale:.3g}"


PROMPT = [1, 812, 90, 4411, 23, 7, 1999, 305]
TAIL_A = [66, 3001, 12]
TAIL_B = [5, 17000, 240]


def _alone(path: Path, ids: list[int]) -> np.ndarray:
    model = pm.load(path, n_ctx=64, progress=False)
    try:
        return model.eval(ids)
    finally:
        model.free()


@pytest.mark.parametrize("arch", HYBRIDS)
def test_sequences_in_one_batch_and_a_copied_state(hybrid_files: dict[str, Path], arch: str) -> None:
    """Two sequences decoded in the same batches, then a third copied from the first and continued: each
    sequence's logits are those of its tokens evaluated alone."""
    path = hybrid_files[arch]
    ref_a, ref_b = _alone(path, PROMPT + TAIL_A), _alone(path, PROMPT[::-1] + TAIL_B)
    model = pm.load(path, n_ctx=64, progress=False, n_seq_max=3)
    try:
        n = len(PROMPT)
        tokens = np.array(PROMPT + PROMPT[::-1])
        seqs = np.repeat([0, 1], n)
        out = model.decode(tokens, seqs, outputs=np.ones(2 * n, dtype=bool))
        _close(out[:n], ref_a[:n], f"{arch} sequence 0 beside 1")
        _close(out[n:], ref_b[:n], f"{arch} sequence 1 beside 0")
        model.seq_cp(0, 2)
        ref_c = _alone(path, PROMPT + TAIL_B)
        for i in range(len(TAIL_A)):
            step = model.decode([TAIL_A[i], TAIL_B[i], TAIL_B[i]], [0, 1, 2], outputs=[True, True, True])
            _close(step[0], ref_a[n + i], f"{arch} sequence 0, step {i}")
            _close(step[1], ref_b[n + i], f"{arch} sequence 1, step {i}")
            _close(step[2], ref_c[n + i], f"{arch} sequence 2 (copied from 0), step {i}")
    finally:
        model.free()


@pytest.mark.parametrize("arch", HYBRIDS)
def test_removals_llamacpp_refuses_raise_and_change_nothing(hybrid_files: dict[str, Path], arch: str) -> None:
    path = hybrid_files[arch]
    ref = _alone(path, PROMPT + TAIL_A)
    model = pm.load(path, n_ctx=64, progress=False)
    try:
        model.eval(PROMPT)
        with pytest.raises(RecurrentStateError, match=r"sequence 0 cannot lose positions \[3, end\): its state "
                                                      r"holds positions 0\.\.7 as one"):
            model.truncate(3)
        with pytest.raises(RecurrentStateError, match=r"cannot lose positions \[2, 8\)"):
            model.seq_rm(0, 2, 8)
        assert model.n_past == len(PROMPT)
        model.seq_rm(0, len(PROMPT))  # past the last position: nothing to remove
        _close(model.eval(TAIL_A), ref[len(PROMPT):], f"{arch} after the refused removals")
        model.truncate(0)  # the whole sequence
        assert model.n_past == 0
        _close(model.eval(PROMPT + TAIL_A), ref, f"{arch} from an emptied sequence (its state zeroed again)")
        model.reset()
        _close(model.eval(PROMPT), ref[:len(PROMPT)], f"{arch} after reset")
    finally:
        model.free()


def test_a_batch_must_continue_its_state_and_fit_n_seq_max(hybrid_files: dict[str, Path]) -> None:
    model = pm.load(hybrid_files["lfm2"], n_ctx=64, progress=False, n_seq_max=2)
    try:
        model.decode(PROMPT, 0)
        with pytest.raises(RecurrentStateError, match=r"sequence 0's tokens must continue at position 8 one after "
                                                      r"another \(its state holds 0\.\.7\); the batch has positions "
                                                      r"\[10, 11\]"):
            model.decode([5, 6], 0, positions=[10, 11])
        with pytest.raises(ArgumentError, match=r"sequence id 2 is not in \[0, n_seq_max=2\)"):
            model.decode([5], 2)
        assert model.seq_pos_max(0) == len(PROMPT) - 1 and model.seq_pos_max(1) == -1
    finally:
        model.free()


def test_the_state_is_counted_in_memory(hybrid_files: dict[str, Path]) -> None:
    """r (2 conv layers x 2 columns x 64 channels) of each of 4 sequences, F32, beside the KV cache."""
    one = pm.load(hybrid_files["lfm2"], n_ctx=64, progress=False)
    four = pm.load(hybrid_files["lfm2"], n_ctx=64, progress=False, n_seq_max=4)
    try:
        assert one.rs is not None and four.rs is not None
        assert sorted(one.rs.r) == [0, 2] and not one.rs.s
        assert sorted(one.kv.k) == sorted(one.kv.v) == [1]  # K and V for the attention layer only, as llama.cpp
        grown = four.memory()["CPU#0"]["kv_cache"] - one.memory()["CPU#0"]["kv_cache"]
        assert 3 * 2 * 2 * 64 * 4 <= grown < 3 * 2 * 2 * 64 * 4 + 2 * 4096  # the rows, and the buffer's alignment
    finally:
        one.free()
        four.free()


def _hparams(tmp_path: Path, arch: str, meta: dict[str, object]) -> pm.HParams:
    return hparams_of(tmp_path / "h.gguf", arch, meta, block_count=3)


MAMBA2 = {"ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16, "ssm.time_step_rank": 8,
          "ssm.group_count": 2}


def test_recurrent_layers_and_state_sizes_from_the_file(tmp_path: Path) -> None:
    lfm2 = _hparams(tmp_path, "lfm2", {"attention.head_count_kv": [0, 2, 0], "shortconv.l_cache": 3})
    assert lfm2.recurrent_layers == (True, False, True) and lfm2.n_head_kv == 2
    assert (lfm2.n_embd_r, lfm2.n_embd_s) == (2 * 64, 0)
    granite = _hparams(tmp_path, "granitehybrid", {"attention.head_count_kv": [0, 0, 4], **MAMBA2})
    assert granite.recurrent_layers == (True, True, False) and granite.f_logit_scale == 0.0
    assert (granite.n_embd_r, granite.n_embd_s) == (3 * (128 + 2 * 2 * 16), 16 * 128)
    assert _hparams(tmp_path, "llama", {"attention.head_count_kv": [2, 2, 2]}).recurrent_layers == ()


@pytest.mark.parametrize(("arch", "meta", "message"), [
    ("llama", {"attention.head_count_kv": [0, 2, 2]},
     r"'llama.attention.head_count_kv' = \[0, 2, 2\] has layers of 0 KV heads; llama has no recurrent layers"),
    ("lfm2", {"attention.head_count_kv": [0, 2, 4], "shortconv.l_cache": 3},
     r"'lfm2.attention.head_count_kv' = \[0, 2, 4\]: pyggml's attention layers need one KV head count"),
    ("lfm2", {"attention.head_count_kv": [0, 2], "shortconv.l_cache": 3},
     r"'lfm2.attention.head_count_kv' has 2 entries, block_count is 3"),
    ("lfm2", {"attention.head_count_kv": [0, 2, 0]}, r"metadata key 'lfm2.shortconv.l_cache' is missing"),
    ("lfm2", {"attention.head_count_kv": [0, 2, 0], "shortconv.l_cache": 3, "attention.sliding_window": 512},
     r"'lfm2.attention.sliding_window' or 'lfm2.attention.causal' = false: pyggml's lfm2 has causal global "
     r"attention only"),
    ("lfm2", {"attention.head_count_kv": [0, 2, 0], "shortconv.l_cache": 3, "attention.causal": False},
     r"pyggml's lfm2 has causal global attention only"),
    ("granitehybrid", {"attention.head_count_kv": [0, 2, 0], **MAMBA2, "ssm.time_step_rank": 6},
     r"'granitehybrid.ssm.inner_size' = 128 is not a multiple of 'granitehybrid.ssm.time_step_rank' = 6"),
    ("granitehybrid", {"attention.head_count_kv": [0, 2, 0], **MAMBA2, "ssm.time_step_rank": 4,
                       "ssm.group_count": 8},
     r"'granitehybrid.ssm.time_step_rank' = 4 heads are not a multiple of 'granitehybrid.ssm.group_count' = 8"),
])
def test_recurrent_hparams_pyggml_cannot_run_are_named(tmp_path: Path, arch: str, meta: dict[str, object],
                                                       message: str) -> None:
    with pytest.raises(ModelFileError, match=message):
        _hparams(tmp_path, arch, meta)


def test_served_slots_keep_a_state_each_and_reuse_none_of_a_cut_one(hybrid_files: dict[str, Path]) -> None:
    """pyggml serve's engine over lfm2 with 2 slots (n_seq_max 2): two requests at once, then one sharing a
    prompt's prefix (a state cannot be cut there: the slot starts again, as llama-server clears it), each the
    text of the same request alone."""
    import queue

    from pyggml.serve.engine import Engine, GenRequest

    def run(engine: Engine, prompts: list[list[int]]) -> list[str]:
        sinks = [queue.SimpleQueue() for _ in prompts]
        for ids, q in zip(prompts, sinks, strict=True):
            engine.submit(GenRequest(prompt=ids, max_tokens=5, sink=q.put, eog_ids=frozenset()))
        texts = []
        for q in sinks:
            text = ""
            while (ev := q.get(timeout=60)).kind == "text":
                text += ev.text
            assert ev.kind == "done" and ev.finish_reason == "length", ev
            texts.append(text)
        return texts

    a, b = PROMPT + TAIL_A, PROMPT[:3] + TAIL_B
    model = pm.load(hybrid_files["lfm2"], n_ctx=64, progress=False, n_seq_max=2)
    try:
        engine = Engine(model, n_slots=2).start()
        try:
            alone = [run(engine, [ids])[0] for ids in (a, b, PROMPT)]
            together = run(engine, [a, b])
            again = run(engine, [PROMPT])  # a prefix of a slot's cached tokens
        finally:
            engine.stop()
    finally:
        model.free()
    assert together == alone[:2] and again == alone[2:]
