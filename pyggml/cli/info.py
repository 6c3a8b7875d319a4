"""`pyggml info MODEL.gguf`: what a GGUF file holds, without loading its weights.

The architecture and its hyper-parameters (`<arch>.*`), the tokenizer
(`tokenizer.ggml.*`: model, vocabulary size, BOS/EOS/UNK), the remaining
metadata, then every tensor with its type, shape (ggml's `ne`, innermost
first, as llama.cpp prints it) and size in the file; for a mixture of
experts, the experts and the parameters a token uses; for a hybrid, its
recurrent layers.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from pyggml.cli._common import add_debug, check_model_path, fmt_bytes, fmt_count, table

MAX_VALUE_CHARS = 80


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("info", help="show a GGUF file's architecture, hyper-parameters, tokenizer and tensors",
                       description="Show what a GGUF file holds: architecture, hyper-parameters, tokenizer, "
                                   "other metadata and every tensor with its type, shape and size.")
    p.add_argument("model", metavar="MODEL.gguf", help="the GGUF file")
    p.add_argument("--no-tensors", action="store_true", help="leave out the tensor table")
    add_debug(p)
    return p


def _short(value: Any) -> str:
    """A metadata value on one line: arrays by their length and first items, long strings cut."""
    if isinstance(value, (list, tuple)):
        head = ", ".join(_short(v) for v in value[:4])
        return f"[{len(value)} items: {head}{', ...' if len(value) > 4 else ''}]"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


def _file_type(code: Any) -> str:
    try:
        import gguf

        return f"{gguf.LlamaFileType(int(code)).name} ({int(code)})"
    except (ValueError, TypeError, AttributeError, ImportError):
        return str(code)


def _token(tokens: Any, tid: Any) -> str:
    if tid is None:
        return "none"
    # the file's values are shown as they are, whatever their type: info is how a bad file is inspected
    if isinstance(tid, int) and not isinstance(tid, bool) and isinstance(tokens, list) and 0 <= tid < len(tokens):
        return f"{tid} {tokens[tid]!r}"
    return _short(tid)


def _count(value: Any) -> str:
    """The length of an array value; its value when it is not an array."""
    return str(len(value)) if isinstance(value, list) else f"? (not an array: {_short(value)})"


def _experts_line(gf: Any, arch: Any, infos: list[Any]) -> str:
    """A mixture of experts' counts and the parameters one token goes through: every tensor but the experts'
    (`*_exps`, one slice per expert), and of those the share of the experts used; "" without experts."""
    n_expert = gf.get(f"{arch}.expert_count", None) if isinstance(arch, str) else None
    n_used = gf.get(f"{arch}.expert_used_count", None) if isinstance(arch, str) else None
    if not (isinstance(n_expert, int) and isinstance(n_used, int) and 0 < n_used <= n_expert):
        return ""
    active = sum(t.nelements() // n_expert * n_used if "_exps." in t.name else t.nelements() for t in infos)
    return f"experts: {n_expert}, {n_used} used a token; active parameters {fmt_count(active)} a token"


def _layers_line(gf: Any, arch: Any) -> str:
    """A hybrid model's layers: those of 0 KV heads in the per-layer head_count_kv array are recurrent (llama.cpp's
    is_recr); "" when every layer attends."""
    counts = gf.get(f"{arch}.attention.head_count_kv", None) if isinstance(arch, str) else None
    if not isinstance(counts, list) or 0 not in counts:
        return ""
    recurrent = [il for il, n in enumerate(counts) if n == 0]
    return (f"layers: {len(counts)}, {len(counts) - len(recurrent)} attention and {len(recurrent)} recurrent "
            f"({', '.join(str(il) for il in recurrent)})")


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout  # looked up per call: tests and callers swap sys.stdout
    from pyggml.gguf.reader import read_gguf

    path = check_model_path(args.model)
    gf = read_gguf(path, mode="r")
    try:
        _print_info(gf, path, args, out)
    finally:
        gf.close()
    return 0


def _print_info(gf: Any, path: Any, args: argparse.Namespace, out: TextIO) -> None:
    version = gf.fields["GGUF.version"].contents() if "GGUF.version" in gf.fields else "?"
    arch = gf.get("general.architecture", None)
    keys = gf.keys()
    shown: set[str] = set()

    def w(line: str = "") -> None:
        print(line, file=out)

    w(f"file:          {path} ({fmt_bytes(gf.file_size)}, GGUF v{version}, {len(gf.tensors)} tensors, "
      f"{len(keys)} metadata keys, alignment {gf.alignment})")
    w(f"architecture:  {arch if arch is not None else '(general.architecture missing)'}")
    for key, label in (("general.name", "name"), ("general.file_type", "file type")):
        if key in keys:
            value = gf.get(key)
            w(f"{label + ':':<14} {_file_type(value) if key == 'general.file_type' else value}")
    shown.update({"general.architecture", "general.name", "general.file_type"})

    if arch is not None:
        hp = [k for k in keys if k.startswith(f"{arch}.")]
        w()
        w("hyper-parameters:")
        width = max((len(k) - len(arch) - 1 for k in hp), default=0)
        for k in hp:
            w(f"  {k[len(arch) + 1:]:<{width}}  {_short(gf.get(k))}")
        shown.update(hp)

    w()
    w("tokenizer:")
    if "tokenizer.ggml.model" in keys:
        tokens = gf.get("tokenizer.ggml.tokens", None)
        model = gf.get("tokenizer.ggml.model")
        kind = {"llama": "SentencePiece", "gpt2": "GPT-2 BPE"}.get(model, "") if isinstance(model, str) else ""
        w(f"  model    {model if isinstance(model, str) else _short(model)}{f' ({kind})' if kind else ''}")
        w(f"  n_vocab  {_count(tokens) if tokens is not None else '?'}")
        for name in ("bos", "eos", "unknown", "padding"):
            key = f"tokenizer.ggml.{name}_token_id"
            if key in keys or name in ("bos", "eos"):
                w(f"  {name[:3]:<7}  {_token(tokens, gf.get(key, None))}")
        if "tokenizer.ggml.merges" in keys:
            w(f"  merges   {_count(gf.get('tokenizer.ggml.merges'))}")
        if "tokenizer.ggml.pre" in keys:
            w(f"  pre      {gf.get('tokenizer.ggml.pre')}")
        shown.update(k for k in keys if k.startswith("tokenizer.ggml."))
    else:
        w("  (none: tokenizer.ggml.model is missing)")

    rest = [k for k in keys if k not in shown]
    if rest:
        w()
        w("other metadata:")
        width = max(len(k) for k in rest)
        for k in rest:
            w(f"  {k:<{width}}  {_short(gf.get(k))}")

    infos = list(gf)
    n_params = sum(t.nelements() for t in infos)
    n_bytes = sum(t.nbytes for t in infos)
    w()
    w(f"tensors: {len(infos)}, {fmt_count(n_params)} parameters, {fmt_bytes(n_bytes)}")
    for line in (_layers_line(gf, arch), _experts_line(gf, arch, infos)):
        if line:
            w(line)
    if infos and not args.no_tensors:
        rows = [["#", "name", "type", "shape", "size"]]
        for i, t in enumerate(infos):
            rows.append([str(i), t.name, t.type.name, "[" + ", ".join(str(n) for n in t.ne) + "]",
                         fmt_bytes(t.nbytes)])
        for line in table(rows, right=(0, 4)):
            w(line)
