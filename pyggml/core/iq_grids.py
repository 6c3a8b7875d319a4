"""The lattice grids and sign tables of ggml's IQ1/IQ2/IQ3 types (ggml-common.h), loaded from pyggml/data.

tools/make_iq_grids.py writes the file from ggml-common.h. Each grid entry is a point of 8 (IQ2, IQ1) or 4 (IQ3)
byte coordinates, packed in one uint64/uint32 in C and read by ggml as the bytes of that integer in memory (little
endian): here each grid is that byte view, one row per entry.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pyggml.core.errors import GGMLError

GRIDS_FILE = Path(__file__).resolve().parents[1] / "data" / "iq_grids.npz"


def _load() -> dict[str, np.ndarray]:
    try:
        with np.load(GRIDS_FILE) as f:
            return {k: f[k] for k in f.files}
    except OSError as e:
        raise GGMLError(f"iq_grids: cannot read {GRIDS_FILE} (written by tools/make_iq_grids.py): {e}") from e


def _points(table: np.ndarray, dtype: type) -> np.ndarray:
    """A packed grid as its entries' bytes (entries, bytes per entry), read little-endian as ggml reads them."""
    packed = table.astype(table.dtype.newbyteorder("<"))
    return np.ascontiguousarray(packed.view(np.uint8).reshape(table.size, table.dtype.itemsize).view(dtype))


_TABLES = _load()
KMASK_IQ2XS: np.ndarray = _TABLES["kmask_iq2xs"]  # bit j of a sign byte
KSIGNS_IQ2XS: np.ndarray = _TABLES["ksigns_iq2xs"]  # 7 sign bits -> 8 (the eighth makes an even count)
IQ2XXS_GRID: np.ndarray = _points(_TABLES["iq2xxs_grid"], np.uint8)  # (256, 8)
IQ2XS_GRID: np.ndarray = _points(_TABLES["iq2xs_grid"], np.uint8)  # (512, 8)
IQ2S_GRID: np.ndarray = _points(_TABLES["iq2s_grid"], np.uint8)  # (1024, 8)
IQ3XXS_GRID: np.ndarray = _points(_TABLES["iq3xxs_grid"], np.uint8)  # (256, 4)
IQ3S_GRID: np.ndarray = _points(_TABLES["iq3s_grid"], np.uint8)  # (512, 4)
IQ1S_GRID: np.ndarray = _points(_TABLES["iq1s_grid"], np.int8)  # (2048, 8), values -1, 0, 1
