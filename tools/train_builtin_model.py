"""Train pyggml's built-in model: a small LLaMA that writes docstring-like English.

Why this exists: `pyggml run` without a model file needs something real to
run, small enough to ship inside the package (a few MB) and loadable by
llama.cpp too. Everything it learns from is already on the machine: the
documentation strings of Python's standard library (modules, classes,
functions) plus the language reference topics that `pydoc` ships in
`pydoc_data.topics`.

Steps:
1. collect and clean the text (paragraphs re-flowed into single lines,
   doctest and code lines dropped, duplicates removed);
2. train a SentencePiece BPE vocabulary with byte fallback, set up like
   LLaMA's (`<unk>`=0, `<s>`=1, `</s>`=2, identity normalization, digits
   split, dummy prefix);
3. train a `transformers.LlamaForCausalLM` (GQA, tied embeddings) for a fixed
   wall-clock budget on ONE thread (the machine is shared), with a cosine
   learning rate over the elapsed fraction of the budget;
4. write the GGUF with pyggml's converter (llama.cpp tensor names, Q/K row
   permutation, `llama.*` metadata) plus the SentencePiece vocabulary in
   llama.cpp's `tokenizer.ggml.*` fields.

Usage:
    python tools/train_builtin_model.py --minutes 20 --seed 0 --log /tmp/train_builtin.log
    python tools/train_builtin_model.py --rewrite   # no training: write the shipped file again (see `rewrite`)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import io
import logging
import math
import os
import pkgutil
import random
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("train_builtin")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "pyggml" / "data" / "builtin-llama.gguf"

# Modules whose import has side effects (opens a browser, prints, starts a GUI) or that are huge
# and hold test code rather than documentation.
SKIP_PREFIXES = ("antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "lib2to3",
                 "ensurepip", "__main__", "__phello__", "__hello__", "pydoc_data", "xxsubtype", "xxlimited",
                 "_xx", "_test", "msilib", "winreg", "winsound", "_winapi", "nt", "_msi")

# ---------------------------------------------------------------------------------------------- corpus


def _skip(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in SKIP_PREFIXES)


def _stdlib_module_names() -> list[str]:
    """Top-level stdlib modules and every submodule of the stdlib packages."""
    names = sorted(n for n in sys.stdlib_module_names if not _skip(n))
    out: list[str] = []
    for name in names:
        out.append(name)
        try:
            mod = importlib.import_module(name)
        except Exception:  # platform modules missing here (e.g. _winapi)
            continue
        path = getattr(mod, "__path__", None)
        if path is None:
            continue
        for info in pkgutil.walk_packages(path, prefix=name + ".", onerror=lambda _n: None):
            if not _skip(info.name) and ".test" not in info.name and "tests" not in info.name:
                out.append(info.name)
    return list(dict.fromkeys(out))


def _docstrings_of(mod: Any) -> list[str]:
    """The module's docstring and those of its public classes, functions and methods (defined there)."""
    docs: list[str] = []
    if isinstance(mod.__doc__, str):
        docs.append(mod.__doc__)
    modname = mod.__name__
    for attr, obj in sorted(vars(mod).items()):
        if attr.startswith("__"):
            continue
        if getattr(obj, "__module__", None) != modname:
            continue  # re-exported: counted where it is defined
        if inspect.isclass(obj) or inspect.isroutine(obj):
            doc = obj.__doc__ if isinstance(getattr(obj, "__doc__", None), str) else None
            if doc:
                docs.append(doc)
        if inspect.isclass(obj):
            for mname, member in sorted(vars(obj).items()):
                if mname.startswith("__") and mname != "__init__":
                    continue
                fn = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
                if isinstance(fn, property):
                    fn = fn.fget
                doc = getattr(fn, "__doc__", None)
                if isinstance(doc, str) and (inspect.isroutine(fn) or inspect.isdatadescriptor(member)):
                    docs.append(doc)
    return docs


_CODE_LINE = re.compile(r"^(>>>|\.\.\.|\$ |%|\s{4,}\S|[-=~^*#]{3,}\s*$|\|)")
_SIG_LINE = re.compile(r"^[\w.]+\(.*\)\s*(->.*)?$")  # "name(args) -> ret" signature lines of C functions


def clean_docstring(doc: str) -> list[str]:
    """Prose paragraphs of one docstring, each re-flowed onto one line.

    Doctests, indented code, reST underlines/tables and C signature lines are dropped:
    the model is meant to write prose, and code fragments would eat its tiny capacity."""
    text = inspect.cleandoc(doc).replace("\t", "    ")
    paragraphs: list[str] = []
    current: list[str] = []
    in_code = False
    for raw in text.split("\n") + [""]:
        line = raw.rstrip()
        if not line.strip():
            if current:
                paragraphs.append(" ".join(current))
            current = []
            in_code = False
            continue
        if in_code or _CODE_LINE.match(line) or (not current and _SIG_LINE.match(line.strip())):
            if current:
                paragraphs.append(" ".join(current))
            current = []
            in_code = line.lstrip().startswith(">>>") or in_code
            continue
        current.append(line.strip())
    out = []
    for p in paragraphs:
        p = re.sub(r"\s+", " ", p).strip()
        p = re.sub(r":(func|meth|class|mod|attr|data|exc|const|term|ref|pep|rfc|keyword|envvar):`~?([^`]*)`",
                   r"\2", p)
        p = p.replace("``", "'")
        if len(p) < 30 or sum(c.isalpha() for c in p) < 0.6 * len(p) or not p.isascii():
            continue
        out.append(p)
    return out


def collect_corpus() -> list[str]:
    """Documents (one list item each, paragraphs joined by '\\n') from the stdlib's docstrings and
    pydoc's topics, deduplicated by paragraph."""
    seen: set[str] = set()
    documents: list[str] = []

    def add(doc: str) -> None:
        paras = [p for p in clean_docstring(doc) if hashlib.sha1(p.encode()).hexdigest() not in seen]
        for p in paras:
            seen.add(hashlib.sha1(p.encode()).hexdigest())
        if paras:
            documents.append("\n".join(paras))

    warnings.simplefilter("ignore")
    names = _stdlib_module_names()
    n_mod = 0
    for name in names:
        try:
            sink = io.StringIO()
            old = sys.stdout, sys.stderr
            sys.stdout = sys.stderr = sink
            try:
                mod = importlib.import_module(name)
            finally:
                sys.stdout, sys.stderr = old
        except BaseException:
            continue
        n_mod += 1
        for doc in _docstrings_of(mod):
            add(doc)
    try:
        from pydoc_data.topics import topics

        for key in sorted(topics):
            add(topics[key])
    except ImportError:
        pass
    log.info("corpus: %d modules imported, %d documents, %d characters", n_mod, len(documents),
             sum(len(d) for d in documents))
    return documents


# ------------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(documents: list[str], work: Path, vocab_size: int, seed: int) -> Any:
    """A SentencePiece BPE model with LLaMA's settings (byte fallback, identity normalization)."""
    import sentencepiece as spm

    text_path = work / "corpus.txt"
    with open(text_path, "w", encoding="utf-8") as f:
        for d in documents:
            for p in d.split("\n"):
                f.write(p + "\n")
    prefix = work / "sp"
    if hasattr(spm, "set_random_generator_seed"):
        spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        input=str(text_path), model_prefix=str(prefix), vocab_size=vocab_size, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, split_digits=True, add_dummy_prefix=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, max_sentence_length=1 << 16, minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_file=str(prefix) + ".model")


def gguf_vocab(sp: Any) -> dict[str, Any]:
    """llama.cpp's `tokenizer.ggml.*` fields of a SentencePiece model (as its convert script writes them)."""
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(float(sp.get_score(i)))
        if sp.is_unknown(i):
            t = 2
        elif sp.is_control(i):
            t = 3
        elif sp.is_byte(i):
            t = 6
        elif sp.is_unused(i):
            t = 5
        else:
            t = 1
        types.append(t)
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": sp.bos_id(),
        "tokenizer.ggml.eos_token_id": sp.eos_id(),
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
    }


def encode_corpus(sp: Any, documents: list[str]) -> np.ndarray:
    """Every document as <s> tokens </s>, concatenated; paragraphs keep their '\\n' (byte token)."""
    ids: list[int] = []
    for d in documents:
        ids.append(sp.bos_id())
        ids.extend(sp.encode(d))
        ids.append(sp.eos_id())
    return np.asarray(ids, dtype=np.int32)


# ------------------------------------------------------------------------------------------- rewriting


def rewrite(path: Path) -> None:
    """Write the GGUF file `path` again with pyggml's current writer: the same metadata values in the same order
    and the same tensor bytes, every key with the GGUF type llama.cpp reads it as.

    The built-in model was trained when the writer still wrote `tokenizer.ggml.token_type` as a UINT32 array
    (llama.cpp refuses it: "invalid gguf type for tokenizer.ggml.token_type"); rewriting it gives an INT32
    array with the weights and the vocab unchanged, without training again."""
    sys.path.insert(0, str(REPO))
    from pyggml.gguf.reader import read_gguf
    from pyggml.gguf.writer import RawTensor, write_gguf

    gf = read_gguf(path, mode="r")
    meta = {key: gf.get(key) for key in gf.keys()}
    tensors = {info.name: RawTensor(np.array(gf.tensor_bytes(info.name)), info.type, info.ne) for info in gf}
    arch = gf.architecture
    gf.close()
    tmp = path.with_name(path.name + ".tmp")
    write_gguf(tmp, arch, meta, tensors)  # a general.alignment key, if any, is in `meta`
    os.replace(tmp, path)
    log.info("rewrote %s (%.2f MB)", path, os.path.getsize(path) / 1e6)


# -------------------------------------------------------------------------------------------- training


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=20.0, help="wall-clock training budget (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--work", type=Path, default=Path("/tmp/pyggml_builtin_train"),
                    help="scratch directory (corpus, tokenizer model, checkpoint)")
    ap.add_argument("--log", type=Path, default=None, help="also log to this file")
    ap.add_argument("--vocab", type=int, default=2000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ff", type=int, default=688)
    ap.add_argument("--seq", type=int, default=256, help="training sequence length (= llama.context_length)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--type", default="F16", help="GGUF type of the 2-D weights (F16, Q8_0, F32)")
    ap.add_argument("--bench-steps", type=int, default=0, help="only time this many steps and exit")
    ap.add_argument("--rewrite", action="store_true",
                    help="no training: write --out again with the current writer (same weights and vocab)")
    args = ap.parse_args(argv)

    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if args.log:
        handlers.append(logging.FileHandler(args.log, mode="w"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", handlers=handlers, force=True)
    if args.rewrite:
        rewrite(args.out)
        return 0

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    args.work.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    documents = collect_corpus()
    rng = random.Random(args.seed)
    rng.shuffle(documents)
    sp = train_tokenizer(documents, args.work, args.vocab, args.seed)
    n_val_docs = max(1, len(documents) // 50)
    train_ids = encode_corpus(sp, documents[n_val_docs:])
    val_ids = encode_corpus(sp, documents[:n_val_docs])
    log.info("tokenizer: %d pieces; %d train tokens, %d validation tokens (%.2f chars/token); %.1fs",
             sp.get_piece_size(), len(train_ids), len(val_ids),
             sum(len(d) for d in documents) / (len(train_ids) + len(val_ids)), time.perf_counter() - t0)

    config = LlamaConfig(
        vocab_size=sp.get_piece_size(), hidden_size=args.dim, intermediate_size=args.ff,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.seq, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
        bos_token_id=sp.bos_id(), eos_token_id=sp.eos_id(), attention_bias=False, mlp_bias=False,
    )
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: dim %d, %d layers, %d heads (%d kv), ff %d, vocab %d, seq %d: %.2fM parameters",
             args.dim, args.layers, args.heads, args.kv_heads, args.ff, config.vocab_size, args.seq, n_params / 1e6)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    data = torch.from_numpy(train_ids.astype(np.int64))
    val = torch.from_numpy(val_ids.astype(np.int64))
    gen = torch.Generator().manual_seed(args.seed)

    def batch_of(src: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
        starts = torch.randint(0, len(src) - args.seq - 1, (n,), generator=g)
        return torch.stack([src[s: s + args.seq] for s in starts.tolist()])

    val_gen = torch.Generator().manual_seed(args.seed + 1)
    val_batches = [batch_of(val, args.batch, val_gen) for _ in range(4)]

    def val_loss() -> float:
        model.eval()
        with torch.no_grad():
            losses = [model(input_ids=b, labels=b).loss.item() for b in val_batches]
        model.train()
        return float(np.mean(losses))

    budget = args.minutes * 60.0
    warmup = 100
    step = 0
    t_start = time.perf_counter()
    last_log = t_start
    last_eval = t_start
    ema = None
    model.train()
    while True:
        elapsed = time.perf_counter() - t_start
        if args.bench_steps and step >= args.bench_steps:
            log.info("bench: %d steps in %.1fs = %.0f tokens/s", step, elapsed, step * args.batch * args.seq / elapsed)
            return 0
        if not args.bench_steps and elapsed >= budget:
            break
        frac = min(1.0, elapsed / budget)
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for group in opt.param_groups:
            group["lr"] = lr
        x = batch_of(data, args.batch, gen)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        now = time.perf_counter()
        if now - last_log >= 30:
            log.info("step %5d  %6.1f min  loss %.3f (ema %.3f)  lr %.2e  %.0f tokens/s", step, (now - t_start) / 60,
                     loss.item(), ema, lr, step * args.batch * args.seq / (now - t_start))
            last_log = now
        if now - last_eval >= 180:
            log.info("step %5d  validation loss %.3f", step, val_loss())
            last_eval = now
    train_time = time.perf_counter() - t_start
    final_val = val_loss()
    log.info("done: %d steps, %.1f min, %d tokens seen (%.2f epochs), train loss (ema) %.3f, validation loss %.3f",
             step, train_time / 60, step * args.batch * args.seq, step * args.batch * args.seq / len(train_ids),
             ema, final_val)

    sys.path.insert(0, str(REPO))
    from pyggml.models.convert import write_llama_gguf

    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    hf = config.to_dict()
    hf["name"] = "pyggml-builtin"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_llama_gguf(args.out, hf, state, type=args.type, vocab=gguf_vocab(sp))
    torch.save({"config": config.to_dict(), "state": model.state_dict()}, args.work / "model.pt")
    log.info("wrote %s (%.2f MB)", args.out, os.path.getsize(args.out) / 1e6)
    model.eval()  # samples for the log: what the shipped weights write (greedy)
    for prompt in ["Return the", "The module", "This function"]:
        ids = torch.tensor([[sp.bos_id(), *sp.encode(prompt)]])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=48, do_sample=False, repetition_penalty=1.1)
        log.info("sample (greedy) %r -> %r", prompt, sp.decode(out[0].tolist()[1:]))

    return 0


if __name__ == "__main__":
    sys.exit(main())
