"""LLaMA's names for the shared decoder: the `llama` row of pyggml.models.arch's table, built by
pyggml.models.graph (kept so that code written against the LLaMA-only module keeps working)."""

from __future__ import annotations

from pyggml.models.arch import (
    ARCHS,
    ROPE_MODE_NORMAL,
    HParams,
    check_tensors,
    expected_shapes,
    layer_of,
    tensor_names,
)
from pyggml.models.graph import GraphInputs, build_graph, graph_size

LLAMA_ARCHS = tuple(ARCHS)  # every family the one graph builder covers
LlamaHParams = HParams
LlamaInputs = GraphInputs
build_llama = build_graph

__all__ = ["LLAMA_ARCHS", "ROPE_MODE_NORMAL", "LlamaHParams", "LlamaInputs", "build_llama", "check_tensors",
           "expected_shapes", "graph_size", "layer_of", "tensor_names"]
