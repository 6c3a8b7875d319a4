"""Writing a LLaMA GGUF file from HF-layout weights, as llama.cpp's `convert.py` does.

Used by the tests (a tiny HF `LlamaForCausalLM` turned into a file pyggml
loads) and the benchmark. What llama.cpp's converter does and this repeats:
tensor names (`token_embd`, `blk.N.attn_q`, ...), the `llama.*` metadata,
and the row permutation of Q and K (`permute`): HF's checkpoints rotate
the two halves of each head ("rotate_half"), ggml's RoPE normal mode rotates
adjacent pairs, and reordering each head's rows turns one into the other.
2-D weights are written in the chosen type (quantized with pyggml's
byte-exact quantizers); norms stay F32, as llama.cpp's quantize keeps them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from pyggml.core.types import GGMLType, as_type
from pyggml.gguf.writer import write_gguf

# HF parameter name (per layer where it has {i}) -> llama.cpp tensor name
HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight",
    "model.layers.{i}.self_attn.k_proj.weight": "blk.{i}.attn_k.weight",
    "model.layers.{i}.self_attn.v_proj.weight": "blk.{i}.attn_v.weight",
    "model.layers.{i}.self_attn.o_proj.weight": "blk.{i}.attn_output.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "blk.{i}.ffn_norm.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "blk.{i}.ffn_gate.weight",
    "model.layers.{i}.mlp.up_proj.weight": "blk.{i}.ffn_up.weight",
    "model.layers.{i}.mlp.down_proj.weight": "blk.{i}.ffn_down.weight",
}


# llama.cpp's llama_ftype of a file whose 2-D weights are all of one type
LLAMA_FTYPE = {GGMLType.F32: 0, GGMLType.F16: 1, GGMLType.Q4_0: 2, GGMLType.Q4_1: 3, GGMLType.Q8_0: 7,
               GGMLType.Q5_0: 8, GGMLType.Q5_1: 9, GGMLType.Q2_K: 10, GGMLType.Q3_K: 12, GGMLType.Q4_K: 15,
               GGMLType.Q5_K: 17, GGMLType.Q6_K: 18, GGMLType.IQ4_NL: 25, GGMLType.IQ4_XS: 30, GGMLType.BF16: 32}


def permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp convert.py's `permute`: HF's rotate-half rows of Q/K to ggml's interleaved pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def unpermute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """The inverse of `permute` (GGUF rows back to HF's layout)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, weights.shape[0] // n_head // 2, 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def simple_vocab(n_vocab: int) -> dict[str, Any]:
    """A SentencePiece-style (`llama`) vocab of `n_vocab` tokens: <unk>, <s>, </s>, the 256 byte
    tokens <0xXX>, single characters and short words with made-up scores."""
    if n_vocab < 259 + 26:
        raise ValueError(f"simple_vocab needs n_vocab >= {259 + 26}, got {n_vocab}")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # UNKNOWN, CONTROL, CONTROL, BYTE
    pieces = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + \
        [chr(c) for c in range(ord("A"), ord("Z") + 1)] + [str(d) for d in range(10)] + list(".,!?'-")
    words = ["the", "and", "of", "to", "in", "is", "it", "you", "that", "was", "for", "on", "are", "with", "as",
             "he", "be", "at", "one", "have", "this", "from", "or", "had", "by", "hot", "word", "but", "what",
             "some", "we", "can", "out", "other", "were", "all", "there", "when", "up", "use", "your", "how"]
    pieces += ["\u2581" + w for w in words] + words + ["\u2581" + c for c in "abcdefghijklmnopqrstuvwxyz"]
    seen = set(tokens)
    extra = [p for p in dict.fromkeys(pieces) if p not in seen]
    k = 0
    while len(extra) < n_vocab - len(tokens):
        extra.append(f"\u2581tok{k}")
        k += 1
    extra = extra[: n_vocab - len(tokens)]
    scores = [0.0] * len(tokens) + [-float(i) - 1.0 - 0.1 * len(p) for i, p in enumerate(extra)]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens + extra,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types + [1] * len(extra),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }


def write_llama_gguf(path: str | os.PathLike[str], config: Mapping[str, Any], state: Mapping[str, np.ndarray],
                     type: GGMLType | str = GGMLType.F32, vocab: Mapping[str, Any] | None = None,
                     types: Mapping[str, GGMLType] | None = None) -> None:
    """Write HF-layout LLaMA weights `state` (numpy, HF names) with HF `config` keys
    (hidden_size, num_hidden_layers, ...) as a llama.cpp GGUF file.

    `type`: the type of 2-D weights (F32, F16, Q8_0, Q4_0, ...); `types` overrides it per GGUF name.
    `vocab`: tokenizer metadata (default `simple_vocab(vocab_size)`).
    """
    t2d = as_type(type)
    n_layer = int(config["num_hidden_layers"])
    n_head = int(config["num_attention_heads"])
    n_head_kv = int(config.get("num_key_value_heads") or n_head)
    n_embd = int(config["hidden_size"])
    rope = dict(config.get("rope_parameters") or {})  # transformers >= 5 keeps theta and scaling here
    scaling = config.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    meta: dict[str, Any] = {
        "general.name": str(config.get("name", "pyggml-llama")),
        "general.file_type": LLAMA_FTYPE.get(t2d, 0),
        "llama.context_length": int(config.get("max_position_embeddings", 2048)),
        "llama.embedding_length": n_embd,
        "llama.block_count": n_layer,
        "llama.feed_forward_length": int(config["intermediate_size"]),
        "llama.attention.head_count": n_head,
        "llama.attention.head_count_kv": n_head_kv,
        "llama.rope.dimension_count": n_embd // n_head,
        "llama.rope.freq_base": float(config.get("rope_theta", rope.get("rope_theta", 10000.0))),
        "llama.attention.layer_norm_rms_epsilon": float(config.get("rms_norm_eps", 1e-5)),
    }
    if scaling and scaling.get("type", scaling.get("rope_type")) == "linear":
        meta["llama.rope.scaling.type"] = "linear"
        meta["llama.rope.scaling.factor"] = float(scaling["factor"])
    meta.update(vocab if vocab is not None else simple_vocab(int(config["vocab_size"])))

    tensors: dict[str, np.ndarray] = {}
    out_types: dict[str, GGMLType] = {}
    for i in [None, *range(n_layer)]:
        for hf, gg in HF_TO_GGUF.items():
            if ("{i}" in hf) != (i is not None):
                continue
            hf_name, name = hf.format(i=i), gg.format(i=i)
            if hf_name not in state:
                if name == "output.weight":
                    continue  # tied embeddings: llama.cpp uses token_embd for the head
                raise KeyError(f"write_llama_gguf: weight '{hf_name}' is missing")
            w = np.asarray(state[hf_name], dtype=np.float32)
            if name.endswith("attn_q.weight"):
                w = permute(w, n_head, n_head)
            elif name.endswith("attn_k.weight"):
                w = permute(w, n_head, n_head_kv)
            tensors[name] = w
            out_types[name] = GGMLType.F32 if w.ndim == 1 else t2d
    if types:
        out_types.update({k: as_type(v) for k, v in types.items()})
    write_gguf(path, "llama", meta, tensors, types=out_types)


def hf_state_from_gguf(gf: Any, n_head: int, n_head_kv: int) -> dict[str, np.ndarray]:
    """The file's weights dequantized to float32 in HF layout and names (Q/K un-permuted):
    a reference model on exactly the numbers the file holds."""
    state: dict[str, np.ndarray] = {}
    n_layer = sum(1 for name in gf.tensors if name.endswith("attn_q.weight"))
    for i in [None, *range(n_layer)]:
        for hf, gg in HF_TO_GGUF.items():
            if ("{i}" in hf) != (i is not None):
                continue
            name = gg.format(i=i)
            if name not in gf.tensors:
                continue
            w = gf.tensor_float(name)
            if name.endswith("attn_q.weight"):
                w = unpermute(w, n_head, n_head)
            elif name.endswith("attn_k.weight"):
                w = unpermute(w, n_head, n_head_kv)
            state[hf.format(i=i)] = w
    return state
