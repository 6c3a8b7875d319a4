"""`TensorAllocator`: ggml-alloc.c's best-fit allocator (`ggml_tallocr`), tensors placed in one buffer.

Beyond ggml it remembers what it gave out, so a double or foreign free raises instead of corrupting the free
list (DESIGN.md, "The graph allocator").
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pyggml.core.checks import check_instance, check_int, check_positive
from pyggml.core.errors import (
    ArgumentError,
    BufferFreedError,
    InvalidStateError,
    LimitExceededError,
    NotAllocatedError,
    OutOfMemoryError,
)
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend.buffer import Buffer
from pyggml.ggml_backend.device import DeviceType
from pyggml.ggml_backend.registry import dev_by_type

if TYPE_CHECKING:
    from pyggml.ggml_backend.backend import Backend

log = logging.getLogger("pyggml.alloc")

MAX_FREE_BLOCKS = 256
SIZE_MAX = 2**64 - 1
MEASURE_BASE = 0x1000  # ggml's fake base address of a measure allocator


def aligned_offset(buffer: int | None, offset: int, alignment: int) -> int:
    """`offset` moved up so that `buffer + offset` is a multiple of `alignment` (a power of 2)."""
    alignment = check_int(alignment, "alignment")
    if alignment <= 0 or alignment & (alignment - 1):
        raise ArgumentError(f"alignment must be a power of 2, got {alignment}")
    base = buffer or 0
    align = (alignment - ((base + offset) % alignment)) % alignment
    return offset + align


class FreeBlock:
    """ggml's `struct free_block`: `size` free bytes from address `addr`."""

    __slots__ = ("addr", "size")

    def __init__(self, addr: int, size: int) -> None:
        self.addr = addr
        self.size = size

    def __repr__(self) -> str:
        return f"FreeBlock(addr={self.addr:#x}, size={self.size})"


class MeasureBuffer(Buffer):
    """A measure allocator's fake range (ggml's 0x1000 in a CPU buffer of SIZE_MAX/2), no memory behind it."""

    def __init__(self, base: int, size: int) -> None:
        super().__init__(None, size)
        self.name = "measure"
        self.base = base

    def _get_base(self) -> int:
        return self.base


class TensorAllocator:
    """ggml_tallocr: tensors placed in `buffer` by best fit over sorted free blocks."""

    def __init__(self, buffer: Buffer, buffer_owned: bool = False, alignment: int | None = None,
                 measure: bool = False, max_free_blocks: int = MAX_FREE_BLOCKS) -> None:
        """ggml_tallocr_new_from_buffer's initialization; `alignment` None asks the buffer (prefer the `new_*`)."""
        check_instance(buffer, Buffer, "TensorAllocator: buffer")
        max_free_blocks = check_positive(max_free_blocks, "TensorAllocator: max_free_blocks")
        self.buffer = buffer
        self.buffer_owned = buffer_owned
        self.base: int = buffer.get_base()
        self.alignment: int = buffer.get_alignment() if alignment is None else check_int(alignment, "alignment")
        aligned_offset(None, 0, self.alignment)
        self.free_blocks: list[FreeBlock] = []
        self.allocated: dict[int, tuple[Tensor, int, int]] = {}
        self.max_size = 0
        self.measure = measure
        self.max_free_blocks = max_free_blocks
        self.reset()

    @classmethod
    def new(cls, data: object, size: int, alignment: int, max_free_blocks: int = MAX_FREE_BLOCKS) -> TensorAllocator:
        """ggml_tallocr_new: an allocator over `size` bytes of caller memory, wrapped by the CPU device."""
        size = check_int(size, "cpu_buffer_from_ptr: size", minimum=0)
        device = dev_by_type(DeviceType.CPU)
        if device is None:
            raise ArgumentError("tallocr new: no CPU device is registered to wrap caller memory")
        buffer = device.buffer_from_host_ptr(data, size)
        buffer.name = "CPU"
        return cls(buffer, buffer_owned=True, alignment=alignment, max_free_blocks=max_free_blocks)

    @classmethod
    def new_measure(cls, alignment: int, max_free_blocks: int = MAX_FREE_BLOCKS) -> TensorAllocator:
        """ggml_tallocr_new_measure: a measure allocator over the fake range 0x1000 .. +SIZE_MAX/2."""
        buffer = MeasureBuffer(MEASURE_BASE, SIZE_MAX // 2)
        return cls(buffer, buffer_owned=True, alignment=alignment, measure=True, max_free_blocks=max_free_blocks)

    @classmethod
    def new_from_buffer(cls, buffer: Buffer, max_free_blocks: int = MAX_FREE_BLOCKS) -> TensorAllocator:
        """ggml_tallocr_new_from_buffer: an allocator over `buffer`, which the caller keeps owning."""
        return cls(buffer, buffer_owned=False, max_free_blocks=max_free_blocks)

    @classmethod
    def new_from_backend(cls, backend: Backend, size: int, max_free_blocks: int = MAX_FREE_BLOCKS) -> TensorAllocator:
        """ggml_tallocr_new_from_backend: an allocator over a new buffer of `size` bytes, freed with it."""
        buffer = backend.alloc_buffer(size)
        return cls(buffer, buffer_owned=True, max_free_blocks=max_free_blocks)

    @classmethod
    def new_measure_from_backend(cls, backend: Backend, max_free_blocks: int = MAX_FREE_BLOCKS) -> TensorAllocator:
        """ggml_tallocr_new_measure_from_backend: sizes and alignment from a 1-byte buffer of `backend`."""
        buffer = backend.alloc_buffer(1)
        return cls(buffer, buffer_owned=True, measure=True, max_free_blocks=max_free_blocks)

    @property
    def n_free_blocks(self) -> int:
        return len(self.free_blocks)

    def reset(self) -> None:
        """ggml_tallocr_reset: one free block over the whole (aligned) buffer; `max_size` is kept."""
        align_offset = aligned_offset(self.base, 0, self.alignment)
        if self.measure:
            size = SIZE_MAX // 2
        else:
            # a buffer smaller than its alignment padding has no usable bytes (size_t would wrap in C)
            size = max(self.buffer.get_size() - align_offset, 0)
        self.free_blocks = [FreeBlock(self.base + align_offset, size)]
        self.allocated = {}

    def free(self) -> None:
        """ggml_tallocr_free: frees the buffer if the allocator made it."""
        if self.buffer_owned:
            self.buffer.free()

    def is_measure(self) -> bool:
        return self.measure

    def get_buffer(self) -> Buffer:
        return self.buffer

    def get_max_size(self) -> int:
        """ggml_tallocr_max_size: the highest end (from base) of any allocation so far."""
        return self.max_size

    def is_own(self, tensor: Tensor) -> bool:
        """ggml_tallocr_is_own: whether `tensor`'s memory is in this allocator's buffer."""
        return tensor.buffer is self.buffer

    def holds(self, tensor: Tensor) -> bool:
        """Whether this allocator gave `tensor` memory that has not been freed (or reset) since."""
        return self._entry_of(tensor) is not None

    def largest_free_block(self) -> int:
        size = 0
        for block in self.free_blocks:
            size = max(size, block.size)
        return size

    def alloc_size(self, tensor: Tensor) -> int:
        """The bytes `alloc` takes for `tensor`: the buffer's alloc size, aligned."""
        return aligned_offset(None, self.buffer.get_alloc_size(tensor), self.alignment)

    def alloc(self, tensor: Tensor) -> None:
        """ggml_tallocr_alloc: give `tensor` memory from the best fitting free block."""
        check_instance(tensor, Tensor, "tallocr alloc: tensor")
        if self.buffer.freed:
            raise BufferFreedError(f"cannot allocate '{tensor.name}': buffer '{self.buffer.name}' "
                                   f"({self.buffer.size} bytes) of this allocator was freed")
        if tensor.view_src is not None:
            raise ArgumentError(f"cannot allocate view '{tensor.name}'; views get memory from their view_src "
                                f"'{tensor.view_src.name}'")
        if tensor.data is not None:
            if self.holds(tensor):
                where = f"allocated by this allocator at offset {tensor.data - self.base}"
            elif tensor.buffer is not None:
                where = f"in buffer '{tensor.buffer.name}'"
            else:
                where = "in no buffer"
            raise ArgumentError(f"cannot allocate '{tensor.name}': it already has memory (data {tensor.data:#x}, "
                                f"{where}); free it first")

        size = self.alloc_size(tensor)
        blocks = self.free_blocks
        n_free_blocks = len(blocks)

        max_avail = 0

        # find the best fitting free block besides the last block
        best_fit_block = -1
        best_fit_size = SIZE_MAX
        for i in range(n_free_blocks - 1):
            block = blocks[i]
            max_avail = max(max_avail, block.size)
            if block.size >= size and block.size <= best_fit_size:
                best_fit_block = i
                best_fit_size = block.size

        if best_fit_block == -1:
            # the last block is our last resort (a full buffer has no blocks at all)
            if n_free_blocks > 0:
                max_avail = max(max_avail, blocks[-1].size)
            if n_free_blocks > 0 and blocks[-1].size >= size:
                best_fit_block = n_free_blocks - 1
            else:
                raise OutOfMemoryError(
                    f"not enough space in buffer '{self.buffer.name}' for '{tensor.name}' "
                    f"(needed {size} bytes, largest free block {max_avail})"
                )

        log.debug("alloc: allocating %s (%d bytes) - block %d", tensor.name, size, best_fit_block)

        block = blocks[best_fit_block]
        addr = block.addr
        block.addr += size
        block.size -= size
        if block.size == 0:
            blocks.pop(best_fit_block)

        tensor.data = addr
        tensor.buffer = self.buffer
        self.allocated[id(tensor)] = (tensor, addr, size)
        if not self.measure:
            self.buffer.init_tensor(tensor)

        self.max_size = max(self.max_size, addr - self.base + size)

    def free_tensor(self, tensor: Tensor) -> None:
        """ggml_tallocr_free_tensor: give `tensor`'s bytes back (its `data` stays: the graph still reads it).
        Tensors of other buffers are ignored; a double or foreign free raises InvalidStateError."""
        check_instance(tensor, Tensor, "tallocr free_tensor: tensor")
        if tensor.data is None:
            raise NotAllocatedError(f"cannot free '{tensor.name}' in buffer '{self.buffer.name}': it has no memory "
                                    f"(data is None)")
        if not self.is_own(tensor):
            return
        if self.buffer.freed:
            raise BufferFreedError(f"cannot free '{tensor.name}': buffer '{self.buffer.name}' "
                                   f"({self.buffer.size} bytes) of this allocator was freed")
        entry = self._entry_of(tensor)
        if entry is None:
            raise InvalidStateError(self._not_held(tensor))
        owner, ptr, size = entry
        blocks = self.free_blocks
        n_free_blocks = len(blocks)
        log.debug("free: freeing %s at %#x (%d bytes) - n_free_blocks = %d", tensor.name, ptr, size, n_free_blocks)

        for i in range(n_free_blocks):
            block = blocks[i]
            if block.addr + block.size == ptr:
                self._free_tensor_hook(tensor, owner)
                block.size += size
                if i < n_free_blocks - 1 and block.addr + block.size == blocks[i + 1].addr:
                    block.size += blocks[i + 1].size
                    blocks.pop(i + 1)
                return
            if ptr + size == block.addr:
                self._free_tensor_hook(tensor, owner)
                block.addr = ptr
                block.size += size
                if i > 0 and blocks[i - 1].addr + blocks[i - 1].size == block.addr:
                    blocks[i - 1].size += block.size
                    blocks.pop(i)
                return

        # ggml asserts on its fixed array; checked here before any change
        if n_free_blocks >= self.max_free_blocks:
            raise LimitExceededError(
                f"cannot free '{tensor.name}' ({size} bytes at offset {ptr - self.base}) in buffer "
                f"'{self.buffer.name}': out of free blocks (MAX_FREE_BLOCKS = {self.max_free_blocks})"
            )
        self._free_tensor_hook(tensor, owner)
        insert_pos = 0
        while insert_pos < n_free_blocks and blocks[insert_pos].addr < ptr:
            insert_pos += 1
        blocks.insert(insert_pos, FreeBlock(ptr, size))

    def _entry_of(self, tensor: Tensor) -> tuple[Tensor, int, int] | None:
        """The allocation `tensor` frees: its own, or an in-place node's view source's (ggml frees by address)."""
        entry = self.allocated.get(id(tensor))
        if entry is not None and entry[0] is tensor:
            return entry
        src = tensor.view_src
        while src is not None:
            entry = self.allocated.get(id(src))
            if entry is not None and entry[0] is src:
                if entry[1] == tensor.data and entry[2] == self.alloc_size(tensor):
                    return entry
                return None
            src = src.view_src
        return None

    def _free_tensor_hook(self, tensor: Tensor, owner: Tensor) -> None:
        # after the merge (ggml: before), once the free cannot fail
        if not self.measure:
            self.buffer.free_tensor(tensor)
        del self.allocated[id(owner)]

    def _not_held(self, tensor: Tensor) -> str:
        """Why freeing `tensor` (of this buffer, not held) is refused: a double free, or not ours."""
        assert tensor.data is not None
        size = self.alloc_size(tensor)
        lo, hi = tensor.data, tensor.data + size
        what = (f"cannot free '{tensor.name}' ({size} bytes at offset {lo - self.base}) in buffer "
                f"'{self.buffer.name}'")
        for t, addr, n in self.allocated.values():
            if addr < hi and lo < addr + n:
                return (f"{what}: it is not allocated by this allocator (already freed?); its bytes now belong to "
                        f"'{t.name}' ({n} bytes at offset {addr - self.base})")
        for block in self.free_blocks:
            if block.addr < hi and lo < block.addr + block.size:
                return f"{what}: its bytes are free already (a double free, or the allocator was reset since)"
        return (f"{what}: it was not allocated by this allocator (another allocator over the same buffer, or "
                f"before reset())")

    def snapshot(self) -> tuple[list[tuple[int, int]], int, dict[int, tuple[Tensor, int, int]]]:
        """The free blocks, max_size and allocated tensors, to `restore` after a failed sequence of allocations."""
        return [(b.addr, b.size) for b in self.free_blocks], self.max_size, dict(self.allocated)

    def restore(self, state: tuple[list[tuple[int, int]], int, dict[int, tuple[Tensor, int, int]]]) -> None:
        blocks, max_size, allocated = state
        self.free_blocks = [FreeBlock(addr, size) for addr, size in blocks]
        self.max_size = max_size
        self.allocated = dict(allocated)

    def __repr__(self) -> str:
        kind = "measure" if self.measure else f"buffer '{self.buffer.name}'"
        return (f"TensorAllocator({kind}, alignment={self.alignment}, n_free_blocks={self.n_free_blocks}, "
                f"max_size={self.max_size})")
