"""Allocators (the seed's ggml-alloc.c, and today's alloc_ctx_tensors): tensors placed in backend buffers."""

from pyggml.alloc.allocr import Allocr
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

__all__ = ["MAX_FREE_BLOCKS", "Allocr", "FreeBlock", "GraphAllocator", "HashNode", "HashSet", "MemoryReport",
           "ReportEntry", "TensorAllocator", "aligned_offset", "alloc_ctx_tensors", "alloc_ctx_tensors_from_buft",
           "alloc_size", "alloc_tensors", "alloc_tensors_from_buft", "memory_report", "op_can_inplace"]
