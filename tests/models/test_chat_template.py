"""Chat templates: pyggml's rendering equals transformers' (its `render_jinja_template`, what
`apply_chat_template(..., tokenize=False)` calls) on the real templates of llama.cpp's sdist
(`models/templates/*.jinja`), for conversations with and without a system message, several turns,
tools and reasoning, with the generation prompt on and off; a template that raises does so in both,
pyggml's error naming the template, the problem and the line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pyggml.core.errors import ArgumentError, GGMLError
from pyggml.models.chat import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError, render_template

transformers_utils = pytest.importorskip("transformers.utils.chat_template_utils")

# the families the models issue names, by their sdist file: llama 3, qwen2/qwen3, gemma, phi3, smollm, mistral
FAMILY_TEMPLATES = [
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja",  # strftime_now
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "Qwen-Qwen3-0.6B.jinja",  # reasoning_content, enable_thinking
    "google-gemma-2-2b-it.jinja",  # raise_exception on a system message
    "google-gemma-4-31B-it.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja",
    "HuggingFaceTB-SmolLM3-3B.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja",
]
# SmolLM2-135M-Instruct's own template (its GGUF's tokenizer.chat_template)
SMOLLM2_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
                    "'<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
                    "}}{% endif %}")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather at a place <now> & later, in °C",
    "parameters": {"type": "object", "properties": {"place": {"type": "string", "description": "a city: 東京"}},
                   "required": ["place"]}}}]
CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    "turns": [{"role": "system", "content": "Be kind."},
              {"role": "user", "content": "Hi <b>there</b> & 'you'"},
              {"role": "assistant", "content": "Hello! How can I help?"},
              {"role": "user", "content": "Say 日本語 and 😀 twice."},
              {"role": "assistant", "content": "日本語 😀 日本語 😀"},
              {"role": "user", "content": "  spaces  \n and lines \n"}],
    "no_system_turns": [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
                        {"role": "user", "content": "three"}],
    "reasoning": [{"role": "user", "content": "Think first."},
                  {"role": "assistant", "content": "Done.", "reasoning_content": "Let me see.", "tool_calls": None},
                  {"role": "user", "content": "Again."}],
    "tool_call": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"type": "function", "id": "call0abc1",
                       "function": {"name": "get_weather", "arguments": {"place": "Paris"}}}]},
                  {"role": "tool", "name": "get_weather", "tool_call_id": "call0abc1", "content": "22 °C"},
                  {"role": "user", "content": "Thanks"}],
}
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}


def transformers_render(source: str, messages: list[dict[str, Any]], add_generation_prompt: bool,
                        tools: list[dict[str, Any]] | None = None, **kwargs: Any) -> str | Exception:
    """transformers' rendering as its apply_chat_template does it (messages normalized: None values dropped),
    or the exception it raises."""
    try:
        rendered, _ = transformers_utils.render_jinja_template(
            conversations=[transformers_utils._normalize_chat_messages(messages)], tools=tools, chat_template=source,
            add_generation_prompt=add_generation_prompt, **kwargs)
        return str(rendered[0])
    except Exception as e:
        return e


def pyggml_render(source: str, messages: list[dict[str, Any]], add_generation_prompt: bool,
                  tools: list[dict[str, Any]] | None = None, **kwargs: Any) -> str | Exception:
    try:
        return render_template(source, messages, add_generation_prompt=add_generation_prompt, tools=tools,
                               name="test template", **kwargs)
    except ChatTemplateError as e:
        return e


def check_same(source: str, messages: list[dict[str, Any]], add_generation_prompt: bool,
               tools: list[dict[str, Any]] | None = None, **kwargs: Any) -> bool:
    """Both renderings equal, or both raise (pyggml a ChatTemplateError that carries transformers' message);
    True when the template rendered."""
    ref = transformers_render(source, messages, add_generation_prompt, tools, **kwargs)
    got = pyggml_render(source, messages, add_generation_prompt, tools, **kwargs)
    if isinstance(ref, Exception):
        assert isinstance(got, ChatTemplateError), f"transformers raised {ref!r}, pyggml rendered {got!r}"
        assert " ".join(str(ref).split()) in str(got)
        assert str(got).startswith("test template failed to render")
        return False
    assert not isinstance(got, Exception), f"pyggml raised {got}, transformers rendered {ref!r}"
    assert got == ref
    return True


@pytest.fixture(scope="module")
def templates_dir(llamacpp_models: Path) -> Path:
    return llamacpp_models / "templates"


@pytest.mark.parametrize("name", FAMILY_TEMPLATES)
def test_family_templates_render_as_transformers(templates_dir: Path, name: str) -> None:
    source = (templates_dir / name).read_text(encoding="utf-8")
    rendered = 0
    for messages in CONVERSATIONS.values():
        for agp in (True, False):
            rendered += check_same(source, messages, agp, **SPECIALS)
    assert check_same(source, CONVERSATIONS["turns"], True, tools=TOOLS, **SPECIALS) or "tool" not in source
    assert rendered >= 6, "most conversations render"  # gemma 2 refuses the system message, mistral others


def test_template_variables_reach_the_template(templates_dir: Path) -> None:
    """enable_thinking (Qwen 3), date_string (Llama 3.1) and the BOS text: passed through as transformers does."""
    qwen3 = (templates_dir / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    msgs = CONVERSATIONS["user"]
    assert check_same(qwen3, msgs, True, enable_thinking=False, **SPECIALS)
    assert render_template(qwen3, msgs, add_generation_prompt=True, enable_thinking=False).endswith(
        "<think>\n\n</think>\n\n")
    llama31 = (templates_dir / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text(encoding="utf-8")
    assert check_same(llama31, msgs, True, date_string="01 Jan 2030", bos_token="<|begin_of_text|>")
    assert "01 Jan 2030" in render_template(llama31, msgs, date_string="01 Jan 2030")


@pytest.mark.parametrize("source", [SMOLLM2_TEMPLATE, CHATML_TEMPLATE], ids=["smollm2", "chatml"])
def test_chatml_templates_render_as_transformers(source: str) -> None:
    for messages in CONVERSATIONS.values():
        for agp in (True, False):
            assert check_same(source, messages, agp, **SPECIALS)
    assert render_template(CHATML_TEMPLATE, CONVERSATIONS["system"], add_generation_prompt=True) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_every_sdist_template_renders_as_transformers(templates_dir: Path) -> None:
    """The other templates of the sdist (DeepSeek, Granite, Command R, gpt-oss, ...) on two conversations."""
    paths = sorted(p for p in templates_dir.glob("*.jinja") if p.name not in FAMILY_TEMPLATES)
    assert len(paths) >= 40
    rendered = 0
    for p in paths:
        source = p.read_text(encoding="utf-8")
        rendered += check_same(source, CONVERSATIONS["turns"], True, **SPECIALS)
        rendered += check_same(source, CONVERSATIONS["no_system_turns"], False, **SPECIALS)
    assert rendered >= len(paths)  # most render (a few need inputs of their own)


# --- the sandbox and transformers' helpers ---


def test_tojson_is_plain_json() -> None:
    """transformers' tojson: no HTML escaping, non-ASCII kept, indent/sort_keys/separators as json.dumps."""
    source = "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2, sort_keys=True) }}|" \
             "{{ messages[0] | tojson(separators=(',', ':'), ensure_ascii=True) }}"
    msgs = [{"role": "user", "content": "<a href='x'>&</a> 東京"}]
    assert check_same(source, msgs, False)
    assert '"<a href=\'x\'>&</a> 東京"' in render_template(source, msgs)


def test_globals_namespace_and_loop_controls() -> None:
    source = ("{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'system' %}{% continue %}"
              "{% endif %}{% set ns.n = ns.n + 1 %}{% if ns.n > 1 %}{% break %}{% endif %}{{ m.content }}"
              "{% endfor %}{{ ns.n }}{{ dict(a=1) | tojson }}{{ strftime_now('%Y') | length }}"
              "{% generation %}[gen]{% endgeneration %}")
    assert check_same(source, CONVERSATIONS["turns"], False)
    assert render_template(source, CONVERSATIONS["turns"]) == 'Hi <b>there</b> & \'you\'2{"a": 1}4[gen]'


def test_none_values_are_dropped_and_reasoning_aliased() -> None:
    source = ("{% for m in messages %}{{ m.role }}:{{ 'tool_calls' in m }}:{{ m.reasoning_content }}:"
              "{{ m.thinking }};{% endfor %}")
    msgs = [{"role": "assistant", "content": "x", "tool_calls": None, "reasoning": "r"}]
    assert check_same(source, msgs, False)
    assert render_template(source, msgs) == "assistant:False:r:r;"


@pytest.mark.parametrize("source, problem", [
    ("{{ raise_exception('System role not supported') }}", "TemplateError: System role not supported"),
    ("{% for m in messages %}{{ m.content }", "TemplateSyntaxError"),
    ("{{ messages.__class__.__mro__ }}", "SecurityError: access to attribute '__class__' of 'list' object is unsafe"),
    ("{{ nothing.here }}", "UndefinedError: 'nothing' is undefined"),
    ("{% set ns = namespace(_x=1) %}", "SecurityError"),
    ("{{ messages.append(1) }}", "SecurityError"),
    ("\n\n{{ messages[0].content + 1 }}", "TypeError"),
])
def test_template_errors_name_the_template_and_the_problem(source: str, problem: str) -> None:
    with pytest.raises(ChatTemplateError) as ei:
        render_template(source, CONVERSATIONS["user"], name="'m.gguf' tokenizer.chat_template")
    msg = str(ei.value)
    assert msg.startswith("'m.gguf' tokenizer.chat_template ")
    assert problem in msg
    assert isinstance(ei.value, GGMLError) and isinstance(ei.value, ValueError)
    if "content + 1" in source or "{% for" in source:
        assert "(line 3)" in msg or "(line 1)" in msg


def test_bad_messages_are_argument_errors() -> None:
    for bad in ([], "hello", [{"role": "user", "content": "x"}, "y"], {"role": "user"}):
        with pytest.raises(ArgumentError):
            render_template(CHATML_TEMPLATE, bad)  # type: ignore[arg-type]


def test_chat_template_drops_the_bos_the_vocab_adds() -> None:
    """llama.cpp's common_chat_template_direct_apply: a rendering that starts with the BOS text loses it when
    the vocab adds BOS itself (and the EOS text at the end when it adds EOS)."""
    source = "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}{{ eos_token }}"
    t = ChatTemplate(source, "t", bos_token="<s>", eos_token="</s>", add_bos=True, add_eos=False)
    msgs = CONVERSATIONS["user"]
    assert t.render(msgs) == "<s>[Hello!]</s>"
    assert t.prompt(msgs) == "[Hello!]</s>"
    t = ChatTemplate(source, "t", bos_token="<s>", eos_token="</s>", add_bos=False, add_eos=True)
    assert t.prompt(msgs) == "<s>[Hello!]"
    with pytest.raises(ChatTemplateError, match=r"^broken does not compile \(line 1\)"):
        ChatTemplate("{% if %}", "broken")


def test_equals_apply_chat_template_of_a_local_tokenizer(templates_dir: Path) -> None:
    """The whole path of transformers' apply_chat_template(tokenize=False), with a tokenizer built here (a tiny
    word-level one: no download), whose BOS/EOS texts become bos_token/eos_token as ChatTemplate passes them."""
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3}
    tok = PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, "<unk>")),
                                  bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    for source in [SMOLLM2_TEMPLATE] + [(templates_dir / n).read_text(encoding="utf-8") for n in (
            "meta-llama-Llama-3.1-8B-Instruct.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja",
            "microsoft-Phi-3.5-mini-instruct.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja")]:
        template = ChatTemplate(source, "t", bos_token="<s>", eos_token="</s>")
        for messages in (CONVERSATIONS["system"], CONVERSATIONS["no_system_turns"], CONVERSATIONS["reasoning"]):
            for agp in (True, False):
                ref = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp,
                                              chat_template=source)
                assert template.render(messages, agp) == ref
