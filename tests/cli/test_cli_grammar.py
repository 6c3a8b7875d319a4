"""llama.cpp's grammar options on the command line: --grammar, --grammar-file, -j/--json-schema, -jf/--json-schema-file
constrain `run` and each reply of `chat` (the built-in model, in-process); their mistakes are one-line errors."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import jsonschema
import pytest
from cli_util import one_line

from pyggml.cli.main import main

pytest.importorskip("llguidance")

YES_NO = 'root ::= " yes" | " no"'
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}


def generated(out: str, prompt: str) -> str:
    assert out.startswith(prompt) and out.endswith("\n")
    return out[len(prompt):-1]


def test_run_grammar_and_grammar_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "yes_no.gbnf"
    path.write_text(YES_NO, encoding="utf-8")
    for options in (["--grammar", YES_NO, "--temp", "0"], ["--grammar-file", str(path), "--temp", "1.5", "-s", "2"]):
        assert main(["run", "-p", "Is it true? Answer:", "-n", "16", *options]) == 0
        assert generated(capsys.readouterr().out, "Is it true? Answer:") in (" yes", " no")


def test_run_json_schema_and_its_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA), encoding="utf-8")
    for options in (["-j", json.dumps(SCHEMA)], ["--json-schema-file", str(path)]):
        assert main(["run", "-p", "Data:", "-n", "40", "--temp", "0.7", "-s", "5", *options]) == 0
        jsonschema.validate(json.loads(generated(capsys.readouterr().out, "Data:")), SCHEMA)
    assert main(["run", "-p", "Data:", "-n", "60", "--temp", "0", "-j", "{}"]) == 0  # llama.cpp: {} any object
    assert generated(capsys.readouterr().out, "Data:").startswith("{")


@pytest.mark.slow
def test_chat_follows_the_grammar_in_each_reply(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("Is water wet?\nIs fire cold?\nAnd the sky?\n"))
    assert main(["chat", "--grammar", 'root ::= "yes" | "no"', "--temp", "0.9", "-s", "1", "-n", "8"]) == 0
    replies = capsys.readouterr().out.splitlines()
    assert len(replies) == 3 and all(r in ("yes", "no") for r in replies), replies


@pytest.mark.parametrize("options, words", [
    (["--grammar", "root ::= nowhere"], "--grammar: .*nowhere"),
    (["--grammar", 'root ::= "a"', "-j", "{}"], "--grammar and --json-schema both constrain"),
    (["-j", "{not json"], "--json-schema: not JSON"),
    (["-j", '{"type": "nonsense"}'], "--json-schema: .*nonsense"),
    (["--grammar-file", "/no/such/file.gbnf"], "--grammar-file: cannot read '/no/such/file.gbnf'"),
])
def test_grammar_mistakes_are_one_line_errors(options: list[str], words: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-p", "x", "-n", "2", *options]) != 0
    line = one_line(capsys.readouterr().err)
    assert line.startswith("pyggml run: error:")
    assert re.search(words, line), line
