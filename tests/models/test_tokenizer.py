"""Tokenizers against their references: a tiny SentencePiece model (sentencepiece) and a tiny
byte-level BPE (HF tokenizers), both trained here in memory on a small corpus, their vocabs turned
into GGUF metadata as llama.cpp's converters do."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pytest

from pyggml.core.errors import ArgumentError, GGMLError, GGUFError
from pyggml.models.tokenizer import (
    BYTE_ENCODER,
    TOKEN_TYPE_BYTE,
    TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_NORMAL,
    TOKEN_TYPE_UNKNOWN,
    TOKEN_TYPE_UNUSED,
    TOKEN_TYPE_USER_DEFINED,
    Tokenizer,
    UnknownPreTokenizerError,
    pre_tokenizer,
)

WORDS = ("the quick brown fox jumps over lazy dog and cat were running in park while it rained heavily on "
         "monday morning café naïve résumé über straße 東京 日本語 数字 😀 🚀 hello world 12345 3.14159 "
         "don't can't it's we'll I'm HELLO").split()


def training_sentences(n: int = 1500, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 15))) for _ in range(n)]
    return out + ["  leading spaces", "trailing  ", "tabs\there\tand\nnewlines", "digits 0123456789 9876",
                  "punct: (a) [b] {c} !? ... -- 'q' \"dq\""]


# Checked against both references: whitespace runs, leading/trailing spaces, newlines, tabs, CR,
# digits, punctuation, accents, CJK, emoji; characters the training text never had (∑, Ω, 𝔘𝔫𝔦,
# のテキスト, 🎉, ...) exercise byte fallback (SentencePiece) and bare byte tokens (BPE).
CORPUS = [
    "Hello world",
    "hello",
    "  two leading spaces",
    "trailing   ",
    "   ",
    " ",
    "\n",
    "x",
    "a\tb\n\nc  \n d",
    "\t\ttabs  and    runs     of spaces\n\n\n",
    "new\r\nline\rcr",
    "1234567 89.5% 3.14159 0x1F 1,000,000",
    "don't stop!!! (really?) [yes] {no} <tag> a+b=c; x/y",
    "I'M HERE 'S 'll we've you'd",
    "café naïve résumé über straße",
    "café naïve 東京 😀🚀 ü",
    "ÆØÅ ∑ Ω 𝔘𝔫𝔦",
    "日本語のテキスト",
    "emoji🎉party 👩‍👩‍👧 ✓",
    "\u00a0nbsp\u2009thin\u3000ideographic",
    "mixed\u00e9\u0301 combining",
    "the quick brown fox jumps over the lazy dog, 42 times.",
]


# --- SentencePiece ---------------------------------------------------------------------------------

def sentencepiece_fields(sp: Any) -> dict[str, Any]:
    """The GGUF tokenizer metadata of a SentencePieceProcessor, as llama.cpp's convert.py writes it
    (SentencePieceVocab.sentencepiece_tokens: piece, score and type of every id)."""
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        t = TOKEN_TYPE_NORMAL
        if sp.is_unknown(i):
            t = TOKEN_TYPE_UNKNOWN
        if sp.is_control(i):
            t = TOKEN_TYPE_CONTROL
        if sp.is_unused(i):
            t = TOKEN_TYPE_UNUSED
        if sp.is_byte(i):
            t = TOKEN_TYPE_BYTE
        types.append(t)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": sp.bos_id(),
            "tokenizer.ggml.eos_token_id": sp.eos_id(), "tokenizer.ggml.unknown_token_id": sp.unk_id()}


def train_sentencepiece(vocab_size: int, byte_fallback: bool) -> Any:
    """A tiny SentencePiece BPE model with LLaMA's settings (identity normalization, whitespace kept,
    dummy prefix, digits split).

    model_type=bpe because llama.cpp's SPM tokenizer is SentencePiece's BPE algorithm (bigram merges
    by score, resegmentation): it equals sentencepiece's BPE encoder. A unigram model is encoded by
    sentencepiece with Viterbi over all pieces, while llama.cpp can only reach a piece through a chain
    of bigram merges whose intermediate pieces are in the vocab; unigram vocabs do not keep those
    intermediates, so the two disagree on most words (LLaMA's own tokenizer is BPE)."""
    spm = pytest.importorskip("sentencepiece")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_sentences()), model_writer=model, model_type="bpe",
        vocab_size=vocab_size, byte_fallback=byte_fallback, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, split_digits=True, character_coverage=0.995,
        allow_whitespace_only_pieces=True, num_threads=1, minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


@pytest.fixture(scope="module")
def sp_pair() -> tuple[Any, Tokenizer]:
    sp = train_sentencepiece(400, byte_fallback=True)
    return sp, Tokenizer.from_gguf_fields(sentencepiece_fields(sp))


@pytest.mark.parametrize("text", CORPUS)
def test_spm_encode_equals_sentencepiece(sp_pair: tuple[Any, Tokenizer], text: str) -> None:
    sp, tok = sp_pair
    ids = tok.encode(text, add_bos=False)
    assert ids == sp.encode(text)
    assert tok.encode(text) == [sp.bos_id()] + ids
    assert tok.decode(ids) == text  # byte fallback restores every character
    assert tok.decode([sp.bos_id()] + ids) == text
    assert tok.decode(ids) == sp.decode(ids)


def test_spm_corpus_exercises_byte_fallback_and_merges(sp_pair: tuple[Any, Tokenizer]) -> None:
    sp, tok = sp_pair
    all_ids = [i for text in CORPUS for i in tok.encode(text, add_bos=False)]
    byte_ids = {i for i in all_ids if tok.token_types[i] == TOKEN_TYPE_BYTE}
    assert len(byte_ids) >= 10  # CJK, emoji and the rare symbols went through <0xXX> tokens
    assert any(len(tok.tokens[i]) >= 4 for i in all_ids)  # and words were merged into long pieces
    ids = tok.encode("∑", add_bos=False)  # U+2211 is not in the training text: "▁" + its 3 UTF-8 bytes
    assert [tok.tokens[i] for i in ids] == ["\u2581", "<0xE2>", "<0x88>", "<0x91>"]


def test_spm_training_sentences_and_long_text(sp_pair: tuple[Any, Tokenizer]) -> None:
    sp, tok = sp_pair
    sents = training_sentences(150, seed=1)
    for s in sents:
        assert tok.encode(s, add_bos=False) == sp.encode(s), s
    text = "\n".join(sents + CORPUS)
    assert tok.encode(text, add_bos=False) == sp.encode(text)
    assert tok.decode(tok.encode(text)) == text


def test_spm_cut_into_pieces_equals_one_run(sp_pair: tuple[Any, Tokenizer]) -> None:
    """encode cuts the text where no token can span and caches the pieces; the merge loop over the
    whole text at once (llama.cpp's way) gives the same ids, cold and warm cache."""
    _, tok = sp_pair
    text = "\n".join(training_sentences(60, seed=2) + CORPUS)
    whole = tok._spm_segment((" " + text).replace(" ", "\u2581"))
    tok._spm_cache.clear()
    assert tok.encode(text, add_bos=False) == whole
    assert tok.encode(text, add_bos=False) == whole
    assert len(tok._spm_cache) > 50  # it was cut into many pieces


def test_spm_without_byte_tokens_uses_unk() -> None:
    """A vocab without <0xXX> tokens: an unknown run becomes one UNK, as sentencepiece does (decoded as
    llama.cpp prints UNK: nothing, or its text with special=True)."""
    sp = train_sentencepiece(200, byte_fallback=False)
    tok = Tokenizer.from_gguf_fields(sentencepiece_fields(sp))
    assert all(tok._byte_ids[b] is None for b in range(0x80, 0x100))  # no <0xXX>; ASCII falls back to itself
    n_unk = 0
    for text in CORPUS:
        ids = tok.encode(text, add_bos=False)
        assert ids == sp.encode(text), text
        n_unk += ids.count(sp.unk_id())
    assert n_unk >= 5
    ids = tok.encode("日本語のテキスト", add_bos=False)
    assert tok.decode(ids) == "日本語"  # llama.cpp prints UNK only when asked for special tokens
    assert tok.decode(ids, special=True) == "日本語<unk>"


def test_spm_add_space_prefix_and_add_bos_flags(sp_pair: tuple[Any, Tokenizer]) -> None:
    sp, _ = sp_pair
    fields = sentencepiece_fields(sp)
    plain = Tokenizer.from_gguf_fields(fields)
    tok = Tokenizer.from_gguf_fields({**fields, "tokenizer.ggml.add_space_prefix": False,
                                      "tokenizer.ggml.add_bos_token": False})
    for text in CORPUS:
        assert tok.encode(" " + text) == plain.encode(text, add_bos=False)  # the prefix is just a space
    assert tok.decode(tok.encode(" hello")) == " hello"  # no prefix added, none stripped
    assert tok.encode("hello") == tok.encode("hello", add_bos=False)  # the file says: no BOS
    assert not tok.tokens[tok.encode("hello")[0]].startswith("\u2581")
    assert plain.encode("") == [plain.bos_id] and plain.encode("", add_bos=False) == []


def test_spm_token_to_piece(sp_pair: tuple[Any, Tokenizer]) -> None:
    sp, tok = sp_pair
    assert tok.token_to_piece(tok.bos_id) == ""  # control tokens print nothing
    assert tok.token_to_piece(tok.unk_id) == "" and tok.token_to_piece(tok.unk_id, special=True) == "<unk>"
    assert tok.token_to_piece(tok.bos_id, special=True) == "<s>"
    assert tok.token_to_bytes(tok.token_to_id["<0xE2>"]) == b"\xe2"
    word = next(i for i, t in enumerate(tok.tokens) if t.startswith("\u2581") and len(t) > 3)
    assert tok.token_to_piece(word) == " " + tok.tokens[word][1:]
    # streaming by pieces keeps the spaces between words; decode drops only the prefix space
    ids = tok.encode("hello world")
    assert "".join(tok.token_to_piece(i) for i in ids) == " hello world"
    assert tok.decode(ids) == "hello world"
    with pytest.raises(ArgumentError, match=r"token id 400 is out of the vocabulary \(n_vocab 400\)"):
        tok.decode([1, 400])
    with pytest.raises(ArgumentError, match="token id -1"):
        tok.token_to_piece(-1)


# --- GPT-2 BPE -------------------------------------------------------------------------------------

def train_bpe(vocab_size: int = 500) -> tuple[Any, dict[str, Any]]:
    """A tiny GPT-2-style byte-level BPE (HF tokenizers) and its GGUF metadata as llama.cpp's HF
    converter writes it: tokens by id, "left right" merges by rank, added tokens as CONTROL."""
    tk = pytest.importorskip("tokenizers")
    hf = tk.Tokenizer(tk.models.BPE())
    hf.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                     special_tokens=["<|endoftext|>"], show_progress=False)
    hf.train_from_iterator(training_sentences(), trainer)
    model = json.loads(hf.to_str())["model"]
    tokens = [""] * len(model["vocab"])
    for text, i in model["vocab"].items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    eot = tokens.index("<|endoftext|>")
    fields = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": tokens,
              "tokenizer.ggml.token_type": [TOKEN_TYPE_CONTROL if i == eot else TOKEN_TYPE_NORMAL
                                            for i in range(len(tokens))],
              "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": eot,
              "tokenizer.ggml.eos_token_id": eot}
    return hf, fields


@pytest.fixture(scope="module")
def bpe_pair() -> tuple[Any, Tokenizer]:
    hf, fields = train_bpe()
    return hf, Tokenizer.from_gguf_fields(fields)


@pytest.mark.parametrize("text", CORPUS)
def test_bpe_encode_equals_hf_tokenizers(bpe_pair: tuple[Any, Tokenizer], text: str) -> None:
    hf, tok = bpe_pair
    ids = tok.encode(text)  # a BPE vocab adds no BOS unless the file says so (llama_should_add_bos_token)
    assert ids == hf.encode(text).ids
    assert tok.decode(ids) == text == hf.decode(ids)


def test_bpe_training_sentences_and_long_text(bpe_pair: tuple[Any, Tokenizer]) -> None:
    hf, tok = bpe_pair
    sents = training_sentences(150, seed=1)
    text = "\n".join(sents + CORPUS)
    ids = tok.encode(text)
    assert ids == hf.encode(text).ids
    assert tok.decode(ids, clean_spaces=False) == text
    # llama_detokenize's clean_spaces ("gpt-2" sets it): no space before "!?" and "..."
    assert tok.decode(ids) == text.replace(" !?", "!?").replace(" ...", "...")
    assert any(len(tok.tokens[i]) >= 5 for i in ids)  # merges happened
    # characters the training never saw stay as their byte tokens
    assert [tok.tokens[i] for i in tok.encode("∑")] == [BYTE_ENCODER[b] for b in "∑".encode()]


def test_bpe_bos_flag_and_pieces(bpe_pair: tuple[Any, Tokenizer]) -> None:
    hf, _ = bpe_pair
    _, fields = train_bpe()
    tok = Tokenizer.from_gguf_fields({**fields, "tokenizer.ggml.add_bos_token": True})
    eot = tok.token_to_id["<|endoftext|>"]
    assert tok.bos_id == tok.eos_id == eot
    assert tok.encode("hi there") == [eot] + hf.encode("hi there").ids
    assert tok.decode(tok.encode("hi there")) == "hi there"  # BPE decode keeps leading spaces as they are
    assert tok.decode(tok.encode(" hi")) == " hi"
    assert tok.token_to_piece(eot) == ""
    assert tok.token_to_piece(tok.token_to_id["\u0120the"]) == " the"  # Ġ is the space byte
    assert tok.token_to_bytes(tok.token_to_id[BYTE_ENCODER[0xE2]]) == b"\xe2"


# --- from GGUF and errors ------------------------------------------------------------------------

def test_from_gguf_file_and_gguf_reader(tmp_path: Path, sp_pair: tuple[Any, Tokenizer]) -> None:
    import gguf
    import numpy as np

    from pyggml.gguf.reader import read_gguf
    from pyggml.gguf.writer import write_gguf

    sp, ref = sp_pair
    _, bpe_fields = train_bpe()
    for name, fields in (("spm", sentencepiece_fields(sp)), ("bpe", bpe_fields)):
        path = tmp_path / f"{name}.gguf"
        write_gguf(path, "llama", fields, {"x": np.zeros(32, np.float32)})
        want = Tokenizer.from_gguf_fields(fields)
        for reader in (read_gguf(path), gguf.GGUFReader(path)):
            tok = Tokenizer.from_gguf(reader)
            assert tok.tokens == want.tokens and tok.token_types == want.token_types
            assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.n_vocab) == (want.bos_id, want.eos_id, want.unk_id,
                                                                         want.n_vocab)
            for text in CORPUS:
                assert tok.encode(text) == want.encode(text)
    assert ref.n_vocab == 400 and ref.bos_id == sp.bos_id() and ref.eos_id == sp.eos_id()


def test_bad_metadata_raises_gguf_errors() -> None:
    base = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "a"]}
    with pytest.raises(GGUFError, match="unknown tokenizer model 'bert'"):
        Tokenizer.from_gguf_fields({**base, "tokenizer.ggml.model": "bert"})
    with pytest.raises(GGUFError, match="tokenizer.ggml.model is missing"):
        Tokenizer.from_gguf_fields({"tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(GGUFError, match="tokenizer.ggml.tokens is missing"):
        Tokenizer.from_gguf_fields({"tokenizer.ggml.model": "llama"})
    with pytest.raises(GGUFError, match="tokenizer.ggml.scores has 3 entries for 4 tokens"):
        Tokenizer.from_gguf_fields({**base, "tokenizer.ggml.scores": [0.0] * 3})
    with pytest.raises(GGUFError, match="tokenizer.ggml.token_type has 5 entries for 4 tokens"):
        Tokenizer.from_gguf_fields({**base, "tokenizer.ggml.token_type": [1] * 5})
    with pytest.raises(GGUFError, match="merges is missing"):
        Tokenizer.from_gguf_fields({**base, "tokenizer.ggml.model": "gpt2"})
    with pytest.raises(GGUFError, match=r"merges\[1\] = 'ab' is not 'left right'"):
        Tokenizer.from_gguf_fields({**base, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.merges": ["a b", "ab"]})
    with pytest.raises(TypeError, match="has no 'fields'"):
        Tokenizer.from_gguf(object())
    assert issubclass(GGUFError, GGMLError)
    # an out-of-range special id falls back to llama.cpp's default, as llama.cpp does (with a warning)
    tok = Tokenizer.from_gguf_fields({**base, "tokenizer.ggml.bos_token_id": 99})
    assert tok.bos_id == 1


# --- pre-tokenizers, special tokens, flags, streaming ------------------------------------------------

def test_pre_tokenizer_regexes_split_in_turn() -> None:
    """llama.cpp's "default": punctuation runs, then GPT-2's pattern, then digit runs, then digit triples,
    each cutting the pieces the one before left (the stretches between matches are pieces too)."""
    assert pre_tokenizer("default").split("Hello, world 12345!!") == ["Hello", ",", " world", " ", "123", "45", "!!"]
    # llama3: digits by three, contractions of either case, a newline run ends a whitespace run
    assert pre_tokenizer("llama-bpe").split("x 1234567 'S\n\n  y it'S") == [
        "x", " ", "123", "456", "7", " '", "S", "\n\n", " ", " y", " it", "'S"]
    # qwen2: single digits; smollm: single digits and GPT-2 words
    assert pre_tokenizer("qwen2").split("ab 123") == ["ab", " ", "1", "2", "3"]
    assert pre_tokenizer("smollm").split("a1b 22 c") == ["a", "1", "b", " ", "2", "2", " c"]
    # GPT-2 keeps the last space of a run for the next word
    assert pre_tokenizer("gpt-2").split("a   b") == ["a", "  ", " b"]


def test_unknown_pre_tokenizer_is_an_error_naming_it() -> None:
    _, fields = train_bpe()
    with pytest.raises(UnknownPreTokenizerError, match="unknown pre-tokenizer 'no-such-pre'") as e:
        Tokenizer.from_gguf_fields({**fields, "tokenizer.ggml.pre": "no-such-pre"})
    assert isinstance(e.value, GGUFError) and isinstance(e.value, GGMLError)
    assert "qwen2" in str(e.value)  # and lists what pyggml has
    # no pre-tokenizer at all is llama.cpp's "default" (it warns), which splits digits unlike GPT-2
    tok = Tokenizer.from_gguf_fields({k: v for k, v in fields.items() if k != "tokenizer.ggml.pre"})
    assert tok.pre is not None and tok.pre.name == "default"


def test_special_tokens_parsed_only_when_asked(bpe_pair: tuple[Any, Tokenizer]) -> None:
    hf, tok = bpe_pair
    eot = tok.token_to_id["<|endoftext|>"]
    text = "hello<|endoftext|> world<|endoftext|>"
    assert tok.encode(text, parse_special=True) == (hf.encode("hello").ids + [eot] + hf.encode(" world").ids
                                                     + [eot])
    plain = tok.encode(text, parse_special=False)
    assert eot not in plain
    assert tok.decode(plain) == text  # the control token's text went through as text
    assert tok.decode(tok.encode(text, parse_special=True)) == "hello world"  # control tokens print nothing
    assert tok.decode(tok.encode(text, parse_special=True), special=True) == text


def test_user_defined_tokens_are_cut_out_even_as_plain_text(bpe_pair: tuple[Any, Tokenizer]) -> None:
    _, fields = train_bpe()
    tokens = list(fields["tokenizer.ggml.tokens"]) + ["<tool>"]
    types = list(fields["tokenizer.ggml.token_type"]) + [TOKEN_TYPE_USER_DEFINED]
    tok = Tokenizer.from_gguf_fields({**fields, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types})
    tool = len(tokens) - 1
    for parse_special in (False, True):
        ids = tok.encode("call <tool> now", parse_special=parse_special)
        assert ids.count(tool) == 1
        assert tok.decode(ids) == "call <tool> now"  # user-defined tokens always print


def test_add_bos_and_add_eos_follow_the_file(sp_pair: tuple[Any, Tokenizer]) -> None:
    sp, _ = sp_pair
    fields = sentencepiece_fields(sp)
    tok = Tokenizer.from_gguf_fields({**fields, "tokenizer.ggml.add_eos_token": True})
    body = tok.encode("hello", add_special=False)
    assert tok.encode("hello") == [sp.bos_id()] + body + [sp.eos_id()]
    assert tok.encode("hello", add_bos=False) == body  # the older keyword still works
    # a special token in SentencePiece text: the piece after it gets the prefix space again
    ids = tok.encode("hi</s>hi", add_special=False, parse_special=True)
    assert ids == tok.encode("hi", add_special=False) + [sp.eos_id()] + tok.encode("hi", add_special=False)


def test_stream_decoder_never_splits_a_character(sp_pair: tuple[Any, Tokenizer],
                                                 bpe_pair: tuple[Any, Tokenizer]) -> None:
    for tok in (sp_pair[1], bpe_pair[1]):
        text = "日本語のテキスト emoji🎉 café ∑ done"
        ids = tok.encode(text)
        assert len(ids) > len(text.split())
        dec = tok.stream_decoder()
        chunks = [dec.add(i) for i in ids]
        assert dec.flush() == ""
        assert "".join(chunks) == tok.decode(ids, clean_spaces=False) == text
        assert all("\ufffd" not in c for c in chunks)
        assert "" in chunks  # some token ended inside a character and printed nothing yet
    # a character cut off at the end comes out as U+FFFD on flush
    tok = sp_pair[1]
    ids = tok.encode("∑", add_special=False)
    dec = tok.stream_decoder()
    assert dec.add_many(ids[:-1]) == "" and dec.flush() == "\ufffd"


def test_clean_spaces_as_llama_detokenize(bpe_pair: tuple[Any, Tokenizer]) -> None:
    _, tok = bpe_pair
    ids = tok.encode("wait , what ? it ' s fine . I 'm here , you 're there 'd")
    assert tok.decode(ids) == "wait, what? it's fine. I'm here, you're there 'd"
    assert tok.decode(ids, clean_spaces=False) == "wait , what ? it ' s fine . I 'm here , you 're there 'd"
