"""The weight cache: MUL_MAT weights converted once (dequantized, widened) and reused.

Policy (see `pyggml.backends.torch.kernels.matmul` for when MUL_MAT asks):
a converted weight is keyed by the bytes it came from and the form it was
converted to: (buffer, byte offset from the base, type, ne, nb, torch dtype).
It stays valid until any of those bytes change, and every change goes through
one of two places:

- the backend's hooks (tensor set, copies from other backends) call
  `TorchBuffer.note_write`, which drops the entries overlapping the range;
- a graph plan knows the byte ranges its nodes write and drops the entries
  overlapping them after each compute; a weight that the same plan writes is
  never taken from (or put into) the cache by that plan.

Freeing a buffer drops its entries. The cache holds at most `limit` bytes,
least recently used first out; an entry larger than the limit is not kept
(the weight is then converted on each use, which is correct, only slower).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pyggml.backends.torch.buffer import TorchBuffer

log = logging.getLogger("pyggml.backends.torch")

DEFAULT_WEIGHT_CACHE_BYTES = 4 << 30

# (id(buffer), offset, type, ne, nb, dtype)
CacheKey = tuple[int, int, int, tuple[int, ...], tuple[int, ...], torch.dtype]


class _Entry:
    __slots__ = ("buffer", "start", "end", "value", "nbytes")

    def __init__(self, buffer: TorchBuffer, start: int, end: int, value: torch.Tensor) -> None:
        self.buffer = buffer
        self.start = start
        self.end = end
        self.value = value
        self.nbytes = value.numel() * value.element_size()


class WeightCache:
    """Converted weights by the bytes they came from; see the module docstring."""

    def __init__(self, limit: int = DEFAULT_WEIGHT_CACHE_BYTES) -> None:
        self.limit = int(limit)
        self.entries: OrderedDict[CacheKey, _Entry] = OrderedDict()
        self.by_buffer: dict[int, set[CacheKey]] = {}
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: CacheKey, buffer: TorchBuffer, start: int, end: int,
            make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The cached value of `key`, or `make()` (kept if it fits) for bytes [start, end) of `buffer`."""
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
            self.hits += 1
            return entry.value
        self.misses += 1
        value = make()
        entry = _Entry(buffer, start, end, value)
        if entry.nbytes > self.limit:
            log.debug("weight cache: %d bytes for offset %d of '%s' exceed the limit %d; not kept",
                      entry.nbytes, start, buffer.name, self.limit)
            return value
        while self.nbytes + entry.nbytes > self.limit and self.entries:
            old_key = next(iter(self.entries))
            self._remove(old_key)
        self.entries[key] = entry
        self.by_buffer.setdefault(key[0], set()).add(key)
        self.nbytes += entry.nbytes
        return value

    def _remove(self, key: CacheKey) -> None:
        entry = self.entries.pop(key)
        self.nbytes -= entry.nbytes
        keys = self.by_buffer.get(key[0])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.by_buffer[key[0]]

    def has_buffer(self, buffer: TorchBuffer) -> bool:
        return id(buffer) in self.by_buffer

    def invalidate(self, buffer: TorchBuffer, start: int, end: int) -> None:
        """Drop the entries of `buffer` made from any byte in [start, end)."""
        keys = self.by_buffer.get(id(buffer))
        if not keys:
            return
        for key in [k for k in keys if self.entries[k].start < end and start < self.entries[k].end]:
            self._remove(key)

    def drop_buffer(self, buffer: TorchBuffer) -> None:
        for key in list(self.by_buffer.get(id(buffer), ())):
            self._remove(key)

    def clear(self) -> None:
        self.entries.clear()
        self.by_buffer.clear()
        self.nbytes = 0
