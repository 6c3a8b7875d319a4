"""Layer splits on the command line, said as llama.cpp users say them: `--n-layers-on` by position
(N0,N1,... / I=N / NAME#I=N) where backend names repeat, `-ts/--tensor-split` proportions and
`-ot/--override-tensor REGEX=BACKEND`, over several CPU backends with the built-in model (4 layers).
Every placement must write the greedy text of one backend; every bad option is one line naming it."""

from __future__ import annotations

import contextlib
import io
import re

import pytest
from cli_util import one_line

from pyggml.cli._common import CLIError, backend_plan, backend_plan_of
from pyggml.cli.main import main
from pyggml.models.builtin import builtin_model_path

GREEDY = ["run", "-p", "The module", "-n", "8", "--temp", "0", "--seed", "1"]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `pyggml ARGV`."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def cpus(n: int) -> list[str]:
    return [a for _ in range(n) for a in ("--backend", "cpu")]


@pytest.fixture(scope="module")
def one_backend_text() -> str:
    """What `pyggml run` writes with the whole model on one CPU backend."""
    code, out, err = run_cli(GREEDY)
    assert code == 0, err
    return out


def layers_line(err: str) -> list[int]:
    """The backend position of each layer from `run -v`'s "backends: ...; layers: 0:CPU#0, ..." line."""
    m = re.search(r"^backends: .*; layers: (.*)$", err, re.M)
    assert m is not None, err
    return [int(x) for x in re.findall(r"\d+:CPU#(\d+)", m.group(1))]


@pytest.mark.parametrize("n_backends, split, want", [
    (3, ["--n-layers-on", "1,1"], [0, 1, 2, 2]),  # the rest on the backend after the last count
    (3, ["--n-layers-on", "1,2,1"], [0, 1, 1, 2]),
    (3, ["--n-layers-on", "CPU#1=1", "--n-layers-on", "0=2"], [0, 0, 1, 2]),  # as `run -v` labels them
    (4, ["--n-layers-on", "1,1,1,1"], [0, 1, 2, 3]),
    (4, ["--n-layers-on", "0,2"], [1, 1, 2, 2]),  # none on the first
    (4, ["--n-layers-on", "2=3"], [2, 2, 2, 3]),  # backends 0 and 1 get none, backend 3 the rest
], ids=["3-counts-rest", "3-counts-all", "3-by-position", "4-one-each", "4-none-first", "4-one-position"])
@pytest.mark.slow
def test_counts_by_position_place_the_layers_and_keep_the_text(n_backends: int, split: list[str], want: list[int],
                                                                one_backend_text: str) -> None:
    code, out, err = run_cli([*GREEDY, *cpus(n_backends), *split, "-v"])
    assert code == 0, err
    assert layers_line(err) == want
    assert out == one_backend_text


def test_the_same_name_twice_once_gave_1_3_0_layers_and_now_asks_for_the_position() -> None:
    """`--n-layers-on cpu=1 --n-layers-on cpu=1` over three CPU backends set the first one's count twice."""
    code, _, err = run_cli([*GREEDY, *cpus(3), "--n-layers-on", "cpu=1", "--n-layers-on", "cpu=1"])
    assert code == 1
    line = one_line(err)
    assert "--n-layers-on cpu=1: 'cpu' names 3 backends (positions 0, 1, 2)" in line
    assert "cpu#0 or 0" in line


def test_a_unique_name_still_gives_its_count() -> None:
    assert backend_plan(["torch", "cpu", "cpu"], ["torch=2"]) == (["torch", "cpu", "cpu"], [2])
    assert backend_plan(["torch", "cpu", "cpu"], ["cpu#2=1", "0=1"]) == (["torch", "cpu", "cpu"], [1, 0, 1])
    assert backend_plan(["cpu", "cpu"], ["3"]) == (["cpu", "cpu"], [3])


@pytest.mark.parametrize("ts, want", [
    # llama.cpp: splits = cumulative proportions / their sum; layer il (the output is il = 4) on the first
    # backend whose split point is greater than il / 5 (the points il / 5 are 0, .2, .4, .6, .8)
    ("1,1,2", [0, 0, 1, 2]),  # points .25 .5 1
    ("1/1/2", [0, 0, 1, 2]),  # '/' separates too, as in llama.cpp
    ("0,1,1", [1, 1, 1, 2]),  # points 0 .5 1: a zero takes no layer
    ("1,0,1", [0, 0, 0, 2]),  # points .5 .5 1
    ("1,1,1", [0, 0, 1, 1]),  # points .33 .67 1: the third backend gets only the output layer
], ids=["1-1-2", "slashes", "zero-first", "zero-middle", "equal"])
@pytest.mark.slow
def test_tensor_split_places_the_layers_as_llama_cpp(ts: str, want: list[int], one_backend_text: str) -> None:
    code, out, err = run_cli([*GREEDY, *cpus(3), "-ts", ts, "-v"])
    assert code == 0, err
    assert layers_line(err) == want
    # the output layer is on the third backend in each case: said apart where no layer is
    assert ("\n  output layer: CPU#2\n" in err) == (want[-1] != 2)
    assert out == one_backend_text


@pytest.mark.slow
def test_override_tensor_moves_the_weights_and_keeps_the_text(one_backend_text: str) -> None:
    code, out, err = run_cli([*GREEDY, *cpus(2), "-ot", "ffn_down=CPU#1", "-v"])
    assert code == 0, err
    assert out == one_backend_text
    assert layers_line(err) == [0, 0, 0, 0]  # the layers stay where they were
    m = re.search(r"^placed by --override-tensor: (.*)$", err, re.M)
    assert m is not None, err
    assert m.group(1).startswith("blk.0.ffn_down.weight:CPU#1, blk.1.ffn_down.weight:CPU#1")
    weights = {m.group(1): m.group(2) for m in re.finditer(r"^\| (CPU#\d) +\| +([\d.]+ \w+) ", err, re.M)}
    assert weights["CPU#1"] != "0 B"  # the four ffn_down weights


def test_override_tensor_takes_several_pairs_in_one_value_as_llama_cpp(one_backend_text: str) -> None:
    """llama.cpp's "-ot A=X,B=Y"; a ',' inside a regex ({1,2}) stays in the regex."""
    code, out, err = run_cli([*GREEDY, *cpus(3), "-ot", r"blk\.[0-9]{1,1}\.ffn_up=2,ffn_down=1", "-v"])
    assert code == 0, err
    assert out == one_backend_text
    assert "blk.0.ffn_up.weight:CPU#2" in err and "blk.0.ffn_down.weight:CPU#1" in err
    assert backend_plan_of(["cpu", "cpu"], override_tensor=["a=0,b{1,2}=cpu#1"]).overrides() == [
        ("a", 0), ("b{1,2}", 1)]


def test_bench_takes_the_splits_and_says_them() -> None:
    """llama-bench's -ts (proportions between '/') and -ot, each a column of the table."""
    code, out, err = run_cli(["bench", "-p", "4", "-n", "2", "-r", "1", *cpus(3), "-ts", "1/1/2",
                              "-ot", "ffn_down=0", str(builtin_model_path())])
    assert code == 0, err
    header = [c.strip() for c in out.splitlines()[0].split("|")[1:-1]]
    assert header == ["model", "size", "params", "backend", "layers", "threads", "ts", "ot", "test", "t/s"]
    cells = [c.strip() for c in out.splitlines()[2].split("|")[1:-1]]
    assert cells[3:5] == ["CPU×3", "2/1/1"] and cells[6:8] == ["1.00/1.00/2.00", "ffn_down=0"]


THREE = cpus(3)


@pytest.mark.parametrize("argv, words", [
    (["--n-layers-on", "cpu"], ["--n-layers-on wants BACKEND=N", "'cpu'"]),
    (["--n-layers-on", "1,x"], ["--n-layers-on '1,x'", "'x' is not a layer count"]),
    (["--n-layers-on", "1,-1"], ["--n-layers-on '1,-1'", ">= 0, got -1"]),
    (["--n-layers-on", "1,1,1,1"], ["4 counts for 3 backend(s)", "cpu#0, cpu#1, cpu#2"]),
    (["--n-layers-on", "5=1"], ["--n-layers-on 5=1", "no backend 5"]),
    (["--n-layers-on", "torch#1=1"], ["backend 1 is cpu#1, not 'torch'"]),
    (["--n-layers-on", "vulkan=1"], ["'vulkan' is not one of the backends (cpu#0, cpu#1, cpu#2)"]),
    (["--n-layers-on", "1,1", "--n-layers-on", "1=2"], ["backend 1 (cpu#1) two counts: 1", "and 2"]),
    (["-ts", "1,1"], ["--tensor-split '1,1'", "2 proportion(s) for 3 backend(s)"]),
    (["-ts", "1,1,1,1"], ["4 proportion(s) for 3 backend(s)"]),
    (["-ts", "1,-1,1"], ["--tensor-split '1,-1,1'", "finite and >= 0, got -1.0"]),
    (["-ts", "0,0,0"], ["--tensor-split '0,0,0'", "all 0"]),
    (["-ts", "1,inf,1"], ["finite and >= 0, got inf"]),
    (["-ts", "1,x,1"], ["--tensor-split '1,x,1'", "'x' is not a number"]),
    (["-ts", "1,1,2", "--n-layers-on", "1"], ["--tensor-split and --n-layers-on both given"]),
    (["-ot", "ffn_down"], ["--override-tensor wants REGEX=BACKEND", "'ffn_down'"]),
    (["-ot", "ffn[=1"], ["--override-tensor 'ffn[=1'", "bad regex 'ffn['"]),
    (["-ot", "ffn=vulkan"], ["'vulkan' is not one of the backends"]),
    (["-ot", "ffn=cpu"], ["'cpu' names 3 backends", "cpu#0 or 0"]),
    (["-ot", "ffn=CPU#9"], ["there is no backend 9"]),
    (["-ot", "ffn="], ["no backend after '='"]),
    (cpus(14), ["17 backends exceed GGML_SCHED_MAX_BACKENDS = 16"]),
])
@pytest.mark.parametrize("command", ["run", "bench"])
@pytest.mark.slow
def test_bad_split_options_fail_in_one_line_naming_them(command: str, argv: list[str], words: list[str]) -> None:
    model = [] if command == "run" else [str(builtin_model_path())]
    if command == "bench" and "-ts" in argv:  # llama-bench's -ts: '/' between proportions, ',' between splits
        i = argv.index("-ts") + 1
        argv = [*argv[:i], argv[i].replace(",", "/"), *argv[i + 1:]]
        words = [w.replace(",", "/") if w.startswith("--tensor-split") else w for w in words]
    code, out, err = run_cli([command, *model, *THREE, *argv, "-n", "1"])
    assert code == 1 and out == ""
    line = one_line(err)
    assert line.startswith(f"pyggml {command}: error: ")
    for w in words:
        assert w in line


def test_the_errors_are_cli_errors() -> None:
    for kw in ({"layers_on": ["cpu=1"]}, {"tensor_split": "1,1"}, {"override_tensor": ["x[=0"]}):
        with pytest.raises(CLIError):
            plan = backend_plan_of(["cpu", "cpu", "cpu"], **kw)
            plan.load_kwargs()


@pytest.mark.parametrize("command", ["run", "bench", "chat", "serve"])
def test_no_repack_reaches_load_as_llama_cpp_flag(command: str) -> None:
    """-nr/--no-repack (llama.cpp's flag) gives load repack=False; without it the CPU repacks (the default)."""
    from pyggml.cli._common import plan_from_args
    from pyggml.cli.main import build_parser

    parser = build_parser()
    for flag, want in (([], True), (["-nr"], False), (["--no-repack"], False)):
        args = parser.parse_args([command, *flag, str(builtin_model_path())])
        assert plan_from_args(args).load_kwargs()["repack"] is want, (command, flag)
