"""`pyggml chat`: driven through stdin, in a fresh process with SmolLM2 (a system message, two turns, /exit),
its replies are what a ChatSession gives; in-process with the built-in model (no template: ChatML) for EOF,
blank lines and the one-line error of a conversation longer than the context."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_util import one_line

from pyggml.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "You are a helpful assistant."
TURNS = ["What is 2+2?", "And 3+3?"]


def test_chat_two_turns_through_stdin(smollm2_path: Path) -> None:
    """A greedy chat piped in: stdout holds each reply and a newline, the lines after /exit are not read."""
    from pyggml.models import load
    from pyggml.models.chat import ChatSession

    n = 8
    stdin = "\n".join([TURNS[0], "", TURNS[1], "/exit", "never read"]) + "\n"
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")  # this tree's pyggml, whatever is installed
    proc = subprocess.run([sys.executable, "-m", "pyggml.cli", "chat", str(smollm2_path), "--system", SYSTEM,
                           "-n", str(n), "--temp", "0", "--repeat-penalty", "1.0", "-c", "256", "-t", "1"],
                          input=stdin, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr

    model = load(smollm2_path, n_ctx=256, progress=False, n_threads=1, kv_type="f16")  # the command's default cache
    try:
        session = ChatSession(model, system=SYSTEM)
        replies, n_gen = [], 0
        for q in TURNS:  # greedy: the CLI's --temp 0 without penalty
            replies.append("".join(session.send(q, n)))
            n_gen += len(session.tokens)
    finally:
        model.free()
    assert all(replies)
    assert proc.stdout == "".join(r + "\n" for r in replies)
    summary = one_line(proc.stderr)
    assert summary.startswith("2 turn(s), seed ")
    assert f" {n_gen} generated in " in summary


@pytest.mark.slow
def test_chat_with_the_builtin_model(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """No MODEL: the built-in one, which has no template (ChatML, said on stderr); EOF ends the chat."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello\n\n   \nReturn a list\n"))
    assert main(["chat", "-n", "5", "--seed", "3", "-c", "128"]) == 0
    out, err = capsys.readouterr()
    assert out.count("\n") >= 2  # two replies, each ended by a newline (a reply may hold newlines of its own)
    assert "has no chat template: chatting in ChatML (llama.cpp's default)" in err
    assert "2 turn(s), seed 3:" in err


def test_chat_conversation_longer_than_the_context(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("Return " * 40 + "\n"))
    assert main(["chat", "-n", "4", "-c", "32"]) == 1
    err = capsys.readouterr().err
    line = [x for x in err.splitlines() if x.startswith("pyggml chat: error:")]
    assert len(line) == 1 and "tokens, the context 32: no room for a reply" in line[0]
    assert "raise -c/--ctx-size" in line[0]
    assert "Traceback" not in err


def test_chat_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        main(["chat", "--help"])
    assert ei.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--system", "--max-tokens", "--temp", "--top-k", "--seed", "--ctx", "--backend"):
        assert opt in out


def test_chat_template_file_and_kwargs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """--chat-template-file replaces the file's template, --chat-template-kwargs reaches it; a template that
    raises ends the command with one line naming the template file and the problem."""
    template = tmp_path / "t.jinja"
    template.write_text("{% if not flag %}{{ raise_exception('flag is ' ~ flag) }}{% endif %}"
                        "{% for m in messages %}{{ m.content }}\n{% endfor %}")
    monkeypatch.setattr(sys, "stdin", io.StringIO("Return a\n"))
    assert main(["chat", "-n", "3", "-c", "64", "--chat-template-file", str(template),
                 "--chat-template-kwargs", '{"flag": true}']) == 0
    assert "1 turn(s)" in capsys.readouterr().err
    monkeypatch.setattr(sys, "stdin", io.StringIO("Return a\n"))
    assert main(["chat", "-n", "3", "-c", "64", "--chat-template-file", str(template),
                 "--chat-template-kwargs", '{"flag": 0}']) == 1
    err = capsys.readouterr().err
    assert one_line(err) == (f"pyggml chat: error: '{template}' failed to render (line 1): TemplateError: flag is 0")
    for bad, problem in (('{"flag": ', "not JSON"), ("[1]", "expected a JSON object, got list")):
        assert main(["chat", "--chat-template-kwargs", bad]) == 1
        assert problem in one_line(capsys.readouterr().err)
