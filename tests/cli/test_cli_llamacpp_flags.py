"""llama.cpp's flags with llama.cpp's meaning in `run`, `chat`, `serve` and `bench`: each one parsed to its
meaning, and the ones that shape a model reaching `pyggml.models.load` from the command itself (a recording
`load`); no option is ever a prefix of another or glued to its value (`-ngl 99` is never `-n gl`); llama-bench's
comma lists, -pg, -d, -r and -o md|csv|json|jsonl on the built-in model; SmolLM2 with the issue's flags."""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from cli_util import one_line

from pyggml.cli import bench
from pyggml.cli._common import KV_CACHE_TYPES, LoadSettings, context_size, fmt_bytes, plan_from_args
from pyggml.cli.main import build_parser, main
from pyggml.models.builtin import builtin_model_path

BUILTIN = str(builtin_model_path())
MODEL_COMMANDS = ["run", "chat", "serve", "bench"]


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def parse_error(argv: list[str]) -> str:
    """The one line on stderr of a command line the parser refuses (exit code 2)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return one_line(err.getvalue())


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


class Stop(Exception):
    """Raised by the recording `load` once it has what the command gave it."""


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What each command gives `pyggml.models.load`: the path, the backends and the keywords; the load stops there
    (a command then fails in one line), so that serve and chat need no server and no stdin."""
    import pyggml.models

    calls: list[dict[str, Any]] = []

    def record(path: Any, backends: Any = None, **kw: Any) -> Any:
        calls.append({"path": str(path), "backends": backends, **kw})
        raise Stop("recorded")

    monkeypatch.setattr(pyggml.models, "load", record)
    return calls


# --- -m/--model and MODEL.gguf --------------------------------------------------------------------------------

@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_model_by_m_or_positional_is_the_same_file(command: str) -> None:
    want = [BUILTIN] if command == "bench" else BUILTIN
    assert parse([command, "-m", BUILTIN]).model == want
    assert parse([command, "--model", BUILTIN]).model == want
    assert parse([command, BUILTIN]).model == want
    assert parse([command]).model is None  # the built-in model


@pytest.mark.parametrize("command", ["run", "chat", "serve"])
def test_model_given_twice_is_refused(command: str) -> None:
    line = parse_error([command, "a.gguf", "-m", "b.gguf"])
    assert line == (f"pyggml {command}: error: the model is given twice: 'a.gguf' and 'b.gguf' (give MODEL.gguf or "
                    f"-m, once) (see 'pyggml {command} --help')")


def test_bench_takes_several_models_as_llama_bench() -> None:
    assert parse(["bench", "-m", "a.gguf,b.gguf", "-m", "c.gguf", "d.gguf"]).model == ["a.gguf", "b.gguf", "c.gguf",
                                                                                      "d.gguf"]


# --- the options as llama.cpp spells them, parsed to their meaning ------------------------------------------------

def test_run_options_mean_what_llama_cpp_means() -> None:
    args = parse(["run", "-m", BUILTIN, "-p", "Hi", "-n", "16", "-c", "2048", "-b", "256", "-ub", "64", "-t", "2",
                  "-s", "7", "-ngl", "99", "-ts", "1", "-ot", "ffn=0", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0",
                  "--temp", "0", "--top-k", "5", "--top-p", "0.5", "--min-p", "0.1", "--repeat-penalty", "1.2"])
    assert (args.prompt, args.n_predict, args.ctx, args.batch_size, args.ubatch_size) == ("Hi", 16, 2048, 256, 64)
    assert (args.threads, args.seed, args.n_gpu_layers, args.tensor_split) == (2, 7, 99, "1")
    assert (args.override_tensor, args.flash_attn, args.cache_type_k, args.cache_type_v) == (["ffn=0"], "on", "q8_0",
                                                                                            "q8_0")
    assert (args.temp, args.top_k, args.top_p, args.min_p, args.repeat_penalty) == (0.0, 5, 0.5, 0.1, 1.2)
    assert args.backend is None  # -b is the batch size now, --backend the backend


def test_long_names_llama_cpp_and_pyggml() -> None:
    args = parse(["run", "--ctx-size", "64", "--batch-size", "8", "--ubatch-size", "4", "--threads", "1", "--seed", "3",
                  "--n-gpu-layers", "2", "--cache-type-k", "f16", "--cache-type-v", "f16", "--flash-attn", "off",
                  "--tensor-split", "1,1", "--override-tensor", "a=0", "--predict", "5", "--temperature", "0.5"])
    assert (args.ctx, args.batch_size, args.ubatch_size, args.threads, args.seed) == (64, 8, 4, 1, 3)
    assert (args.n_gpu_layers, args.cache_type_k, args.cache_type_v, args.flash_attn) == (2, "f16", "f16", "off")
    assert (args.tensor_split, args.override_tensor, args.n_predict, args.temp) == ("1,1", ["a=0"], 5, 0.5)
    # pyggml's own long names keep working
    args = parse(["run", "--ctx", "64", "--batch", "8", "--n-predict", "5", "--backend", "cpu", "--gpu-layers", "1"])
    assert (args.ctx, args.batch_size, args.n_predict, args.backend, args.n_gpu_layers) == (64, 8, 5, ["cpu"], 1)


def test_defaults_are_llama_cpp_s() -> None:
    args = parse(["run"])
    assert (args.batch_size, args.ubatch_size, args.flash_attn, args.n_gpu_layers) == (2048, 512, "auto", None)
    assert (args.temp, args.top_k, args.top_p, args.min_p, args.repeat_penalty) == (0.8, 40, 0.95, 0.05, 1.0)
    args = parse(["serve"])
    assert (args.host, args.port) == ("127.0.0.1", 8080)
    args = parse(["bench"])
    assert args.repetitions == 5 and args.output == "md"
    tests = bench.tests_of(args, [BUILTIN])
    assert [(t.n_prompt, t.n_gen, t.n_batch, t.n_ubatch) for t in tests] == [(512, 0, 2048, 512), (0, 128, 2048, 512)]


def test_chat_and_serve_options() -> None:
    args = parse(["chat", "-p", "Hello", "-sys", "Be brief", "-n", "-1", "-c", "0", "--temp", "0", "-s", "1"])
    assert (args.prompt, args.system, args.max_tokens, args.ctx, args.temp, args.seed) == ("Hello", "Be brief", -1,
                                                                                          0, 0.0, 1)
    assert parse(["chat", "--system", "x", "--max-tokens", "3"]).max_tokens == 3
    args = parse(["serve", "-np", "2", "--host", "127.0.0.1", "--port", "8123", "-c", "512", "-ngl", "all", "-b", "32"])
    assert (args.parallel, args.host, args.port, args.ctx, args.n_gpu_layers, args.batch_size) == (
        2, "127.0.0.1", 8123, 512, "all", 32)


@pytest.mark.parametrize("text, want", [("0", 0), ("99", 99), ("all", "all"), ("auto", None)])
def test_ngl_values(text: str, want: object) -> None:
    assert parse(["run", "-ngl", text]).n_gpu_layers == want


@pytest.mark.parametrize("words, mode", [(("on", "enabled", "true", "1"), "on"),
                                         (("off", "disabled", "false", "0"), "off"), (("auto", "-1"), "auto")])
def test_flash_attn_values_as_llama_cpp(words: tuple[str, ...], mode: str) -> None:
    for word in words:
        assert parse(["run", "-fa", word]).flash_attn == mode


@pytest.mark.parametrize("argv, words", [
    (["run", "-ngl", "x"], "argument -ngl/--n-gpu-layers/--gpu-layers: invalid int value: 'x'"),
    (["run", "-ngl", "-2"], "must be >= 0, got -2"),
    (["run", "-ctk", "q9_0"], "invalid cache type 'q9_0' (llama.cpp's: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl"),
    (["run", "-fa", "yes"], "argument -fa/--flash-attn: invalid value 'yes' (on, off or auto)"),
    (["run", "-b", "0"], "argument -b/--batch-size/--batch: must be >= 1, got 0"),
    (["run", "-ub", "0"], "argument -ub/--ubatch-size: must be >= 1, got 0"),
    (["run", "-c", "-1"], "argument -c/--ctx-size/--ctx: must be >= 0, got -1"),
    (["bench", "-t", "1,0"], "argument -t/--threads: must be >= 1, got 0"),
    (["bench", "-p", "64,x"], "invalid value 'x'"),
    (["bench", "-p", "0-8*2"], "invalid range '0-8*2'"),
    (["bench", "-pg", "64"], "-pg: wants PP,TG (two token counts), got '64'"),
    (["bench", "-o", "sql"], "argument -o/--output: invalid choice: 'sql'"),
    (["serve", "-np", "0"], "argument -np/--parallel: must be >= 1, got 0"),
])
def test_bad_values_fail_in_one_line_naming_the_option(argv: list[str], words: str) -> None:
    line = parse_error(argv)
    assert line.startswith(f"pyggml {argv[0]}: error: ") and words in line
    assert line.endswith(f"(see 'pyggml {argv[0]} --help')")


# --- no abbreviations: an option is only ever its whole name ---------------------------------------------------

def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", sorted(subcommand_parsers()))
def test_no_prefix_of_an_option_means_it(command: str) -> None:
    """Every option of every subcommand cut by one or more characters is refused (unless the cut is itself an
    option), and `-X` glued to a value is not `-X VALUE`."""
    parser = subcommand_parsers()[command]
    names = set(parser._option_string_actions)
    for name in names:
        for cut in range(2 if name.startswith("--") else 1, len(name) - 1):
            prefix = name[:len(name) - cut]
            if prefix in names or prefix in ("-", "--"):
                continue
            ns, extras = parser.parse_known_args([prefix, "1"])
            assert prefix in extras, (command, name, prefix, ns)


def test_llama_cpp_flags_are_never_read_as_pyggml_s() -> None:
    args = parse(["run", "-ngl", "99"])
    assert args.n_gpu_layers == 99 and args.n_predict == 64  # not -n gl
    args = parse(["run", "-b", "256"])
    assert args.batch_size == 256 and args.backend is None  # not a backend named "256"
    args = parse(["bench", "-o", "json"])
    assert args.output == "json" and args.override_tensor is None  # not -ot json
    assert parse(["run", "--ctx-size", "128"]).ctx == 128
    line = parse_error(["info", BUILTIN, "-ngl", "99"])  # info takes no -ngl, and -n is no prefix of it
    assert line == "pyggml info: error: unrecognized arguments: -ngl 99 (see 'pyggml info --help')"
    line = parse_error(["run", "-n5"])  # a short option glued to its value, llama.cpp refuses it too
    assert "unrecognized arguments: -n5" in line


@pytest.mark.parametrize("argv, line", [
    (["run", "--ctx-siz", "5"], "pyggml run: error: unrecognized arguments: --ctx-siz (did you mean --ctx-size?) "
                                "(see 'pyggml run --help')"),  # 5 is MODEL.gguf
    (["bench", "--n-promt", "5"], "pyggml bench: error: unrecognized arguments: --n-promt (did you mean --n-prompt?) "
                                  "(see 'pyggml bench --help')"),
    (["serve", "--frobnicate"], "pyggml serve: error: unrecognized arguments: --frobnicate "
                                "(see 'pyggml serve --help')"),
    (["chat", "-ngl"], "pyggml chat: error: argument -ngl/--n-gpu-layers/--gpu-layers: expected one argument "
                       "(see 'pyggml chat --help')"),
])
def test_unknown_or_missing_option_points_to_the_subcommand_help(argv: list[str], line: str) -> None:
    assert parse_error(argv) == line


# --- the options reach pyggml.models.load, from each command -----------------------------------------------------

@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_load_gets_the_options_from_every_command(command: str, loads: list[dict[str, Any]]) -> None:
    ctx = [] if command == "bench" else ["-c", "96"]
    sizes = ["-p", "24", "-n", "8", "-d", "16"] if command == "bench" else []
    code, _, err = run_cli([command, "-m", BUILTIN, *ctx, *sizes, "-b", "256", "-ub", "32", "-t", "1", "-fa", "on",
                            "-ctk", "f16", "-ctv", "f16", "-nr", "-ot", "ffn_down=0"])
    assert code == 1 and "recorded" in err
    (call,) = loads
    assert call["path"] == BUILTIN
    # bench: the largest of its tests' contexts (llama-bench's -d + -p + -n): pp24 @ d16
    assert call["n_ctx"] == (40 if command == "bench" else 96)
    assert call["n_batch"] == 32  # min(-b, -ub): the tokens of one graph
    assert (call["kv_type"], call["kv_type_v"], call["flash_attn"], call["repack"]) == ("f16", "f16", "on", False)
    assert call["override_tensor"] == [("ffn_down", 0)]
    assert [b.n_threads for b in call["backends"]] == [1]


@pytest.mark.parametrize("command", ["run", "chat", "serve"])
def test_ctx_zero_is_the_training_context(command: str, loads: list[dict[str, Any]]) -> None:
    from pyggml.cli._common import read_hparams

    assert run_cli([command, "-c", "0"])[0] == 1
    assert loads[0]["n_ctx"] == read_hparams(builtin_model_path()).n_ctx_train
    assert context_size(None, 4096, 512) == 512 and context_size(0, 4096, 512) == 4096
    assert context_size(100, 4096, 512) == 100


def test_without_cache_types_the_cache_is_f16_as_llama_cpp_s(loads: list[dict[str, Any]]) -> None:
    assert run_cli(["run"])[0] == 1
    assert (loads[0]["kv_type"], loads[0]["kv_type_v"]) == ("f16", "f16")
    assert LoadSettings(type_k="q8_0").kv_types() == ("q8_0", "f16")  # each one given alone


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_a_quantized_v_cache_without_flash_attention_fails_before_loading(command: str,
                                                                         loads: list[dict[str, Any]]) -> None:
    """llama.cpp refuses a quantized V cache with -fa off, in these words (llama_init_from_model)."""
    code, out, err = run_cli([command, "-ctk", "q8_0", "-ctv", "q4_0", "-fa", "off",
                              *(["-p", "8", "-n", "0"] if command == "bench" else []),
                              *(["--no-batch-invariant"] if command == "serve" else [])])
    assert code == 1 and out == "" and not loads
    assert one_line(err) == (f"pyggml {command}: error: -ctv q4_0 -fa off: quantized V cache requires flash_attn to "
                             f"be enabled")


@pytest.mark.parametrize("name", KV_CACHE_TYPES)
def test_every_llama_cpp_cache_type_loads_and_generates(name: str) -> None:
    """Each of llama.cpp's -ctk/-ctv types makes a cache of that type (K f16 and V that type, then K that type and
    V f16), whose greedy tokens are the F32 cache's first ones (the quantized caches round K and V, yet the
    built-in model's first tokens stand)."""
    import pyggml.models as pm

    assert KV_CACHE_TYPES == ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
    ref = pm.load(builtin_model_path(), n_ctx=32, progress=False, kv_type="f32", flash_attn="on", n_threads=1)
    try:
        ids = ref.tokenize("Once upon a time")
        want = list(ref.generate(ids, 2, None))
    finally:
        ref.free()
    for type_k, type_v in ((name, "f16"), ("f16", name)):
        settings = LoadSettings(type_k=type_k, type_v=type_v, flash_attn="on")
        model = pm.load(builtin_model_path(), n_ctx=32, progress=False, n_threads=1, **settings.load_kwargs())
        try:
            kv = model.kv
            assert (kv.type_k.name.lower(), kv.type_v.name.lower()) == (type_k, type_v)
            assert (kv.k[0].type, kv.v[0].type) == (kv.type_k, kv.type_v)
            assert list(model.generate(ids, 2, None)) == want
        finally:
            model.free()


@pytest.mark.parametrize("command, flags, n_ctx_seq", [
    ("run", ["-c", "512"], 512), ("chat", ["-c", "300"], 300), ("serve", ["-c", "600", "-np", "2"], 300)])
def test_a_context_over_the_training_context_is_warned_as_llama_cpp_does(command: str, flags: list[str],
                                                                         n_ctx_seq: int,
                                                                         loads: list[dict[str, Any]]) -> None:
    """The built-in model was trained on 256 tokens: llama.cpp's warning, in its words, per sequence (serve's -c
    is shared by its -np slots); none at the training context."""
    line = (f"pyggml {command}: warning: n_ctx_seq ({n_ctx_seq}) > n_ctx_train (256) -- possible training context "
            f"overflow")
    assert run_cli([command, *flags])[2].splitlines().count(line) == 1
    assert "n_ctx_train" not in run_cli([command, "-c", "0"])[2]


def test_the_memory_table_names_the_cache_types() -> None:
    code, _, err = run_cli(["run", "-p", "Hello", "-n", "1", "-c", "64", "-t", "1", "-ctk", "bf16", "-ctv", "q4_1",
                            "-fa", "on", "--temp", "0"])
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].split("|")[1:-1]]
    assert header == ["backend", "weights", "KV cache", "KV types", "compute", "total"]
    row = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert row[0] == "CPU#0" and row[3] == "K (bf16), V (q4_1)"


# --- -ngl: layers on the first backend that is not the CPU ---------------------------------------------------------

def torch_or_skip() -> None:
    pytest.importorskip("torch")  # the torch backend's device is not a CPU (ACCEL): -ngl's target here


@pytest.mark.parametrize("backends, ngl, names, counts", [
    (["torch"], "2", ["torch", "cpu"], [2]),  # the CPU appended: it takes the rest
    (["torch"], "0", ["torch", "cpu"], [0]),  # nothing offloaded
    (["torch"], "99", ["torch"], [4]),  # every layer: no CPU needed
    (["torch"], "all", ["torch"], [4]),
    (["torch", "cpu"], "3", ["torch", "cpu"], [3]),
    (["cpu", "torch"], "1", ["cpu", "torch"], [3, 1]),  # a CPU before it takes the first layers, as llama.cpp
    (["cpu", "torch", "cpu"], "1", ["cpu", "torch", "cpu"], [3, 1]),
], ids=["append-cpu", "zero", "99", "all", "cpu-after", "cpu-before", "cpu-both"])
def test_ngl_places_layers_on_the_first_backend_that_is_not_the_cpu(backends: list[str], ngl: str, names: list[str],
                                                                    counts: list[int],
                                                                    loads: list[dict[str, Any]]) -> None:
    torch_or_skip()
    argv = ["run", *[a for b in backends for a in ("--backend", b)], "-ngl", ngl]
    assert run_cli(argv)[0] == 1
    call = loads[0]
    assert [b.name() for b in call["backends"]] == [{"torch": "Torch(cpu)", "cpu": "CPU"}[n] for n in names]
    assert call["n_layers_on"] == counts


def test_ngl_with_only_the_cpu_keeps_every_layer_there_and_says_so(loads: list[dict[str, Any]]) -> None:
    code, _, err = run_cli(["run", "-ngl", "99"])
    assert code == 1
    assert ("pyggml run: warning: -ngl 99: no backend but the CPU (give one with --backend): every layer stays on the "
            "CPU") in err.splitlines()
    assert loads[0]["n_layers_on"] is None and [b.name() for b in loads[0]["backends"]] == ["CPU"]
    code, _, err = run_cli(["run", "-ngl", "0"])
    assert loads[1]["n_layers_on"] is None and "warning" not in err  # -ngl 0 asks for nothing: nothing to say


def test_ngl_and_another_placement(loads: list[dict[str, Any]]) -> None:
    """-ngl covering every layer leaves -ts to place them (llama.cpp's `-ngl 99 -ts 1,1`); fewer is refused."""
    torch_or_skip()
    two = ["--backend", "torch", "--backend", "cpu"]
    assert run_cli(["run", *two, "-ngl", "99", "-ts", "1,1"])[0] == 1
    assert loads[0]["tensor_split"] == [1.0, 1.0] and loads[0]["n_layers_on"] is None
    code, _, err = run_cli(["run", *two, "-ngl", "2", "-ts", "1,1"])
    assert code == 1 and len(loads) == 1
    assert one_line(err) == ("pyggml run: error: -ngl 2 and --tensor-split both place the layers (2 of 4 on the first "
                             "backend that is not the CPU, or --tensor-split's): give one")


@pytest.mark.slow
def test_ngl_end_to_end_writes_the_text_of_one_backend() -> None:
    torch_or_skip()
    greedy = ["run", "-p", "The module", "-n", "6", "--temp", "0", "-t", "1", "-v"]
    code, one, _ = run_cli(greedy)
    assert code == 0
    code, out, err = run_cli([*greedy, "--backend", "torch", "-ngl", "2"])
    assert code == 0, err
    assert out == one
    assert "backends: Torch(cpu)#0, CPU#1; layers: 0:Torch(cpu)#0, 1:Torch(cpu)#0, 2:CPU#1, 3:CPU#1" in err


# --- sampling options reach the sampler ----------------------------------------------------------------------------

def test_sampling_options_make_the_sampler() -> None:
    from pyggml.cli.run import make_sampler

    args = parse(["run", "--temp", "0.7", "--top-k", "5", "--top-p", "0.5", "--min-p", "0.2", "--repeat-penalty",
                  "1.3", "-s", "9"])
    sampler = make_sampler(args, args.seed)
    assert (sampler.temperature, sampler.top_k, sampler.top_p, sampler.min_p) == (0.7, 5, 0.5, 0.2)
    assert (sampler.repeat_penalty, sampler.seed) == (1.3, 9)


@pytest.mark.slow
def test_run_with_llama_cpp_flags_end_to_end() -> None:
    """The issue's command shape on the built-in model: -m, -p, -n, -c, -ngl 0, -t, -ctk/-ctv f16, -fa on, --temp 0
    write the model API's greedy text with the same cache type and attention."""
    import pyggml.models as pm

    code, out, err = run_cli(["run", "-m", BUILTIN, "-p", "The module", "-n", "8", "-c", "64", "-ngl", "0", "-t", "1",
                              "-ctk", "f16", "-ctv", "f16", "-fa", "on", "--temp", "0", "-s", "1", "-v"])
    assert code == 0, err
    model = pm.load(builtin_model_path(), n_ctx=64, progress=False, kv_type="f16", flash_attn="on", n_threads=1)
    try:
        ids = model.tokenize("The module")
        want = model.detokenize(ids + list(model.generate(ids, 8, None)))
        kv_bytes = model.hparams.n_layer * 64 * 2 * model.hparams.n_embd_gqa * 2  # layers, cells, K and V, F16
    finally:
        model.free()
    assert out == want + "\n"
    assert "n_ctx 64" in err
    assert re.search(rf"^\| CPU#0 +\| +[^|]+\| +{re.escape(fmt_bytes(kv_bytes))} \|", err, re.M), err


def test_chat_p_is_the_first_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-cli's -p in a chat: answered first, then stdin's lines."""
    import sys

    monkeypatch.setattr(sys, "stdin", io.StringIO("second\n"))
    code, out, err = run_cli(["chat", "-p", "first", "-n", "3", "--temp", "0", "-c", "128", "-t", "1"])
    assert code == 0, err
    assert len(out.splitlines()) == 2  # two replies
    assert "2 turn(s)" in err


# --- bench: llama-bench's lists, tests, outputs ---------------------------------------------------------------------

def test_bench_lists_make_every_combination_in_llama_bench_order() -> None:
    args = parse(["bench", "-p", "64,128", "-n", "16,32", "-t", "1,2", "-pg", "8,4", "-d", "0,16", "-r", "2"])
    tests = bench.tests_of(args, ["m.gguf"])
    names = ["pp64", "pp128", "tg16", "tg32", "pp8+tg4"]  # the pp tests, the tg tests, then -pg's
    assert [(t.n_threads, t.n_depth, t.name()) for t in tests] == [
        (nt, nd, name + (f" @ d{nd}" if nd else "")) for nt in (1, 2) for nd in (0, 16) for name in names]
    assert args.repetitions == 2
    # ranges and repeats, as llama-bench's parse_int_range
    assert parse(["bench", "-p", "16-64*2", "-p", "100"]).n_prompt == [16, 32, 64, 100]
    assert parse(["bench", "-n", "1-7+3"]).n_gen == [1, 4, 7]
    args = parse(["bench", "-b", "64,128", "-ub", "32", "-ctk", "f16,f32", "-fa", "0,1", "-ngl", "0,99", "-ts",
                  "1/1,3;1", "-ot", "a=0;b=1,c=0"])
    assert (args.batch_size, args.ubatch_size, args.cache_type_k, args.flash_attn) == ([64, 128], [32], ["f16", "f32"],
                                                                                       ["off", "on"])
    assert (args.n_gpu_layers, args.tensor_split, args.override_tensor) == ([0, 99], ["1/1", "3;1"], ["a=0;b=1", "c=0"])
    assert len(bench.tests_of(args, ["m.gguf"])) == 2 * 2 * 2 * 2 * 2 * 2 * 2  # b, ctk, fa, ngl, ts, ot x (pp, tg)


def test_bench_ts_and_ot_sets_become_plans() -> None:
    args = parse(["bench", "--backend", "cpu", "--backend", "cpu", "-ts", "3;1", "-ot", "a=0;b=1"])
    (test, _) = bench.tests_of(args, [BUILTIN])
    plan = bench._plan(args, test)
    assert plan.tensor_split == [3.0, 1.0] and plan.override_tensor == ["a=0", "b=1"]
    assert bench._tensor_split_field(test) == "3.00/1.00"


def bench_json(argv: list[str]) -> list[dict[str, Any]]:
    code, out, err = run_cli(["bench", *argv, "-o", "json"])
    assert code == 0, err
    return json.loads(out)


def test_bench_json_has_llama_bench_s_fields_per_test() -> None:
    """`bench -p 16,32 -n 4 -t 1,2 -o json`: one object per test in llama-bench's order, with its fields."""
    rows = bench_json(["-p", "16,32", "-n", "4", "-t", "1,2", "-r", "2"])  # the built-in model: no MODEL given
    assert [(r["n_threads"], r["n_prompt"], r["n_gen"]) for r in rows] == [
        (1, 16, 0), (1, 32, 0), (1, 0, 4), (2, 16, 0), (2, 32, 0), (2, 0, 4)]
    first = rows[0]
    assert list(first)[:6] == ["build_commit", "cpu_info", "gpu_info", "backends", "model_filename", "model_type"]
    assert list(first)[-6:] == ["avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts"]
    assert first["model_filename"] == BUILTIN and first["backends"] == "CPU"
    assert (first["n_batch"], first["n_ubatch"], first["type_k"], first["flash_attn"]) == (2048, 512, "f16", -1)
    assert (first["n_gpu_layers"], first["tensor_split"], first["tensor_buft_overrides"]) == (-1, "0.00", "none")
    from pyggml.gguf.reader import read_gguf

    gf = read_gguf(builtin_model_path())
    assert first["model_size"] == sum(t.nbytes for t in gf.tensors.values())
    assert first["model_n_params"] == sum(t.nelements() for t in gf.tensors.values())
    for r in rows:
        assert len(r["samples_ns"]) == 2 and all(ns > 0 for ns in r["samples_ns"])
        n = r["n_prompt"] + r["n_gen"]
        assert r["samples_ts"] == pytest.approx([1e9 * n / ns for ns in r["samples_ns"]])
        assert r["avg_ts"] == pytest.approx(sum(r["samples_ts"]) / 2)
        assert r["avg_ns"] == int(sum(r["samples_ns"]) / 2)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["test_time"])


def test_bench_depth_pg_and_settings_in_the_fields() -> None:
    rows = bench_json(["-p", "8", "-n", "0", "-pg", "4,2", "-d", "6", "-r", "1", "-t", "1", "-ctk", "f16", "-ctv",
                       "f16", "-fa", "on", "-b", "16", "-ub", "8"])
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in rows] == [(8, 0, 6), (4, 2, 6)]
    for r in rows:
        assert (r["type_k"], r["type_v"], r["flash_attn"], r["n_batch"], r["n_ubatch"]) == ("f16", "f16", 1, 16, 8)
        assert r["stddev_ns"] == 0 and r["stddev_ts"] == 0.0  # one repetition


def test_bench_csv_and_jsonl() -> None:
    code, out, err = run_cli(["bench", "-p", "8", "-n", "2", "-r", "1", "-t", "1", "-o", "csv"])
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["n_prompt"], r["n_gen"]) for r in rows] == [("8", "0"), ("0", "2")]
    assert rows[0]["repack"] == "true" and rows[0]["n_threads"] == "1"
    assert out.splitlines()[1].startswith('"pyggml ')  # every cell in quotes, as llama-bench's csv
    code, out, err = run_cli(["bench", "-p", "8", "-n", "2", "-r", "1", "-t", "1", "-o", "jsonl"])
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(r["n_prompt"], r["n_gen"]) for r in lines] == [(8, 0), (0, 2)]


def test_bench_md_shows_the_options_given() -> None:
    """As llama-bench's table: a column for each option given a value other than its default."""
    code, out, err = run_cli(["bench", "-p", "8", "-n", "0", "-r", "1", "-t", "1", "-ub", "4", "-ctk", "f16", "-ctv",
                              "f16", "-fa", "on,off", "-d", "0,4"])
    assert code == 0, err
    lines = out.splitlines()
    header = [c.strip() for c in lines[0].split("|")[1:-1]]
    assert header == ["model", "size", "params", "backend", "threads", "n_ubatch", "type_k", "type_v", "fa", "test",
                      "t/s"]
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[2:]]
    assert [(c[4:9], c[9]) for c in cells] == [
        (["1", "4", "f16", "f16", "1"], "pp8"), (["1", "4", "f16", "f16", "1"], "pp8 @ d4"),
        (["1", "4", "f16", "f16", "0"], "pp8"), (["1", "4", "f16", "f16", "0"], "pp8 @ d4")]
    assert all(c[0] == "builtin-llama.gguf" for c in cells)


def test_bench_checks_every_option_before_measuring() -> None:
    code, out, err = run_cli(["bench", "-p", "8", "-n", "0", "-r", "1", "-ctv", "f16,q8_0", "-fa", "0"])
    assert code == 1 and out == ""  # nothing measured: the second type fails first
    assert one_line(err) == ("pyggml bench: error: -ctv q8_0 -fa off: quantized V cache requires flash_attn to be "
                             "enabled")


# --- SmolLM2 with the issue's flags --------------------------------------------------------------------------------

def test_smollm2_with_the_issue_flags(smollm2_path: Path) -> None:
    """`pyggml run -m SMOLLM2 -p "The capital of France is" -n 16 -c 2048 -ngl 0 -t 2 -ctk q8_0 -ctv q8_0 -fa on
    --temp 0` writes the model API's greedy text over the same q8_0 cache, and the memory table names its types."""
    import pyggml.models as pm

    code, out, err = run_cli(["run", "-m", str(smollm2_path), "-p", "The capital of France is", "-n", "16", "-c",
                              "2048", "-ngl", "0", "-t", "2", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on", "--temp",
                              "0"])
    assert code == 0, err
    model = pm.load(smollm2_path, n_ctx=2048, progress=False, kv_type="q8_0", kv_type_v="q8_0", flash_attn="on",
                    n_threads=2)
    try:
        ids = model.tokenize("The capital of France is")
        want = model.detokenize(ids + list(model.generate(ids, 16, None)))
    finally:
        model.free()
    assert out == want + "\n"
    assert "Paris" in out
    assert "| K (q8_0), V (q8_0) |" in err


def test_plan_from_args_carries_ngl() -> None:
    assert plan_from_args(parse(["run", "-ngl", "7"])).n_gpu_layers == 7
    assert plan_from_args(parse(["run"])).n_gpu_layers is None
