"""The host-memory registry finds the region holding an address, also when regions nest (a buffer made from a
pointer into a larger mapping, as the model loader makes one per backend out of one mapped file)."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.core import memory
from pyggml.core.errors import OutOfBoundsError
from pyggml.core.types import GGMLType


def test_nested_regions_are_found_whatever_comes_after_them() -> None:
    big = np.zeros(1000, np.uint8)
    inner, later = big[100:200], big[500:600]  # registered apart, inside big; `later` sorts after `inner`
    base = memory.address_of(big)
    for a in (big, inner, later):
        memory.register(a)
    try:
        found = memory.find(base + 300, 8)  # in big, past inner's end, before later's base
        assert found is not None and found[0] is big and found[1] == 300
        arr, off = memory.find(base + 150, 8) or (None, -1)
        assert arr is inner and off == 50  # the innermost region
        arr, off = memory.find(base + 195, 10) or (None, -1)
        assert arr is big and off == 195  # runs past inner's end: only big holds all of it
        assert memory.find(base + 995, 10) is None  # runs past big's end
        memory.unregister(inner)
        arr, off = memory.find(base + 150, 8) or (None, -1)
        assert arr is big and off == 150
    finally:
        for a in (later, big):
            memory.unregister(a)
    assert memory.find(base + 300) is None


def test_an_empty_tensor_views_no_memory_wherever_it_is() -> None:
    """ggml places a tensor of 0 bytes at any offset, a buffer's end too: its view is empty, one byte further
    is refused."""
    buf = np.zeros(64, np.uint8)
    memory.register(buf)
    try:
        end = memory.address_of(buf) + 64
        empty = memory.view(end, GGMLType.F32, [0, 3, 1, 1], [4, 0, 0, 0], "node_0")
        assert empty.size == 0 and empty.shape == (1, 1, 3, 0)
        with pytest.raises(OutOfBoundsError, match="'one': 4 bytes"):
            memory.view(end, GGMLType.F32, [1, 1, 1, 1], [4, 4, 4, 4], "one")
    finally:
        memory.unregister(buf)
