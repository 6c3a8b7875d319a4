"""Write pyggml/data/iq_grids.npz: the lattice grids and sign tables of ggml's IQ1/IQ2/IQ3 types.

The tables are read from ggml-common.h of llama.cpp 0c1e570 (the `GGML_TABLE_BEGIN(type, name, size)` ...
`GGML_TABLE_END()` blocks) and stored with their C element types, so the file holds exactly what ggml compiles.
pyggml.core.iq_grids loads it.

Usage:
    python tools/make_iq_grids.py                      # the header of pyggml's llama.cpp cache (fetched if missing)
    python tools/make_iq_grids.py --header PATH/ggml-common.h
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

# the tables and their C element types (ggml-common.h)
TABLES = {
    "kmask_iq2xs": np.uint8,
    "ksigns_iq2xs": np.uint8,
    "iq2xxs_grid": np.uint64,
    "iq2xs_grid": np.uint64,
    "iq2s_grid": np.uint64,
    "iq3xxs_grid": np.uint32,
    "iq3s_grid": np.uint32,
    "iq1s_grid": np.uint64,
}
C_TYPES = {np.uint8: "uint8_t", np.uint32: "uint32_t", np.uint64: "uint64_t"}
DEFINES = {"NGRID_IQ1S": 2048}  # the one table size given by a macro
OUT = Path(__file__).resolve().parents[1] / "pyggml" / "data" / "iq_grids.npz"
HEADER_IN_SOURCE = "ggml/src/ggml-common.h"


def read_table(header: str, name: str, dtype: type) -> np.ndarray:
    """The values of table `name` in `header`'s text, checked against its declared C type and size."""
    m = re.search(rf"GGML_TABLE_BEGIN\((\w+),\s*{name},\s*(\w+)\)(.*?)GGML_TABLE_END\(\)", header, re.S)
    if m is None:
        raise SystemExit(f"make_iq_grids: no table {name} in the header")
    c_type, size, body = m.group(1), m.group(2), m.group(3)
    if c_type != C_TYPES[dtype]:
        raise SystemExit(f"make_iq_grids: {name} is {c_type} in the header, expected {C_TYPES[dtype]}")
    n = DEFINES[size] if size in DEFINES else int(size)
    values = [int(v, 0) for v in re.findall(r"0x[0-9a-fA-F]+|\d+", body)]
    if len(values) != n:
        raise SystemExit(f"make_iq_grids: {name} declares {n} values, the header lists {len(values)}")
    return np.array(values, dtype=dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--header", type=Path, help="ggml-common.h (default: the llama.cpp source pyggml caches)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    header = args.header
    if header is None:
        from pyggml.testing import llamacpp

        header = llamacpp.source_file(HEADER_IN_SOURCE)
    text = header.read_text(encoding="utf-8")
    tables = {name: read_table(text, name, dtype) for name, dtype in TABLES.items()}
    np.savez_compressed(args.out, **tables)
    print(f"wrote {args.out}: " + ", ".join(f"{k}[{v.size}]" for k, v in tables.items()))


if __name__ == "__main__":
    main()
