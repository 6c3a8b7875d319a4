"""Chatting with SmolLM2-135M-Instruct (a real GGUF file with a ChatML template): the prompt's tokens are
llama.cpp's (special tokens parsed, no BOS added), the reply stops at "<|im_end|>" and is what generate()
gives on the rendered prompt, streamed pieces never split a character, a session keeps the KV cache
between turns; a file without a template chats in ChatML."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pyggml.models as pm
from pyggml.core.errors import ArgumentError
from pyggml.models.chat import ChatSession, ChatTemplate, ChatTemplateError, ConversationTooLongError

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# llama-tokenize -m SmolLM2-135M-Instruct.Q4_1.gguf --ids -p "<the rendering of QUESTION, assistant turn opened>"
LLAMA_CPP_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712,
                 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
SHORT = [{"role": "user", "content": "What is 2+2?"}]  # greedy SmolLM2 answers in 11 tokens, then <|im_end|>


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Iterator[pm.Model]:
    # one thread: on 2 cores shared with other jobs, waiting for a descheduled worker costs more than it gains
    model = pm.load(smollm2_path, n_ctx=256, progress=False, n_threads=1)
    yield model
    model.free()


def test_prompt_tokens_are_llama_cpps(smollm2: pm.Model) -> None:
    template = ChatTemplate.from_model(smollm2)
    assert not template.is_fallback
    assert (template.bos_token, template.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert smollm2.tokenize("<|im_start|>", add_bos=False, parse_special=True) == [1]  # one special token
    assert len(smollm2.tokenize("<|im_start|>", add_bos=False, parse_special=False)) > 1  # as text
    text = template.prompt(QUESTION)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")  # the template's
    assert text.endswith("<|im_start|>assistant\n")
    assert ChatSession(smollm2).prompt_tokens(QUESTION) == LLAMA_CPP_IDS  # the vocab adds no BOS


def test_end_of_generation_tokens_are_llama_cpps(smollm2: pm.Model) -> None:
    """llama.cpp's load log for this file: EOG token = 0 '<|endoftext|>', 2 '<|im_end|>', 4 '<reponame>'."""
    tok = smollm2.tokenizer
    assert tok.eog_ids == {0, 2, 4}
    assert tok.is_eog(tok.token_to_id["<|im_end|>"]) and not tok.is_eog(1)


def test_greedy_chat_is_generate_until_im_end(smollm2: pm.Model) -> None:
    reply = smollm2.chat(SHORT, max_tokens=32, temperature=0, repeat_penalty=1.0)
    assert isinstance(reply, str) and reply.strip()
    assert "<|im_end|>" not in reply and "<|im_start|>" not in reply
    # the same through generate() on the rendered prompt, stopped at the first end-of-generation token
    smollm2.reset()
    ids = smollm2.tokenize(ChatTemplate.from_model(smollm2).prompt(SHORT), add_bos=True, parse_special=True)
    gen = []
    for t in smollm2.generate(ids, 32, None, stop_at_eos=False):
        if smollm2.tokenizer.is_eog(t):
            break
        gen.append(t)
    assert len(gen) < 32, "the reply ends at <|im_end|> before max_tokens"
    assert reply == smollm2.detokenize(gen)
    # streamed: the same text in pieces
    pieces = list(smollm2.chat(SHORT, max_tokens=32, temperature=0, repeat_penalty=1.0, stream=True))
    assert len(pieces) > 1 and "".join(pieces) == reply
    # sampled with a seed: reproducible
    a = smollm2.chat(SHORT, max_tokens=4, temperature=0.9, seed=3)
    assert a == smollm2.chat(SHORT, max_tokens=4, sampler=pm.Sampler(temperature=0.9, seed=3))


class Scripted:
    """A sampler that plays given token ids, whatever the logits."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = list(ids)

    def sample(self, logits: np.ndarray, history: list[int]) -> int:
        return self.ids.pop(0)


def test_stream_never_splits_a_character(smollm2: pm.Model) -> None:
    text = "日本語 😀 ok"
    ids = smollm2.tokenize(text, add_bos=False)
    tok = smollm2.tokenizer
    # some token of the text is part of a character: its bytes alone are not UTF-8
    assert any(_not_utf8(tok.token_to_bytes(t)) for t in ids)
    session = ChatSession(smollm2)
    pieces = list(session.reply(SHORT, 64, Scripted([*ids, 2])))
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert session.stop_reason == "eog" and session.tokens == ids


def _not_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


class Recording:
    """A greedy sampler that keeps the logits it is given."""

    def __init__(self) -> None:
        self.logits: list[np.ndarray] = []

    def sample(self, logits: np.ndarray, history: list[int]) -> int:
        self.logits.append(np.array(logits))
        return int(np.argmax(logits))


def test_session_keeps_the_cache_between_turns(smollm2: pm.Model) -> None:
    session = ChatSession(smollm2, system="You are a helpful assistant.")
    first = "".join(session.send("What is 2+2?", 8))  # greedy (sampler None)
    assert first and session.n_reused == 0
    prompt1, reply1 = session.prompt_tokens(session.messages[:-1]), list(session.tokens)
    assert [m["role"] for m in session.messages] == ["system", "user", "assistant"]
    assert session.messages[-1]["content"] == first
    rec = Recording()
    second = "".join(session.send("And 3+3?", 4, rec))
    assert second
    # the second prompt starts with the first one and its reply: only the new turn was evaluated
    keep = session.n_reused
    assert keep >= len(prompt1)
    assert smollm2.n_past == len(session.cached) >= session.n_prompt
    # the same cells as evaluating the first turn, then the rest of the second prompt (same batches)
    prompt2 = session.prompt_tokens(session.messages[:-1])
    cached1 = (prompt1 + reply1)[:keep]
    assert prompt2[:keep] == cached1
    smollm2.reset()
    smollm2.eval_last(prompt1)
    for t in cached1[len(prompt1):]:
        smollm2.eval_last([t])
    np.testing.assert_array_equal(rec.logits[0], smollm2.eval_last(prompt2[keep:]))
    # and close to the whole conversation evaluated at once (batches round differently)
    smollm2.reset()
    whole = smollm2.eval_last(prompt2)
    cos = float(whole @ rec.logits[0] / np.linalg.norm(whole) / np.linalg.norm(rec.logits[0]))
    assert cos > 0.99


def test_errors(smollm2: pm.Model) -> None:
    with pytest.raises(ArgumentError, match="max_tokens"):
        smollm2.chat(SHORT, max_tokens=-1)
    with pytest.raises(ArgumentError, match="messages is empty"):
        smollm2.chat([])
    with pytest.raises(ArgumentError, match="not both"):
        smollm2.chat(SHORT, sampler=pm.Sampler(), temperature=0)
    with pytest.raises(ArgumentError, match="unexpected keyword"):
        smollm2.chat(SHORT, temprature=0)
    long = [{"role": "user", "content": "word " * 300}]
    with pytest.raises(ConversationTooLongError, match=r"the conversation is \d+ tokens, the context 256"):
        smollm2.chat(long)
    bad = ChatTemplate("{{ raise_exception('no ' + messages[0].role) }}", "'x.gguf' tokenizer.chat_template")
    with pytest.raises(ChatTemplateError, match=r"^'x.gguf' tokenizer.chat_template failed to render \(line 1\): "
                                                r"TemplateError: no user$"):
        ChatSession(smollm2, template=bad).reply(SHORT)  # raised at the call, before the first piece
    assert smollm2.chat(SHORT, max_tokens=0) == ""
    smollm2.eval_last([1, 2, 3, 4, 5])
    n = smollm2.n_past
    for bad_n in (-1, n + 1, 1.5, True):
        with pytest.raises(ArgumentError, match=rf"truncate: n_keep must be an integer in \[0, {n}\]"):
            smollm2.truncate(bad_n)  # type: ignore[arg-type]
    smollm2.truncate(3)
    assert smollm2.n_past == 3


@pytest.mark.slow
def test_a_file_without_template_chats_in_chatml() -> None:
    model = pm.load(pm.builtin_model_path(), n_ctx=128, progress=False)
    try:
        template = ChatTemplate.from_model(model)
        assert template.is_fallback
        assert "chatml (llama.cpp's default" in template.name and "has no tokenizer.chat_template" in template.name
        assert template.render(SHORT, add_generation_prompt=True) == (
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
        eos = model.tokenizer.eos_id
        assert model.tokenizer.eog_ids == {eos}
        reply: Any = model.chat(SHORT, max_tokens=6, temperature=0)
        assert isinstance(reply, str)
        # the vocab adds BOS: a template that writes it too still gives one BOS (llama.cpp drops the text's)
        bos = model.token_bos()
        assert model.tokenizer.add_bos_token and bos is not None
        own = ChatTemplate.from_model(model, "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}",
                                      "own")
        ids = ChatSession(model, template=own).prompt_tokens(SHORT)
        assert ids == model.tokenize("What is 2+2?") and ids.count(bos) == 1
        assert ChatSession(model).prompt_tokens(SHORT)[:1] == [bos]  # ChatML writes none: the vocab's
        # a turn that cannot start leaves no trace; a reply closed early is kept as far as it came
        bad = ChatSession(model, template=ChatTemplate("{{ raise_exception('no') }}", "bad"))
        with pytest.raises(ChatTemplateError):
            bad.send("Hello")
        assert bad.messages == []
        session = ChatSession(model, system="S")
        stream = session.send("Return a list", 16, Scripted(model.tokenize(" The list of files", add_bos=False)))
        first = next(stream)
        stream.close()
        assert session.messages == [{"role": "system", "content": "S"}, {"role": "user", "content": "Return a list"},
                                    {"role": "assistant", "content": first}]
        assert model.n_past == len(session.cached)
    finally:
        model.free()


# llama.cpp's end-of-generation ids of its ggml-vocab files of the families chatted with ("print_info: EOG
# token = ..." of `llama-tokenize -m ggml-vocab-NAME.gguf --log-verbose`, llama.cpp 0c1e570; the other vocabs
# agree too, left out for time: loading a 150k-token vocab takes a second or two)
VOCAB_EOG = {
    "llama-bpe": {128001, 128009}, "qwen2": {128247, 151643, 151645}, "phi-3": {2, 32000, 32007},
    "llama-spm": {2}, "starcoder": {0, 4},  # gemma-4's {1, 50, 106} agrees too (8 s to load: its rule below)
}


@pytest.mark.parametrize("name", sorted(VOCAB_EOG))
def test_end_of_generation_ids_of_the_vocab_suites(llamacpp_models: Path, name: str) -> None:
    """Llama 3's <|end_of_text|> and <|eot_id|>, Qwen's <|endoftext|>, <|im_end|> and <|fim_pad|>-style FIM
    tokens, Phi-3's </s>, <|endoftext|> and <|end|>; checked live against llama-tokenize's log where built."""
    from pyggml.gguf.reader import read_gguf
    from pyggml.models.tokenizer import Tokenizer
    from pyggml.testing.llamacpp import find_tool

    vocab = llamacpp_models / f"ggml-vocab-{name}.gguf"
    assert Tokenizer.from_gguf(read_gguf(vocab)).eog_ids == VOCAB_EOG[name]
    tool = find_tool("llama-tokenize")
    if tool is not None:
        import re
        import subprocess

        proc = subprocess.run([str(tool), "-m", str(vocab), "-p", "hi", "--ids", "--log-verbose"],
                              capture_output=True, text=True, timeout=120)
        found = {int(i) for i in re.findall(r"print_info: EOG token += +(\d+)", proc.stderr)}
        if proc.returncode == 0 and found:  # else the tool is not usable now (being rebuilt, say): constants only
            assert found == VOCAB_EOG[name]


def test_gemma3_file(gemma3_path: Path, llamacpp_models: Path) -> None:
    """Gemma 3 270M (a base model: its file has no template, so ChatML as llama.cpp). Its end-of-generation ids
    are llama.cpp's (<eos>, <end_of_turn>, </s>); with Gemma's template given (the sdist's Gemma 2 one, which
    Gemma 3's extends with system messages) "<start_of_turn>" is one token and the template's BOS text gives
    way to the vocab's BOS: one BOS."""
    from pyggml.gguf.reader import read_gguf
    from pyggml.models.tokenizer import Tokenizer

    gf = read_gguf(gemma3_path)
    tok = Tokenizer.from_gguf(gf)
    assert tok.eog_ids == {1, 106, 212}
    assert ChatTemplate.from_gguf(gf, tok).is_fallback
    source = (llamacpp_models / "templates" / "google-gemma-2-2b-it.jinja").read_text(encoding="utf-8")
    template = ChatTemplate.from_gguf(gf, tok, source, "gemma")
    assert template.render(SHORT, True).startswith("<bos><start_of_turn>user\n")
    ids = tok.encode(template.prompt(SHORT), True, True)
    start, end = tok.token_to_id["<start_of_turn>"], tok.token_to_id["<end_of_turn>"]
    assert ids[:2] == [tok.bos_id, start] and ids.count(tok.bos_id) == 1
    assert ids.count(start) == 2 and ids.count(end) == 1
    assert tok.decode(ids, special=True) == "<bos>" + template.prompt(SHORT)


def _vocab(texts: list[str], **ids: int) -> Any:
    from pyggml.models.tokenizer import TOKEN_TYPE_CONTROL, Tokenizer

    tokens = [*texts, "a", "b"]
    fields = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
              "tokenizer.ggml.token_type": [TOKEN_TYPE_CONTROL] * len(texts) + [1, 1], "tokenizer.ggml.merges": [],
              "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 0}
    fields.update({f"tokenizer.ggml.{k}_token_id": v for k, v in ids.items()})
    return Tokenizer.from_gguf_fields(fields)


def test_end_of_generation_rules() -> None:
    """llama_vocab::impl::load's special cases: gpt-oss's and Solar Open's <|end|> is not an end, Gemma 4's </s>
    is a normal token, a file's eot/eom ids count, FIM pad/repo/separator tokens end a generation."""
    assert _vocab(["<s>", "<|return|>", "<|call|>", "<|end|>"]).eog_ids == {0, 1, 2}
    assert _vocab(["<s>", "<|calls|>", "<|flush|>", "<|end|>"]).eog_ids == {0, 1, 2}
    assert _vocab(["<s>", "<|end|>"]).eog_ids == {0, 1}
    assert _vocab(["<eos>", "<|tool_response>", "</s>"]).eog_ids == {0, 1}
    assert _vocab(["<eos>", "</s>"]).eog_ids == {0, 1}
    assert _vocab(["<s>", "<my_end>", "<my_eom>"], eot=1, eom=2).eog_ids == {0, 1, 2}
    assert _vocab(["<s>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|fim_prefix|>"]).eog_ids == {0, 1, 2, 3}
