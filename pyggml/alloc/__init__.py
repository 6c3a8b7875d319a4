"""Allocators (ggml-alloc.c): tensors placed in backend buffers, one by one, a graph at a time, or a context's
all at once."""

from pyggml.alloc.ctx_tensors import (
    alloc_ctx_tensors,
    alloc_ctx_tensors_from_buft,
    alloc_size,
    alloc_tensors,
    alloc_tensors_from_buft,
)
from pyggml.alloc.graph_allocator import GraphAllocator, HashNode, op_can_inplace
from pyggml.alloc.hash_set import HashSet
from pyggml.alloc.report import MemoryReport, ReportEntry, memory_report
from pyggml.alloc.tensor_allocator import MAX_FREE_BLOCKS, FreeBlock, TensorAllocator, aligned_offset

__all__ = ["MAX_FREE_BLOCKS", "FreeBlock", "GraphAllocator", "HashNode", "HashSet", "MemoryReport",
           "ReportEntry", "TensorAllocator", "aligned_offset", "alloc_ctx_tensors", "alloc_ctx_tensors_from_buft",
           "alloc_size", "alloc_tensors", "alloc_tensors_from_buft", "memory_report", "op_can_inplace"]
