"""/v1/embeddings on SmolLM2 (a decoder, mean pooling) against real llama.cpp's `llama-embedding` with the same
pooling and normalization, in ORACLE.md's reference configuration (F32 KV cache, flash attention off)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from serve_util import API_KEY, Running, start_server

from pyggml.serve.options import ServerOptions
from pyggml.testing import llamacpp

TEXTS = ("Hello world", "The cat sat on the mat.", "Embeddings map text to vectors of numbers.",
         "def add(a, b): return a + b", "Paris is the capital of France, and Berlin is the capital of Germany.")
TOOL = "llama-embedding"


@pytest.fixture(scope="module")
def llama_embedding() -> Path:
    """The tool, built where this machine's cache lacks it (a skip only without a compiler, as the interop tests)."""
    found = llamacpp.find_tool(TOOL)
    if found is not None:
        return found
    try:
        return llamacpp.require_tool(TOOL)
    except llamacpp.NoCompilerError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def smollm2_server(smollm2_path: Path) -> Iterator[Running]:
    yield from start_server(n_slots=2, n_ctx=512, api_key=API_KEY, model_path=smollm2_path,
                            options=ServerOptions(embeddings=True, pooling="mean"))


def test_smollm2_mean_embeddings_match_llama_embedding(smollm2_server: Running, smollm2_path: Path,
                                                       llama_embedding: Path) -> None:
    client = openai.OpenAI(base_url=smollm2_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60.0)
    got = np.array([d.embedding for d in client.embeddings.create(model="smollm2", input=list(TEXTS)).data])
    out = subprocess.run([str(llama_embedding), "-m", str(smollm2_path), "--pooling", "mean", "-fa", "off",
                          "-ctk", "f32", "-ctv", "f32", "-t", "2", "--embd-output-format", "array",
                          "-p", "\n".join(TEXTS)], capture_output=True, text=True, timeout=300, check=True)
    want = np.array(json.loads(out.stdout.strip()))
    assert got.shape == want.shape == (len(TEXTS), 576)
    cos = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.999, np.round(cos, 6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)  # euclidean, as llama.cpp's default
