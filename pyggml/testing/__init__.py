"""Helpers for checking backends: the op checker (`op_check`), oracles, tiny models; `alloc_ctx_tensors` is
ggml_backend_alloc_ctx_tensors, re-exported for the tests that make a context's tensors by hand."""

from __future__ import annotations

from pyggml.alloc.ctx_tensors import alloc_ctx_tensors

__all__ = ["alloc_ctx_tensors"]
