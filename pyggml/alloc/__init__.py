"""Allocators (the seed's ggml-alloc.c): tensors placed in backend buffers."""

from pyggml.alloc.allocr import Allocr
from pyggml.alloc.graph_allocator import GraphAllocator, HashNode, op_can_inplace
from pyggml.alloc.hash_set import HashSet
from pyggml.alloc.report import MemoryReport, ReportEntry, memory_report
from pyggml.alloc.tensor_allocator import MAX_FREE_BLOCKS, FreeBlock, TensorAllocator, aligned_offset

__all__ = ["MAX_FREE_BLOCKS", "Allocr", "FreeBlock", "GraphAllocator", "HashNode", "HashSet", "MemoryReport",
           "ReportEntry", "TensorAllocator", "aligned_offset", "memory_report", "op_can_inplace"]
