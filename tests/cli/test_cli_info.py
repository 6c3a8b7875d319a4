"""`pyggml info`: the architecture, hyper-parameters, tokenizer and every tensor of a file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pyggml.cli._common import fmt_bytes
from pyggml.cli.main import main
from pyggml.gguf.reader import read_gguf


def test_info_shows_everything(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tiny_model)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^architecture:\s+llama$", out, re.M)
    assert re.search(r"^name:\s+cli-tiny$", out, re.M)
    assert re.search(r"^file type:\s+MOSTLY_F16 \(1\)$", out, re.M)
    for key, value in [("embedding_length", "64"), ("block_count", "2"), ("feed_forward_length", "128"),
                       ("attention.head_count", "4"), ("attention.head_count_kv", "2"),
                       ("rope.dimension_count", "16"), ("context_length", "128")]:
        assert re.search(rf"^  {re.escape(key)}\s+{value}$", out, re.M), key
    assert re.search(r"^  model\s+llama \(SentencePiece\)$", out, re.M)
    assert re.search(r"^  n_vocab\s+320$", out, re.M)
    assert re.search(r"^  bos\s+1 '<s>'$", out, re.M)
    assert re.search(r"^  eos\s+2 '</s>'$", out, re.M)

    gf = read_gguf(tiny_model)
    rows = {m.group(1): m.groups()[1:] for m in
            re.finditer(r"^\|\s+\d+ \| (\S+)\s+\| (\S+)\s+\| (\[[^\]]*\])\s+\|\s+(.+?) \|$", out, re.M)}
    assert set(rows) == set(gf.tensors)  # every tensor, nothing else
    for name, info in gf.tensors.items():
        type_name, shape, size = rows[name]
        assert type_name == info.type.name
        assert shape == "[" + ", ".join(str(n) for n in info.ne) + "]"
        assert size == fmt_bytes(info.nbytes)
    assert rows["blk.1.ffn_down.weight"] == ("F16", "[128, 64]", "16.00 KiB")
    assert rows["output_norm.weight"] == ("F32", "[64]", "256 B")
    total = sum(t.nelements() for t in gf.tensors.values())
    assert f"tensors: {len(gf.tensors)}, {total / 1e3:.2f} K parameters" in out


def test_info_no_tensors(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tiny_model), "--no-tensors"]) == 0
    out = capsys.readouterr().out
    assert "tensors: 21," in out and "blk.0.attn_q.weight" not in out


def test_info_of_other_architecture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """info reads any GGUF file: no llama keys, no tokenizer, odd metadata."""
    import numpy as np

    from pyggml.gguf.writer import write_gguf

    path = tmp_path / "other.gguf"
    meta = {"mamba.block_count": 3, "general.description": "x" * 200, "custom.list": [1, 2, 3, 4, 5]}
    write_gguf(path, "mamba", meta, {"w": np.zeros((4, 32), np.float32)})
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^architecture:\s+mamba$", out, re.M)
    assert re.search(r"^  block_count\s+3$", out, re.M)
    assert "(none: tokenizer.ggml.model is missing)" in out
    assert "[5 items: 1, 2, 3, 4, ...]" in out
    assert "x" * 90 not in out  # long strings are cut
    assert re.search(r"^\|\s+0 \| w\s+\| F32\s+\| \[32, 4\]\s+\|\s+512 B \|$", out, re.M)


def test_info_counts_experts_and_active_parameters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A token goes through every tensor but the experts', and through 1 of the 4 experts' slices of those."""
    import numpy as np

    from pyggml.gguf.writer import write_gguf

    path = tmp_path / "moe.gguf"
    tensors = {"token_embd.weight": np.zeros((10, 8), np.float32),
               "blk.0.ffn_up_exps.weight": np.zeros((4, 6, 8), np.float32),
               "blk.0.ffn_down_exps.bias": np.zeros((4, 8), np.float32)}
    write_gguf(path, "qwen3moe", {"qwen3moe.expert_count": 4, "qwen3moe.expert_used_count": 1}, tensors)
    assert main(["info", str(path), "--no-tensors"]) == 0
    out = capsys.readouterr().out
    assert "tensors: 3, 304 parameters," in out
    assert re.search(r"^experts: 4, 1 used a token; active parameters 136 a token$", out, re.M)
    dense = tmp_path / "dense.gguf"
    write_gguf(dense, "qwen3", {}, {"token_embd.weight": np.zeros((10, 8), np.float32)})
    assert main(["info", str(dense), "--no-tensors"]) == 0
    assert "experts:" not in capsys.readouterr().out


def test_info_names_the_recurrent_layers_of_a_hybrid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    from pyggml.gguf.writer import write_gguf

    path = tmp_path / "lfm2.gguf"
    write_gguf(path, "lfm2", {"lfm2.attention.head_count_kv": [0, 0, 8, 0, 8]},
               {"token_embd.weight": np.zeros((10, 8), np.float32)})
    assert main(["info", str(path), "--no-tensors"]) == 0
    assert re.search(r"^layers: 5, 2 attention and 3 recurrent \(0, 1, 3\)$", capsys.readouterr().out, re.M)
    dense = tmp_path / "dense.gguf"
    write_gguf(dense, "qwen3", {"qwen3.attention.head_count_kv": 8},
               {"token_embd.weight": np.zeros((10, 8), np.float32)})
    assert main(["info", str(dense), "--no-tensors"]) == 0
    assert "layers:" not in capsys.readouterr().out
