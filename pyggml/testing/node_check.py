"""Which nodes of a model's graph pyggml's CPU computes differently from ggml's: as the graph runs (an eval callback),
each F32 node is computed again by libggml from pyggml's own inputs (`ggml_c`), repacked weights through libggml's
CPU_REPACK, and compared bit for bit. A difference is the node's kernel alone, not what came before it.

Command line::

    python -m pyggml.testing.node_check MODEL.gguf "a prompt" [--no-repack] [-c N_CTX]

prints each differing node (name, op, sources, largest difference relative to the node's largest value) and a
count per op and source type.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pyggml.backends.cpu.repack import is_repacked
from pyggml.backends.rpc.fallback import overlaps, span
from pyggml.core.tensor import GGMLOp, Tensor, is_view_op
from pyggml.core.types import GGMLType
from pyggml.ggml_backend.tensor_io import tensor_get_numpy

__all__ = ["NodeDiff", "check_tokens", "main"]


@dataclass(frozen=True)
class NodeDiff:
    """A node whose bits differ from libggml's on the same inputs."""

    name: str
    op: str
    sources: tuple[str, ...]  # "TYPE[ne0, ne1, ...]" of each source
    relative: float  # the largest difference over the node's largest magnitude

    @property
    def key(self) -> str:
        """The op and its first source's type, as the summary counts them."""
        return f"{self.op}/{self.sources[0].split('[')[0]}" if self.sources else self.op


def _in_place(node: Tensor) -> bool:
    """Whether the node's memory overlaps a source's (then the source's values are gone once it is computed)."""
    mine = span(node)
    return mine is not None and any(overlaps(span(s), [mine]) for s in node.src if s is not None)


def _ggml_value(node: Tensor, shape: tuple[int, ...]) -> np.ndarray:
    from pyggml.testing import ggml_c

    w, x = node.src[0], node.src[1]
    if node.op == GGMLOp.MUL_MAT and w is not None and x is not None and is_repacked(w):
        raw = tensor_get_numpy(w).reshape(w.ne[1], -1)
        product, _ = ggml_c.mul_mat_repacked(w.type, raw, tensor_get_numpy(x).reshape(-1, x.ne[0]))
        return product.reshape(shape)
    (raw,) = ggml_c.compute_nodes([node], [node], 1)
    return ggml_c.node_values(node, raw)


def check_tokens(model: object, ids: Sequence[int]) -> tuple[list[NodeDiff], Counter[str]]:
    """Evaluate `ids` on `model` (a pyggml.models.Model on the CPU backend) with every F32 node that does not
    overwrite its sources checked against libggml: the nodes that differ, and how many of each kind were checked."""
    differ: list[NodeDiff] = []
    checked: Counter[str] = Counter()

    def observe(node: Tensor, ask: bool) -> bool:
        if ask:
            return not is_view_op(node.op) and node.type == GGMLType.F32 and not _in_place(node)
        mine = tensor_get_numpy(node)
        theirs = _ggml_value(node, mine.shape)
        sources = tuple(f"{s.type.name}{list(s.ne)}" for s in node.src if s is not None)
        diff = NodeDiff(node.name, node.op.name, sources, 0.0)
        checked[diff.key] += 1
        if not np.array_equal(mine.view(np.uint32), theirs.view(np.uint32)):
            a, b = mine.astype(np.float64), theirs.astype(np.float64)
            scale = max(float(np.nanmax(np.abs(b))) if b.size else 0.0, 1e-30)
            differ.append(NodeDiff(node.name, node.op.name, sources, float(np.nanmax(np.abs(a - b))) / scale))
        return True

    runner = model.runner  # type: ignore[attr-defined]
    runner.set_eval_callback(observe)
    try:
        model.eval(list(ids))  # type: ignore[attr-defined]
    finally:
        runner.set_eval_callback(None)
    return differ, checked


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyggml.testing.node_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a GGUF file")
    parser.add_argument("prompt", help="the text evaluated (tokenized with BOS as the model adds it)")
    parser.add_argument("--no-repack", dest="repack", action="store_false", help="weights in plain buffers")
    parser.add_argument("-c", "--ctx", type=int, default=256, help="context cells (default 256)")
    args = parser.parse_args(argv)
    from pyggml.models import load

    model = load(args.model, n_ctx=args.ctx, n_threads=1, progress=False, repack=args.repack)
    try:
        differ, checked = check_tokens(model, model.tokenize(args.prompt))
    finally:
        model.free()
    for d in differ:
        print(f"{d.name:<24} {d.op:<12} {' x '.join(d.sources):<48} relative {d.relative:.2e}")
    counts = Counter(d.key for d in differ)
    print("differ: " + (", ".join(f"{k} {counts[k]}/{checked[k]}" for k in sorted(counts)) or "none"))
    print(f"checked: {sum(checked.values())} nodes ({', '.join(f'{k} {n}' for k, n in sorted(checked.items()))})")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
