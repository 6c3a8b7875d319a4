"""Allocators (the seed's ggml-alloc.c): tensors placed in backend buffers."""

from pyggml.alloc.graph_allocator import GraphAllocator, HashNode, op_can_inplace
from pyggml.alloc.hash_set import HashSet
from pyggml.alloc.tensor_allocator import MAX_FREE_BLOCKS, FreeBlock, TensorAllocator, aligned_offset

__all__ = ["MAX_FREE_BLOCKS", "FreeBlock", "GraphAllocator", "HashNode", "HashSet", "TensorAllocator",
           "aligned_offset", "op_can_inplace"]
