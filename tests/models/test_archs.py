"""Every family of pyggml.models.arch on a tiny random checkpoint: pyggml's f32 logits against transformers' and
llama.cpp's, without downloads.

The checkpoints (pyggml.testing.tiny_archs: transformers' config classes, hidden 64, 2 layers, gemma3 6 and gemma2
4 with a sliding window of 4 tokens so that 12 tokens cross it, smollm3 4 so that one layer goes without RoPE;
qwen3moe and Mixtral 8 experts, 2 a token) are converted to GGUF by the sdist's own converter once
per session. transformers computes in f32; llama.cpp with an f32 KV cache and flash attention off
(DESIGN.md, "Oracles"). The gate is the issue's: a max abs difference at most 1e-3 of the logits' scale
(gemma3's and gemma2's GELU goes through ggml's f16 table in both ggml implementations, which transformers does not
have: ~1e-4 of the scale; everything else agrees to ~1e-6).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

import pyggml.models as pm
from pyggml.core.quants import FROM_FLOAT_TYPES
from pyggml.models.arch import WEIGHT_TYPES
from pyggml.models.metadata import ModelFileError

ARCH_NAMES = ("llama", "qwen2", "qwen3", "gemma3", "phi3", "qwen3moe", "olmo2", "gemma2", "smollm3", "granite",
              "granitemoe", "gpt-oss", "lfm2", "granitehybrid")
# variants of real files: Llama 3's rope_freqs, Phi-3 128k's LongRoPE, Mixtral's experts (the family of each)
VARIANTS = {"llama3": "llama", "phi3_longrope": "phi3", "mixtral": "llama"}
CHECKPOINTS = (*ARCH_NAMES, *VARIANTS)
N_TOKENS = 12
PROMPT_LENGTHS = (1, 7, 33)
TOL = 1e-3  # of the logits' scale (max |logit|)


def _close(ours: np.ndarray, ref: np.ndarray, what: str, tol: float = TOL) -> None:
    scale = float(np.abs(ref).max())
    diff = float(np.abs(ours - ref).max())
    assert diff <= tol * scale, f"{what}: max abs difference {diff:.3g} > {tol:g} x scale {scale:.3g}"


def _same_greedy_tokens(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    """Each position's most likely token is the reference's wherever the reference's top two logits are further
    apart than twice the difference of the two (elsewhere either token is within the rounding)."""
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * np.abs(ours - ref).max(axis=-1)
    assert clear.any(), f"{what}: no position's top two logits are apart enough to compare greedy tokens"
    ours_tok, ref_tok = ours.argmax(-1)[clear], ref.argmax(-1)[clear]
    assert (ours_tok == ref_tok).all(), f"{what}: greedy tokens {ours_tok.tolist()} differ from {ref_tok.tolist()}"


class Tiny:
    """The session's checkpoints, their GGUF files, prompts and transformers' logits."""

    def __init__(self, root: Path) -> None:
        from pyggml.testing import tiny_archs as ta

        self.root = root
        self.ckpt = {a: ta.make_checkpoint(a, root / a) for a in CHECKPOINTS}
        self.path = {a: root / f"{a}.gguf" for a in CHECKPOINTS}
        ta.convert([(self.ckpt[a], self.path[a], "f32") for a in CHECKPOINTS])
        rng = np.random.default_rng(3)
        self.ids = {a: [1] + rng.integers(0, c.model.config.vocab_size, N_TOKENS - 1).tolist()
                    for a, c in self.ckpt.items()}
        self.ref = {a: self.ckpt[a].logits(self.ids[a]) for a in CHECKPOINTS}
        self.prompts = {(a, n): [1] + rng.integers(0, c.model.config.vocab_size, n - 1).tolist()
                        for a, c in self.ckpt.items() for n in PROMPT_LENGTHS}
        self._cpp: dict[str, np.ndarray] | None = None

    def llamacpp(self) -> dict[str, np.ndarray]:
        """llama.cpp's logits of every family, computed once (one process)."""
        if self._cpp is None:
            from pyggml.testing import llamacpp, tiny_archs

            try:
                # and LongRoPE in a context past the original one: the long factors
                jobs = [(self.path[a], self.ids[a], 256) for a in CHECKPOINTS]
                jobs.append((self.path["phi3_longrope"], self.ids["phi3"], 512))
                jobs += [(self.path[a], ids, 256) for (a, _), ids in self.prompts.items()]
                out = tiny_archs.llamacpp_logits(jobs, self.root)
            except llamacpp.NoCompilerError as e:
                pytest.skip(str(e))  # the one reason to skip: no compiler to build llama.cpp with
            names = [*CHECKPOINTS, "phi3_longrope_long", *(f"{a}/{n}" for a, n in self.prompts)]
            self._cpp = dict(zip(names, out, strict=True))
        return self._cpp


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory, llamacpp_models: Path) -> Tiny:
    """Made once a session; needs the sdist (its converter and ggml-vocab files: `llamacpp_models` skips without
    it), torch and transformers."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return Tiny(tmp_path_factory.mktemp("archs"))


# a tensor of each file that shows the family's row of the table is exercised
SHOWN_BY = {"llama": "blk.1.attn_q.weight", "qwen2": "blk.1.attn_q.bias", "qwen3": "blk.1.attn_k_norm.weight",
            "gemma3": "blk.5.post_ffw_norm.weight", "phi3": "blk.1.attn_qkv.weight", "llama3": "rope_freqs.weight",
            "phi3_longrope": "rope_factors_long.weight", "qwen3moe": "blk.1.ffn_gate_exps.weight",
            "mixtral": "blk.1.ffn_down_exps.weight", "olmo2": "blk.1.post_ffw_norm.weight",
            "gemma2": "blk.3.post_attention_norm.weight", "smollm3": "blk.3.attn_q.weight",
            "granite": "blk.1.ffn_up.weight", "gpt-oss": "blk.1.attn_sinks.weight",
            "granitemoe": "blk.1.ffn_down_shexp.weight", "lfm2": "blk.2.shortconv.conv.weight",
            "granitehybrid": "blk.2.ssm_norm.weight"}


@pytest.mark.parametrize("arch", CHECKPOINTS)
def test_f32_logits_match_transformers_and_llamacpp(tiny: Tiny, arch: str) -> None:
    model = pm.load(tiny.path[arch], n_ctx=256, progress=False)
    try:
        assert model.hparams.arch.name == VARIANTS.get(arch, arch) and SHOWN_BY[arch] in model.w
        ours = model.eval(tiny.ids[arch])
    finally:
        model.free()
    _close(ours, tiny.ref[arch], f"{arch} vs transformers")
    _close(ours, tiny.llamacpp()[arch], f"{arch} vs llama.cpp")


@pytest.mark.parametrize("arch", CHECKPOINTS)
def test_prompts_of_1_7_and_33_tokens(tiny: Tiny, arch: str) -> None:
    """Each prompt from an empty cache: logits as transformers' and llama.cpp's, llama.cpp's greedy tokens."""
    model = pm.load(tiny.path[arch], n_ctx=256, progress=False)
    try:
        for n in PROMPT_LENGTHS:
            model.reset()
            ids = tiny.prompts[arch, n]
            ours = model.eval(ids)
            cpp = tiny.llamacpp()[f"{arch}/{n}"]
            _close(ours, tiny.ckpt[arch].logits(ids), f"{arch}, {n} tokens, vs transformers")
            _close(ours, cpp, f"{arch}, {n} tokens, vs llama.cpp")
            _same_greedy_tokens(ours, cpp, f"{arch}, {n} tokens")
    finally:
        model.free()


# each mixture of experts as llama-quantize makes it: experts MXFP4 (gpt-oss) or Q4_K_M's mix (qwen3moe)
QUANTIZED = {"gpt-oss": "MXFP4_MOE", "qwen3moe_wide": "Q4_K_M"}


@pytest.fixture(scope="session")
def quantized(tiny: Tiny) -> dict[str, tuple[Path, Path, dict[int, list[int]]]]:
    """Per family: its f32 file, the file llama-quantize made of it, prompts of PROMPT_LENGTHS tokens."""
    from pyggml.testing import tiny_archs
    from pyggml.testing.random_llama import quantize

    wide = tiny_archs.make_checkpoint("qwen3moe_wide", tiny.root / "qwen3moe_wide")
    tiny_archs.convert([(wide, tiny.root / "qwen3moe_wide.gguf", "f32")])
    rng = np.random.default_rng(5)
    out = {}
    for arch, qtype in QUANTIZED.items():
        f32 = tiny.root / f"{arch}.gguf"
        prompts = {n: [1] + rng.integers(0, 32000, n - 1).tolist() for n in PROMPT_LENGTHS}
        out[arch] = (f32, quantize(f32, tiny.root / f"{arch}-{qtype}.gguf", qtype), prompts)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch", QUANTIZED)
def test_quantized_experts_follow_llamacpp(tiny: Tiny, quantized: dict[str, tuple[Path, Path, dict[int, list[int]]]],
                                           arch: str) -> None:
    """The quantized file's logits as llama.cpp's of it, far closer than llama.cpp's of the f32 file are."""
    from pyggml.core.types import GGMLType
    from pyggml.testing import llamacpp, tiny_archs

    f32, qfile, prompts = quantized[arch]
    try:
        cpp = tiny_archs.llamacpp_logits([(f, ids) for ids in prompts.values() for f in (f32, qfile)], tiny.root)
    except llamacpp.NoCompilerError as e:
        pytest.skip(str(e))
    model = pm.load(qfile, n_ctx=256, progress=False)
    try:
        expert_type = model.file.tensor("blk.1.ffn_gate_exps.weight").type
        assert expert_type == (GGMLType.MXFP4 if arch == "gpt-oss" else GGMLType.Q4_K)
        for i, (n, ids) in enumerate(prompts.items()):
            model.reset()
            ours, cpp_f32, cpp_q = model.eval(ids), cpp[2 * i], cpp[2 * i + 1]
            _close(ours, cpp_q, f"{arch} {QUANTIZED[arch]}, {n} tokens, vs llama.cpp")
            _same_greedy_tokens(ours, cpp_q, f"{arch} {QUANTIZED[arch]}, {n} tokens")
            # the quantization moves llama.cpp's own logits by far more than the gate
            assert np.abs(cpp_f32 - cpp_q).max() > 10 * TOL * np.abs(cpp_q).max()
    finally:
        model.free()


def test_longrope_takes_the_long_factors_past_the_original_context(tiny: Tiny) -> None:
    """A context longer than the original one (as llama.cpp pads it) ropes with the long factors: llama.cpp's
    logits, and no longer transformers' of a short sequence (its short factors)."""
    model = pm.load(tiny.path["phi3_longrope"], n_ctx=512, progress=False)
    try:
        ours = model.eval(tiny.ids["phi3"])
    finally:
        model.free()
    _close(ours, tiny.llamacpp()["phi3_longrope_long"], "phi3 LongRoPE (long factors) vs llama.cpp")
    assert np.abs(ours - tiny.ckpt["phi3_longrope"].logits(tiny.ids["phi3"])).max() > 0.1


@pytest.mark.parametrize("arch", ["qwen2", "gemma3", "phi3", "gemma2", "qwen3moe", "gpt-oss", "lfm2",
                                  "granitehybrid"])
def test_token_by_token_and_flash_attention(tiny: Tiny, arch: str) -> None:
    """Decoding one token at a time (the KV cache, gemma3's window sliding past the first cells, lfm2's and
    granitehybrid's recurrent state kept across steps) and flash attention give the whole prompt's logits."""
    ids, ref = tiny.ids[arch], tiny.ref[arch]
    for fa in ("off", "on"):
        model = pm.load(tiny.path[arch], n_ctx=256, progress=False, flash_attn=fa)
        try:
            steps = [model.eval(ids[:4])] + [model.eval([t]) for t in ids[4:]]
        finally:
            model.free()
        _close(np.concatenate(steps), ref, f"{arch} token by token, flash attention {fa}")


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "phi3", "gpt-oss"])
def test_the_2023_idiom_for_backends_without_set_rows_and_glu(tiny: Tiny, arch: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph pyggml builds for backends without SET_ROWS and GLU (CPY KV writes, the activation and a MUL,
    phi3's halves as views) computes the same logits."""
    import pyggml.models.model as model_module

    monkeypatch.setattr(model_module, "all_support", lambda *args, **kwargs: False)
    model = pm.load(tiny.path[arch], n_ctx=256, progress=False)
    try:
        assert model._graph_kw == {"flash_attn": False, "set_rows": False, "glu": False}
        ours = np.concatenate([model.eval(tiny.ids[arch][:5]), model.eval(tiny.ids[arch][5:])])
    finally:
        model.free()
    _close(ours, tiny.ref[arch], f"{arch} in the 2023 idiom vs transformers")


@pytest.mark.parametrize("arch", ["gemma3", "phi3", "qwen3moe", "gpt-oss"])
def test_split_over_torch_and_cpu_by_the_scheduler(tiny: Tiny, arch: str) -> None:
    """The first layer on the torch backend, the rest on the CPU, token by token: the same logits."""
    model = pm.load(tiny.path[arch], backends=["torch", "cpu"], n_layers_on=[1], n_ctx=256, progress=False)
    try:
        ids = tiny.ids[arch]
        ours = np.concatenate([model.eval(ids[:6])] + [model.eval([t]) for t in ids[6:]])
    finally:
        model.free()
    _close(ours, tiny.ref[arch], f"{arch} over torch and cpu vs transformers")


def test_gemma3_layers_slide_and_keep_their_rope_bases(tiny: Tiny) -> None:
    from pyggml.gguf.reader import read_gguf

    gf = read_gguf(tiny.path["gemma3"])
    try:
        hp = pm.HParams.from_gguf(gf)
    finally:
        gf.close()
    assert hp.swa_layers == (True,) * 5 + (False,) and hp.n_swa == 4
    assert hp.rope_base_scale(0) == (10000.0, 1.0) and hp.rope_base_scale(5) == (1000000.0, 1.0)
    assert hp.head_dim == 32 and hp.n_embd_q == 128 and hp.f_final_logit_softcapping == 30.0


def test_a_weight_type_outside_the_models_is_named(tiny: Tiny, tmp_path: Path) -> None:
    from pyggml.core.types import GGMLType
    from pyggml.gguf.writer import write_gguf
    from pyggml.models.arch import WEIGHT_TYPES

    src = pm.load(tiny.path["llama"], n_ctx=64, progress=False)
    gf = src.file
    meta = {k: gf.get(k) for k in gf.keys() if not k.startswith("GGUF.") and k != "general.architecture"}
    tensors = {t.name: gf.tensor_float(t.name).reshape(tuple(reversed(t.ne))) for t in gf}
    src.free()
    assert GGMLType.F64 not in WEIGHT_TYPES
    write_gguf(tmp_path / "f64.gguf", "llama", meta, tensors, types={"blk.1.ffn_up.weight": GGMLType.F64})
    with pytest.raises(ModelFileError, match=r"'f64.gguf': tensor 'blk.1.ffn_up.weight' has type F64, which "
                                             r"pyggml does not compute in models \(supported: F32, F16, BF16, "):
        pm.load(tmp_path / "f64.gguf", n_ctx=64, progress=False)


def test_fused_gate_up_experts_compute_as_the_separate_ones(tiny: Tiny, tmp_path: Path) -> None:
    """A file with ffn_gate_up_exps (each expert's gate rows, then its up rows) instead of ffn_gate_exps and
    ffn_up_exps: one MUL_MAT_ID split into two views, the same logits."""
    from pyggml.gguf.writer import write_gguf

    src = pm.load(tiny.path["qwen3moe"], n_ctx=64, progress=False)
    try:
        ref = src.eval(tiny.ids["qwen3moe"])
        gf = src.file
        meta = {k: gf.get(k) for k in gf.keys() if not k.startswith("GGUF.") and k != "general.architecture"}
        tensors = {t.name: gf.tensor_float(t.name).reshape(tuple(reversed(t.ne))) for t in gf}
    finally:
        src.free()
    for il in range(2):
        b = f"blk.{il}."
        gate, up = tensors.pop(b + "ffn_gate_exps.weight"), tensors.pop(b + "ffn_up_exps.weight")
        tensors[b + "ffn_gate_up_exps.weight"] = np.concatenate([gate, up], axis=1)  # [n_expert, 2 n_ff, n_embd]
    write_gguf(tmp_path / "fused.gguf", "qwen3moe", meta, tensors)
    model = pm.load(tmp_path / "fused.gguf", n_ctx=64, progress=False)
    try:
        assert "blk.1.ffn_gate_up_exps.weight" in model.w and "blk.1.ffn_up_exps.weight" not in model.w
        ours = model.eval(tiny.ids["qwen3moe"])
    finally:
        model.free()
    _close(ours, ref, "qwen3moe with fused gate_up experts vs separate", tol=1e-5)


# --- weight types: one tiny LLaMA per type, every 2-D weight (token_embd's GET_ROWS too) in it ---

# the weight types pyggml writes (the lattice IQ types only llama-quantize writes: tests/interop/test_random_llama.py)
# and the gguf package stores (it has no Q2_0)
WRITTEN_WEIGHT_TYPES = [t for t in WEIGHT_TYPES if t in FROM_FLOAT_TYPES and int(t) in set(GGMLQuantizationType)]
TYPE_DIMS = dict(vocab_size=300, hidden_size=256, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5)  # 256: K-quant blocks


@pytest.fixture(scope="session")
def typed_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A file per type of WRITTEN_WEIGHT_TYPES, the same random weights (HF names) quantized by pyggml's
    quantizers."""
    from pyggml.models.convert import HF_TO_GGUF, write_llama_gguf

    rng = np.random.default_rng(11)
    e, f, v = TYPE_DIMS["hidden_size"], TYPE_DIMS["intermediate_size"], TYPE_DIMS["vocab_size"]
    kv = e // TYPE_DIMS["num_attention_heads"] * TYPE_DIMS["num_key_value_heads"]
    shapes = {"embed_tokens": (v, e), "norm": (e,), "lm_head": (v, e), "input_layernorm": (e,), "q_proj": (e, e),
              "k_proj": (kv, e), "v_proj": (kv, e), "o_proj": (e, e), "post_attention_layernorm": (e,),
              "gate_proj": (f, e), "up_proj": (f, e), "down_proj": (e, f)}
    state = {}
    for hf in HF_TO_GGUF:
        name = hf.format(i=0)
        shape = next(s for k, s in shapes.items() if f".{k}." in f".{name}")
        state[name] = (1 + 0.1 * rng.standard_normal(shape) if len(shape) == 1
                       else rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    root = tmp_path_factory.mktemp("types")
    out = {}
    for t in WRITTEN_WEIGHT_TYPES:
        out[t.name] = root / f"tiny-{t.name}.gguf"
        write_llama_gguf(out[t.name], TYPE_DIMS, state, type=t)
    return out


@pytest.fixture(scope="session")
def typed_llamacpp(typed_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    from pyggml.testing import llamacpp, tiny_archs

    try:
        out = tiny_archs.llamacpp_logits([(p, TYPE_IDS) for p in typed_files.values()], tmp_path_factory.mktemp("t"))
    except llamacpp.NoCompilerError as e:
        pytest.skip(str(e))
    return dict(zip(typed_files, out, strict=True))


# not 250 last: with it llama.cpp's Q8_0 logits of that one position differ by 0.9% of the scale from pyggml's
# (and from ggml's reference arithmetic that pyggml follows); the positions after it agree, so its K and V do:
# a discrete flip in that position's FFN or head, the kind a rounding tie in ggml's SIMD conversion of activations
# to q8_0 makes (see pyggml.backends.cpu.kernels.matmul). Every other type agrees to ~1e-6 there too.
TYPE_IDS = [1, 40, 7, 299, 120, 3, 88, 251]


@pytest.mark.parametrize("type_name", [t.name for t in WRITTEN_WEIGHT_TYPES])
def test_every_weight_type_loads_and_computes_as_llamacpp(typed_files: dict[str, Path],
                                                          typed_llamacpp: dict[str, np.ndarray],
                                                          type_name: str) -> None:
    model = pm.load(typed_files[type_name], n_ctx=64, progress=False)
    try:
        assert {model.file.tensor(n).type.name for n in model.w if n.endswith("_embd.weight")} == {type_name}
        ours = model.eval(TYPE_IDS)
    finally:
        model.free()
    _close(ours, typed_llamacpp[type_name], f"{type_name} weights vs llama.cpp")


# (the real Gemma 3 270M file against llama.cpp: tests/interop/test_real_models.py)


# --- hyper-parameters from metadata alone ---


def _hparams(tmp_path: Path, arch: str, meta: dict[str, object]) -> pm.HParams:
    from pyggml.testing.tiny_archs import hparams_of

    return hparams_of(tmp_path / "h.gguf", arch, meta)


@pytest.mark.parametrize(("meta", "sliding"), [
    ({"attention.sliding_window": 4}, (True,) * 5 + (False,)),  # gemma3's default: 5 local, 1 global
    ({"attention.sliding_window": 4, "attention.sliding_window_pattern": 3}, (True, True, False) * 2),
    ({"attention.sliding_window": 4, "attention.sliding_window_pattern": [True, False] * 3}, (True, False) * 3),
    ({}, ()),  # no window in the file: every layer global
])
def test_gemma3_sliding_layers_from_the_file(tmp_path: Path, meta: dict[str, object],
                                            sliding: tuple[bool, ...]) -> None:
    hp = _hparams(tmp_path, "gemma3", {"rope.freq_base": 1e6, "rope.freq_base_swa": 5e3, **meta})
    assert hp.swa_layers == sliding and hp.any_swa == bool(sliding)
    assert [hp.rope_base_scale(il)[0] for il in range(6)] == [5e3 if s else 1e6 for s in sliding or (False,) * 6]


def test_gemma2_defaults_as_llamacpp(tmp_path: Path) -> None:
    """Without the keys: a window of 4096 on every other layer, the sliding layers' rope the global one, the
    attention logits capped at 50 and the output at 30 (llama.cpp's llama_hparams defaults)."""
    hp = _hparams(tmp_path, "gemma2", {"rope.freq_base": 2e4, "rope.scaling.factor": 2.0})
    assert hp.n_swa == 4096 and hp.swa_layers == (True, False) * 3
    assert hp.rope_base_scale(0) == hp.rope_base_scale(1) == (2e4, 0.5)
    assert hp.f_attn_logit_softcapping == 50.0 and hp.f_final_logit_softcapping == 30.0


def test_smollm3_and_granite_layers_without_rope(tmp_path: Path) -> None:
    assert [_hparams(tmp_path, "smollm3", {}).has_rope(il) for il in range(6)] == [True] * 3 + [False] + [True] * 2
    granite = {"logit_scale": 8.0, "rope.scaling.finetuned": False}
    assert not any(_hparams(tmp_path, "granite", granite).has_rope(il) for il in range(6))
    assert all(_hparams(tmp_path, "granite", {"logit_scale": 8.0}).has_rope(il) for il in range(6))


def test_phi3_ignores_a_sliding_window_as_llamacpp(tmp_path: Path) -> None:
    assert not _hparams(tmp_path, "phi3", {"attention.sliding_window": 2047}).any_swa


@pytest.mark.parametrize(("meta", "message"), [
    ({"attention.key_length": 32, "attention.value_length": 16},
     r"'qwen3.attention.value_length' = 16 differs from the key length 32"),
    ({"rope.scaling.type": "su"}, r"'qwen3.rope.scaling.type' = 'su' is not supported \(supported: none, linear, "),
])
def test_hparams_pyggml_lacks_are_named(tmp_path: Path, meta: dict[str, object], message: str) -> None:
    with pytest.raises(ModelFileError, match=message):
        _hparams(tmp_path, "qwen3", meta)


@pytest.mark.parametrize(("arch", "meta", "message"), [
    ("qwen3moe", {}, r"'qwen3moe.expert_count' is missing; qwen3moe needs experts"),
    ("qwen3moe", {"expert_count": 8, "expert_used_count": 9},
     r"'qwen3moe.expert_used_count' = 9 must be in 1..'qwen3moe.expert_count' = 8"),
    ("qwen3moe", {"expert_count": 8}, r"'qwen3moe.expert_used_count' = 0 must be in 1..'qwen3moe.expert_count' = 8"),
    ("llama", {"expert_used_count": 2}, r"'llama.expert_used_count' = 2 without experts"),
    ("llama", {"expert_count": 8, "expert_used_count": 2, "expert_group_count": 4},
     r"'llama.expert_group_count' = 4: pyggml does not select experts by groups"),
])
def test_expert_counts_llamacpp_refuses_are_named(tmp_path: Path, arch: str, meta: dict[str, object],
                                                  message: str) -> None:
    with pytest.raises(ModelFileError, match=message):
        _hparams(tmp_path, arch, meta)


def test_expert_widths(tmp_path: Path) -> None:
    """An expert's width: the file's key, else qwen3moe's FFN width shared among the experts used, llama's n_ff."""
    moe = {"expert_count": 8, "expert_used_count": 2}
    assert _hparams(tmp_path, "qwen3moe", {**moe, "expert_feed_forward_length": 48}).n_ff_exp == 48
    assert _hparams(tmp_path, "qwen3moe", moe).n_ff_exp == 64
    assert _hparams(tmp_path, "llama", moe).n_ff_exp == 128
