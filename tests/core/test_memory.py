"""The host-memory registry finds the region holding an address, also when regions nest (a buffer made from a
pointer into a larger mapping, as the model loader makes one per backend out of one mapped file)."""

from __future__ import annotations

import numpy as np

from pyggml.core import memory


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
