"""Random blocks of the types pyggml reads and does not write (the lattice IQ types): test inputs for their
to_float, GET_ROWS, CPY and MUL_MAT, where ggml's own tests would quantize (ggml_quantize_chunk, which needs
ggml_quantize_init's tables and, for some, an importance matrix).

Random bytes are valid blocks of these types (every grid index, sign and scale bit pattern decodes); only the
fp16 scale is drawn from a range, so values stay finite and of the size of quantized unit-range weights.
"""

from __future__ import annotations

import numpy as np

from pyggml.core.quants import BLOCK_DTYPES
from pyggml.core.types import TYPE_TRAITS, GGMLType

# IQ1_M has no d field: its fp16 d is the top nibble of each of its four u16 scales (ggml's iq1m_scale_t)
_SPREAD_D = {GGMLType.IQ1_M: "scales"}


def random_blocks(t: GGMLType, shape: tuple[int, ...], rng: np.random.Generator, d_max: float = 0.05) -> np.ndarray:
    """uint8 rows (*shape[:-1], bytes) of random blocks of `t` holding shape[-1] weights, |d| < d_max."""
    tr = TYPE_TRAITS[t]
    n_blocks = int(np.prod(shape)) // tr.blck_size
    raw = rng.integers(0, 256, (n_blocks, tr.type_size), dtype=np.uint8)
    fields = raw.view(BLOCK_DTYPES[t])[:, 0]
    d = rng.uniform(-d_max, d_max, n_blocks).astype("<f2")
    if t in _SPREAD_D:
        scales = fields[_SPREAD_D[t]]
        bits = d.view("<u2").astype(np.uint16)
        for k in range(4):
            scales[:, k] = (scales[:, k] & 0x0FFF) | (((bits >> (4 * k)) & 15) << 12)
    else:
        fields["d"] = d
    return raw.reshape(*shape[:-1], shape[-1] // tr.blck_size * tr.type_size)
