"""The built-in model as other GGUF readers see it: llama.cpp's metadata keys and tensor names
(the gguf package's own tables), and transformers' GGUF loader (its own Q/K un-permutation and
its own SentencePiece tokenizer from the file's fields) agreeing with pyggml."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.cli._common import builtin_model_path
from pyggml.gguf.reader import read_gguf

TEXT = "Return the number of items in the list.\nThe café ünïcode 1234   spaces\t\ttabs ~ {x: 0x1F}"


def test_builtin_model_has_llama_cpp_metadata_and_names() -> None:
    import gguf

    gf = read_gguf(builtin_model_path())
    assert gf.get("general.architecture") == "llama"
    for key in ["context_length", "embedding_length", "block_count", "feed_forward_length",
                "attention.head_count", "attention.head_count_kv", "rope.dimension_count",
                "attention.layer_norm_rms_epsilon", "rope.freq_base"]:
        assert f"llama.{key}" in gf.keys(), key
    n_layer = gf.get("llama.block_count")
    assert 2 <= n_layer <= 8 and gf.get("llama.attention.head_count_kv") < gf.get("llama.attention.head_count")
    # every tensor name is one llama.cpp's LLAMA architecture defines
    allowed = set()
    for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.LLAMA]:
        name = gguf.TENSOR_NAMES[t]
        allowed |= {name.format(bid=i) + ".weight" for i in range(n_layer)} if "{bid}" in name else {name + ".weight"}
    assert set(gf.tensors) <= allowed
    needed = {"token_embd.weight", "output_norm.weight", "blk.0.attn_q.weight", "blk.0.ffn_down.weight"}
    assert needed <= set(gf.tensors)
    # SentencePiece fields as llama.cpp's converter writes them
    tokens = gf.get("tokenizer.ggml.tokens")
    assert gf.get("tokenizer.ggml.model") == "llama"
    assert len(tokens) == len(gf.get("tokenizer.ggml.scores")) == len(gf.get("tokenizer.ggml.token_type"))
    assert tokens[gf.get("tokenizer.ggml.bos_token_id")] == "<s>"
    assert tokens[gf.get("tokenizer.ggml.eos_token_id")] == "</s>"
    assert tokens[gf.get("tokenizer.ggml.unknown_token_id")] == "<unk>"
    types = gf.get("tokenizer.ggml.token_type")
    assert [tokens[i] for i, t in enumerate(types) if t == 6] == [f"<0x{b:02X}>" for b in range(256)]  # byte fallback


@pytest.mark.slow
def test_transformers_reads_the_same_model() -> None:
    """transformers' GGUF loader is an independent reader of llama.cpp files: same tokens, same logits.

    Tolerance: the file's weights are F16 and both sides use them exactly, but pyggml's F16 matrix
    products round the activations to F16 as ggml does (relative error ~5e-4 per product); over 4
    layers that stays below 1e-2 on logits of magnitude ~10."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    import pyggml.models

    path = builtin_model_path()
    hf_tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    config = dict(load_gguf_checkpoint(str(path))["config"])
    config.pop("model_type", None)
    config.pop("architectures", None)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(**config)).eval()
    ckpt = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=hf)
    result = hf.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in ckpt["tensors"].items()}, strict=False)
    assert result.unexpected_keys == [] and set(result.missing_keys) <= {"lm_head.weight"}  # tied to the embeddings
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()

    model = pyggml.models.load(path, n_ctx=64, progress=False)
    try:
        ids = model.tokenize(TEXT)
        assert ids == hf_tok(TEXT).input_ids
        assert model.detokenize(ids) == TEXT
        ours = model.eval(ids)
    finally:
        model.free()
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(theirs).max() > 1.0
    np.testing.assert_allclose(ours, theirs, atol=1e-2, rtol=0)
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() >= 0.95
