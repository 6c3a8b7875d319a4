"""Tiny random checkpoints of every family of pyggml.models.arch, without downloads, and their reference logits.

    ckpt = make_checkpoint("qwen3", tmp / "qwen3")          # transformers' config class, random weights, saved
    convert([(ckpt, tmp / "qwen3.gguf", "f32")])            # llama.cpp's own convert_hf_to_gguf.py code
    ref = ckpt.logits(ids)                                  # transformers' forward in f32, every position
    cpp = llamacpp_logits([(tmp / "qwen3.gguf", ids)])[0]   # llama.cpp's (f32 KV cache, flash attention off)

Checkpoints are made with transformers' config classes (`SPECS`: hidden 64, a few
layers) and every weight drawn at random (norm weights too, so a norm applied
wrongly shows). They are written as GGUF by the sdist's converter (the model
classes of `$LCPP/conversion`, run in a subprocess with `$LCPP/gguf-py`): its
tensor names, permutations and metadata are llama.cpp's own. The converter
refuses tokenizers it does not know, so the tokenizer step alone is replaced:
the GGUF takes the `tokenizer.*` keys of the matching `ggml-vocab-*.gguf` of
`$LCPP/models`, whose size is the checkpoint's vocabulary. llama.cpp's logits
come from its `llama_cpp` ctypes bindings (the same sdist) over the
`libllama.so` that pyggml.testing.llamacpp builds, in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pyggml.testing import llamacpp


@dataclass(frozen=True)
class Spec:
    """One family's tiny checkpoint: transformers' config and model classes, the config's values, the vocabulary."""

    config: str
    model: str
    vocab: str  # the ggml-vocab-<vocab>.gguf of the sdist's models folder
    kwargs: dict[str, Any] = field(default_factory=dict)
    # config.json's values as the real files spell them, where transformers saves its own names
    file_config: dict[str, Any] = field(default_factory=dict)


_COMMON = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-5}

_PHI3 = {"vocab_size": 32064, "num_hidden_layers": 2, "tie_word_embeddings": False, "sliding_window": None,
         "pad_token_id": 32000, "bos_token_id": 1, "eos_token_id": 32000}

SPECS: dict[str, Spec] = {
    "llama": Spec("LlamaConfig", "LlamaForCausalLM", "llama-spm",
                  {"vocab_size": 32000, "num_hidden_layers": 2, "tie_word_embeddings": False}),
    "qwen2": Spec("Qwen2Config", "Qwen2ForCausalLM", "qwen2",
                  {"vocab_size": 151936, "num_hidden_layers": 2, "tie_word_embeddings": True,
                   "rope_theta": 1000000.0}),
    # a head size that is not hidden / heads: the file's key_length
    "qwen3": Spec("Qwen3Config", "Qwen3ForCausalLM", "qwen2",
                  {"vocab_size": 151936, "num_hidden_layers": 2, "head_dim": 32, "tie_word_embeddings": True}),
    # six layers: five sliding (a window of 4 tokens, rope base 10000) and one global (rope base 1e6); HF's
    # query_pre_attn_scalar set to the head size, the scale llama.cpp uses; soft-capped logits
    "gemma3": Spec("Gemma3TextConfig", "Gemma3ForCausalLM", "llama-spm",
                   {"vocab_size": 32000, "num_hidden_layers": 6, "head_dim": 32, "query_pre_attn_scalar": 32,
                    "sliding_window": 4, "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6}),
    "phi3": Spec("Phi3Config", "Phi3ForCausalLM", "phi-3", _PHI3),
    # mixtures of experts: 8 experts, 2 a token (qwen3moe: renormalized as llama.cpp always does; Mixtral: llama's
    # file with expert tensors)
    "qwen3moe": Spec("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "qwen2",
                     {"vocab_size": 151936, "num_hidden_layers": 2, "head_dim": 32, "tie_word_embeddings": False,
                      "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                      "norm_topk_prob": True}),
    # rows of 256 (K-quant blocks) for llama-quantize's Q4_K_M experts
    "qwen3moe_wide": Spec("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "llama-spm",
                          {"vocab_size": 32000, "num_hidden_layers": 2, "hidden_size": 256, "head_dim": 64,
                           "tie_word_embeddings": False, "num_experts": 8, "num_experts_per_tok": 2,
                           "moe_intermediate_size": 256, "norm_topk_prob": True}),
    "mixtral": Spec("MixtralConfig", "MixtralForCausalLM", "llama-spm",
                    {"vocab_size": 32000, "num_hidden_layers": 2, "tie_word_embeddings": False,
                     "num_local_experts": 8, "num_experts_per_tok": 2}),
    # norms of the attention's and FFN's outputs only, Q and K normed over all heads
    "olmo2": Spec("Olmo2Config", "Olmo2ForCausalLM", "llama-spm",
                  {"vocab_size": 32000, "num_hidden_layers": 2, "tie_word_embeddings": False, "eos_token_id": 2}),
    # four layers alternating a window of 4 tokens and global attention; attention logits capped at 4 (so the
    # cap shows), the output at 30
    "gemma2": Spec("Gemma2Config", "Gemma2ForCausalLM", "llama-spm",
                   {"vocab_size": 32000, "num_hidden_layers": 4, "head_dim": 32, "query_pre_attn_scalar": 32,
                    "sliding_window": 4, "attn_logit_softcapping": 4.0, "final_logit_softcapping": 30.0,
                    "rms_norm_eps": 1e-6}),
    # four layers: the fourth attends without RoPE
    "smollm3": Spec("SmolLM3Config", "SmolLM3ForCausalLM", "llama-bpe",
                    {"vocab_size": 128256, "num_hidden_layers": 4, "tie_word_embeddings": True}),
    # Granite's embedding, residual, attention and logit multipliers
    "granite": Spec("GraniteConfig", "GraniteForCausalLM", "llama-spm",
                    {"vocab_size": 32000, "num_hidden_layers": 2, "tie_word_embeddings": False,
                     "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0078125,
                     "logits_scaling": 8.0}),
    # Granite's scales, 8 experts (2 a token) and a shared expert
    "granitemoe": Spec("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM", "llama-spm",
                       {"vocab_size": 32000, "num_hidden_layers": 2, "tie_word_embeddings": False,
                        "intermediate_size": 32, "shared_intermediate_size": 48, "num_local_experts": 8,
                        "num_experts_per_tok": 2, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                        "attention_multiplier": 0.0078125, "logits_scaling": 8.0}),
    # 8 experts with biases, 2 a token weighted by the softmax of their logits, the clamped SwiGLU; attention
    # sinks; a window of 4 tokens then global; YaRN (factor 4 over 64 positions) with its correction dims rounded
    # as ggml rounds them (truncate: the real files' False is transformers' alone)
    "gpt-oss": Spec("GptOssConfig", "GptOssForCausalLM", "qwen2",
                    {"vocab_size": 151936, "num_hidden_layers": 2, "head_dim": 16, "intermediate_size": 32,
                     "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 4,
                     "layer_types": ["sliding_attention", "full_attention"],
                     "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                         "original_max_position_embeddings": 64, "beta_fast": 32.0,
                                         "beta_slow": 1.0, "truncate": True}}),
    # short-convolution blocks (a window of 3) beside attention: conv, attention, conv
    "lfm2": Spec("Lfm2Config", "Lfm2ForCausalLM", "llama-spm",
                 {"vocab_size": 32000, "num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"],
                  "block_auto_adjust_ff_dim": False, "norm_eps": 1e-5, "tie_word_embeddings": True}),
    # Mamba-2 blocks (8 heads of 16 in 2 groups, a state of 16, a window of 4) beside attention, Granite's scales,
    # 8 experts (2 a token) and a shared expert
    "granitehybrid": Spec("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", "llama-spm",
                          {"vocab_size": 32000, "num_hidden_layers": 3, "layer_types": ["mamba", "attention", "mamba"],
                           "tie_word_embeddings": False, "intermediate_size": 32, "shared_intermediate_size": 48,
                           "num_local_experts": 8, "num_experts_per_tok": 2, "embedding_multiplier": 12.0,
                           "residual_multiplier": 0.22, "attention_multiplier": 0.0078125, "logits_scaling": 8.0,
                           "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 2, "mamba_d_state": 16,
                           "mamba_d_conv": 4, "mamba_expand": 2},
                          file_config={"layer_types": ["mamba", "attention", "mamba"]}),
    # Llama 3's rope: the converter's rope_freqs tensor of frequency factors
    "llama3": Spec("LlamaConfig", "LlamaForCausalLM", "llama-spm",
                   {"vocab_size": 32000, "num_hidden_layers": 2, "tie_word_embeddings": True,
                    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 16}}),
    # Phi-3's LongRoPE (the 128k files): short factors within the original 256 positions, long ones past them
    # (transformers by the sequence's length, llama.cpp by the context's), the attention factor
    # sqrt(1 + ln 4 / ln 256)
    "phi3_longrope": Spec("Phi3Config", "Phi3ForCausalLM", "phi-3",
                          {**_PHI3, "original_max_position_embeddings": 256, "max_position_embeddings": 1024,
                           "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                               "short_factor": [1.0 + 0.1 * i for i in range(8)],
                                               "long_factor": [1.0 + 0.7 * i for i in range(8)],
                                               "original_max_position_embeddings": 256}}),
}


def vocab_path(spec: Spec) -> Path:
    return llamacpp.models_dir() / f"ggml-vocab-{spec.vocab}.gguf"


@dataclass
class Checkpoint:
    """A saved tiny checkpoint and the transformers model it was saved from (f32, eager attention)."""

    arch: str
    path: Path
    model: Any

    def logits(self, ids: list[int]) -> np.ndarray:
        """transformers' logits of every position of `ids`, (len(ids), n_vocab) float32."""
        import torch

        with torch.no_grad():
            out = self.model(torch.tensor([ids], dtype=torch.long))
        return out.logits[0].to(torch.float32).numpy()


def make_checkpoint(arch: str, path: Path, seed: int = 0) -> Checkpoint:
    """A random `arch` checkpoint of `SPECS`, saved in `path` (config.json, model.safetensors): every matrix
    N(0, 1/fan_in), embeddings N(0, 1), biases N(0, 0.1), norm weights their initial value + N(0, 0.1)."""
    import torch
    import transformers

    spec = SPECS[arch]
    config = getattr(transformers, spec.config)(**{**_COMMON, **spec.kwargs})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, spec.model)(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p)) if "norm" in name else p.copy_(0.1 * torch.randn_like(p))
            elif "embed" in name:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    if spec.file_config:
        saved = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**saved, **spec.file_config}))
    # gemma3's converter cuts token_embd to the tokenizer's size, read from tokenizer.json: the full vocabulary
    n = int(config.vocab_size)
    (path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {f"t{i}": i for i in range(n)}},
                                                     "added_tokens": []}))
    return Checkpoint(arch, path, model)


def hparams_of(path: Path, arch: str, meta: dict[str, Any], block_count: int = 6) -> Any:
    """pyggml's HParams of a file at `path` holding `arch`'s keys `meta` (without the "<arch>." prefix) beside
    hidden 64, 4 heads, an FFN of 128, `block_count` layers, and a token embedding alone."""
    from pyggml.gguf.reader import read_gguf
    from pyggml.gguf.writer import write_gguf
    from pyggml.models.arch import HParams

    base = {"embedding_length": 64, "block_count": block_count, "feed_forward_length": 128,
            "attention.head_count": 4}
    write_gguf(path, arch, {f"{arch}.{k}": v for k, v in {**base, **meta}.items()},
               {"token_embd.weight": np.zeros((10, 64), np.float32)})
    gf = read_gguf(path)
    try:
        return HParams.from_gguf(gf)
    finally:
        gf.close()


# --- the converter, in a subprocess (its gguf-py must not shadow the installed gguf package here) ---

_CONVERT = r"""
import json, sys
from pathlib import Path
lcpp, jobs = sys.argv[1], json.loads(sys.argv[2])
sys.path[:0] = [lcpp + "/gguf-py", lcpp]
import gguf, torch
from conversion import ModelBase, ModelType, get_model_architecture, get_model_class

def vocab_setter(vocab_json):
    def set_vocab(self):
        # the tokenizer of a ggml-vocab file, key by key with its GGUF types (the rest is the converter's)
        for key, (vtype, value) in json.loads(Path(vocab_json).read_text()).items():
            main, _, sub = vtype.partition(" of ")
            self.gguf_writer.add_key_value(key, value, gguf.GGUFValueType[main],
                                           sub_type=gguf.GGUFValueType[sub] if sub else None)
    return set_vocab

types = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
         "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
with torch.inference_mode():
    for ckpt, vocab, out, outtype in jobs:
        hparams = ModelBase.load_hparams(Path(ckpt), False)
        cls = get_model_class(get_model_architecture(hparams, ModelType.TEXT))
        tiny = type("Tiny" + cls.__name__, (cls,), {"model_arch": cls.model_arch, "set_vocab": vocab_setter(vocab)})
        tiny(Path(ckpt), types[outtype], Path(out), eager=True).write()
"""


def _vocab_json(spec: Spec, folder: Path) -> Path:
    """The `tokenizer.*` keys of the spec's ggml-vocab file as JSON {key: [GGUF type, value]}, read by pyggml's
    reader (gguf-py's takes 15 s over qwen2's 151936 tokens, this 2 s)."""
    from pyggml.gguf.reader import read_gguf
    from pyggml.models.metadata import gguf_type

    out = folder / f"vocab-{spec.vocab}.json"
    if not out.exists():
        gf = read_gguf(vocab_path(spec))
        try:
            keys = {k: [gguf_type(gf, k), gf.get(k)] for k in gf.keys() if k.startswith("tokenizer.")}
        finally:
            gf.close()
        out.write_text(json.dumps(keys))
    return out


def convert(jobs: list[tuple[Checkpoint, Path, str]]) -> None:
    """Write each checkpoint as GGUF (`outtype` f32, f16, bf16 or q8_0) with the sdist's converter, in one process."""
    lcpp = llamacpp.paths().llama_cpp
    args = [[str(c.path), str(_vocab_json(SPECS[c.arch], out.parent)), str(out), t] for c, out, t in jobs]
    r = subprocess.run([sys.executable, "-c", _CONVERT, str(lcpp), json.dumps(args)], capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf failed (exit {r.returncode}):\n{r.stderr[-4000:]}")


# --- llama.cpp's logits through its ctypes bindings, in a subprocess ---

_LOGITS = llamacpp.BINDINGS_PRELUDE + r"""
jobs = json.loads(sys.argv[2])
settings = json.loads(sys.argv[3])
for path, ids, out, n_ctx in jobs:
    mp = ll.llama_model_default_params()
    model = ll.llama_model_load_from_file(path.encode(), mp)
    assert model, f"llama.cpp did not load {path}"
    cp = ll.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
    cp.n_threads = cp.n_threads_batch = 2
    cp.type_k = getattr(ll, "GGML_TYPE_" + settings["type_k"])
    cp.type_v = getattr(ll, "GGML_TYPE_" + settings["type_v"])
    fa = ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if settings["flash_attn"] else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.flash_attn_type = fa
    ctx = ll.llama_init_from_model(model, cp)
    assert ctx, f"llama.cpp did not make a context for {path}"
    n = len(ids)
    batch = ll.llama_batch_init(n, 0, 1)
    for i, t in enumerate(ids):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, i, 1, 1
        batch.seq_id[i][0] = 0
    batch.n_tokens = n
    rc = ll.llama_decode(ctx, batch)
    assert rc == 0, f"llama_decode returned {rc}"
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
    logits = np.ctypeslib.as_array(ll.llama_get_logits(ctx), shape=(n * n_vocab,)).reshape(n, n_vocab)
    np.save(out, logits.astype(np.float32))
    ll.llama_batch_free(batch)
    ll.llama_free(ctx)
    ll.llama_model_free(model)
"""


def llamacpp_logits(jobs: list[tuple[Path, list[int]]] | list[tuple[Path, list[int], int]], tmp: Path,
                    n_ctx: int = 256, type_k: str = "F32", type_v: str = "F32",
                    flash_attn: bool = False) -> list[np.ndarray]:
    """llama.cpp's logits of every position of each (model, ids[, n_ctx]), by default with an f32 KV cache and
    flash attention off (the reference DESIGN.md's "Oracles" describes; else the cache types, ggml's names, and
    -fa given), all in one process; builds llama.cpp if this machine lacks it (NoCompilerError without a
    compiler)."""
    lib_dir = llamacpp.require_tools(["llama-debug"])["llama-debug"].parent  # libllama.so is built beside it
    outs = [tmp / f"llamacpp-logits-{i}.npy" for i in range(len(jobs))]
    args = [[str(job[0]), [int(t) for t in job[1]], str(o), int(job[2]) if len(job) > 2 else n_ctx]  # type: ignore[misc]
            for job, o in zip(jobs, outs, strict=True)]
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(lib_dir)}
    settings = {"type_k": type_k.upper(), "type_v": type_v.upper(), "flash_attn": bool(flash_attn)}
    r = subprocess.run([sys.executable, "-c", _LOGITS, str(llamacpp.paths().sdist), json.dumps(args),
                        json.dumps(settings)],
                       capture_output=True, text=True, timeout=600, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"llama.cpp's logits failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
    return [np.load(o) for o in outs]


__all__ = ["SPECS", "Checkpoint", "Spec", "convert", "hparams_of", "llamacpp_logits", "make_checkpoint",
           "vocab_path"]
