"""Tokenizer encode speed: pyggml's SentencePiece and GPT-2 BPE tokenizers beside sentencepiece and
HF tokenizers (both C++/Rust), on the same ~10 KB text, in the same run.

Both references train a BPE vocab (`--vocab` tokens) in memory on ~300 KB of English prose and code
(the docstrings and source of a few stdlib modules); pyggml's tokenizers are built from those vocabs
as llama.cpp's converters write them, and checked to give the same ids. The text encoded is a
separate ~10 KB slice. Medians over `--reps` runs after one warm-up; pyggml's word caches are
cleared before each run (cold), the reference's own caches are left as they are. The ratio is
pyggml's tokens/s over the reference's (< 1: pyggml is slower).

    python benchmarks/bench_tokenizer.py [--reps 5] [--vocab 4000] [--kb 10]
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import sys
from pathlib import Path

from timing import median_time

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))



def corpus_text() -> str:
    import argparse as m1
    import collections as m2
    import email.message as m3
    import json.decoder as m4
    import logging as m5
    import pathlib as m6
    import textwrap as m7
    import typing as m8

    return "\n".join(inspect.getsource(m) for m in (m1, m2, m3, m4, m5, m6, m7, m8))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=4000)
    ap.add_argument("--kb", type=int, default=10)
    args = ap.parse_args()

    import sentencepiece as spm
    import tokenizers as tk

    from pyggml.models.tokenizer import Tokenizer

    full = corpus_text()
    n = args.kb * 1024
    text = full[len(full) // 2: len(full) // 2 + n] + " naïve café 東京 😀 ∑"
    train = (full[: len(full) // 2] + full[len(full) // 2 + n:]).splitlines()

    # SentencePiece BPE with LLaMA's settings
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(train), model_writer=buf, model_type="bpe", vocab_size=args.vocab,
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, split_digits=True, allow_whitespace_only_pieces=True, num_threads=1,
        minloglevel=2, max_sentence_length=1 << 16)
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    types = [6 if sp.is_byte(i) else 3 if sp.is_control(i) else 2 if sp.is_unknown(i) else 1
             for i in range(sp.vocab_size())]
    spm_tok = Tokenizer.from_gguf_fields({
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(sp.vocab_size())],
        "tokenizer.ggml.scores": [sp.get_score(i) for i in range(sp.vocab_size())], "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": sp.bos_id(), "tokenizer.ggml.eos_token_id": sp.eos_id(),
        "tokenizer.ggml.unknown_token_id": sp.unk_id()})

    # GPT-2 byte-level BPE
    hf = tk.Tokenizer(tk.models.BPE())
    hf.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.train_from_iterator(train, tk.trainers.BpeTrainer(
        vocab_size=args.vocab, initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    model = json.loads(hf.to_str())["model"]
    tokens = [""] * len(model["vocab"])
    for t, i in model["vocab"].items():
        tokens[i] = t
    bpe_tok = Tokenizer.from_gguf_fields({
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]})

    ids = spm_tok.encode(text, add_bos=False)
    assert ids == sp.encode(text), "SentencePiece ids differ"
    bpe_ids = bpe_tok.encode(text)
    assert bpe_ids == hf.encode(text).ids, "BPE ids differ"

    def spm_cold() -> object:
        spm_tok._spm_cache.clear()
        return spm_tok.encode(text)

    def bpe_cold() -> object:
        bpe_tok._bpe_cache.clear()
        return bpe_tok.encode(text)

    rows = [
        ("SentencePiece", len(ids), median_time(spm_cold, args.reps),
         "sentencepiece", median_time(lambda: sp.encode(text), args.reps)),
        ("GPT-2 BPE", len(bpe_ids), median_time(bpe_cold, args.reps),
         "HF tokenizers", median_time(lambda: hf.encode(text).ids, args.reps)),
    ]
    print(f"encode {len(text.encode())} bytes of text, vocab {args.vocab}, median of {args.reps}")
    print(f"{'tokenizer':<14} {'tokens':>7} {'pyggml tok/s':>13} {'ms':>7}   {'reference':<14} {'tok/s':>11} "
          f"{'ms':>7} {'ratio':>7}")
    for name, n_tok, t, ref_name, t_ref in rows:
        print(f"{name:<14} {n_tok:>7} {n_tok / t:>13,.0f} {t * 1e3:>7.1f}   {ref_name:<14} {n_tok / t_ref:>11,.0f} "
              f"{t_ref * 1e3:>7.2f} {t_ref / t:>7.3f}")


if __name__ == "__main__":
    main()
