"""Allocators (the seed's ggml-alloc.c): tensors placed in backend buffers."""

from pyggml.alloc.tensor_allocator import MAX_FREE_BLOCKS, FreeBlock, TensorAllocator, aligned_offset

__all__ = ["MAX_FREE_BLOCKS", "FreeBlock", "TensorAllocator", "aligned_offset"]
