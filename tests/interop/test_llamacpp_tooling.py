"""pyggml.testing.llamacpp: the cache layout, the stamp, the lock, the errors, the command line.

A fake toolchain stands in for the real one (a `cmake` script that records
its calls and makes the targets' files), so these tests take seconds and do not
depend on the real build in ~/.cache/pyggml.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from pyggml.testing import llamacpp
from pyggml.testing.llamacpp import BuildError, LlamaCppError, NoCompilerError

FAKE_CMAKE = """\
#!{python}
import json, os, pathlib, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_CMAKE_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
step = "build" if args[0] == "--build" else "configure"
if os.environ.get("FAKE_CMAKE_FAIL") == step:
    print("error: fake " + step + " failure")
    sys.exit(2)
if step == "configure":
    build = pathlib.Path(args[args.index("-B") + 1])
    build.mkdir(parents=True, exist_ok=True)
    (build / "CMakeCache.txt").write_text("")
    sys.exit(0)
build = pathlib.Path(args[1])
targets = args[args.index("--target") + 1: args.index("--parallel")]
print("[ 10%] Building C object")
time.sleep(float(os.environ.get("FAKE_CMAKE_SLEEP", "0")))
(build / "bin").mkdir(parents=True, exist_ok=True)
for t in targets:
    if t == "makes-nothing":
        continue
    name = "lib" + t + ".so" if t in ("ggml-base", "ggml-cpu") else t
    (build / "bin" / name).write_text("")
print("[100%] Built")
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A machine with a fake cc, c++, make and cmake only, a cache in tmp_path with the source already there."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "cmake").write_text(FAKE_CMAKE.format(python=sys.executable))
    for name in ("cc", "c++", "make"):
        (tools / name).write_text("#!/bin/sh\nexit 0\n")
    for f in tools.iterdir():
        f.chmod(0o755)
    calls = tmp_path / "cmake-calls.jsonl"
    calls.touch()
    cache = tmp_path / "cache"
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setenv("PYGGML_CACHE", str(cache))
    monkeypatch.setenv("FAKE_CMAKE_LOG", str(calls))
    for var in ("CC", "CXX", "CFLAGS", "CXXFLAGS", "FAKE_CMAKE_FAIL", "FAKE_CMAKE_SLEEP"):
        monkeypatch.delenv(var, raising=False)
    p = llamacpp.paths()
    p.llama_cpp.mkdir(parents=True)
    (p.llama_cpp / "CMakeLists.txt").write_text("# fake\n")
    return {"calls": calls, "cache": cache, "tools": tools}


def _calls(fake: dict[str, Path]) -> list[list[str]]:
    return [json.loads(line) for line in fake["calls"].read_text().splitlines()]


def test_cpu_has_amx_reads_only_the_flags_line() -> None:
    assert llamacpp.cpu_has_amx("model name\t: Xeon\nflags\t\t: fpu sse2 avx512f amx_bf16 amx_tile amx_int8\n")
    assert not llamacpp.cpu_has_amx("model name\t: amx lookalike\nflags\t\t: fpu sse2 avx512f avx512_bf16\n")
    assert not llamacpp.cpu_has_amx("")


def test_cmake_args_are_oracles_plus_no_amx_flags_only_with_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CFLAGS", raising=False)
    monkeypatch.delenv("CXXFLAGS", raising=False)
    with_amx = llamacpp.cmake_args(amx=True)
    assert {"-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DGGML_RPC=ON", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_OPENSSL=OFF"} <= set(with_amx)
    assert "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in with_amx
    assert "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in with_amx
    without = llamacpp.cmake_args(amx=False)
    assert "-DCMAKE_C_FLAGS=" in without and "-DCMAKE_CXX_FLAGS=" in without  # given, to reset a cached value
    monkeypatch.setenv("CFLAGS", "-O1 -g")
    assert "-DCMAKE_C_FLAGS=-O1 -g -mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in llamacpp.cmake_args(amx=True)


def test_paths_follow_the_cache_layout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYGGML_CACHE", str(tmp_path))
    p = llamacpp.paths()
    assert p.llama_cpp == tmp_path / "llama.cpp/src/llama_cpp_python-0.3.36/vendor/llama.cpp"
    assert p.bin == tmp_path / "llama.cpp/build/bin"
    assert p.tarball == tmp_path / "llama.cpp/src/llama_cpp_python-0.3.36.tar.gz"
    monkeypatch.delenv("PYGGML_CACHE")
    assert llamacpp.paths().bin == Path.home() / ".cache/pyggml/llama.cpp/build/bin"


def test_no_compiler_is_the_one_error_of_its_kind(fake: dict[str, Path]) -> None:
    for name in ("cc", "c++"):
        (fake["tools"] / name).unlink()
    with pytest.raises(NoCompilerError, match="no C and C\\+\\+ compiler"):
        llamacpp.find_toolchain()
    with pytest.raises(NoCompilerError):
        llamacpp.require_tools(["llama-simple"])
    assert _calls(fake) == []  # nothing was tried
    assert not issubclass(NoCompilerError, BuildError) and issubclass(NoCompilerError, LlamaCppError)


def test_a_missing_cc_named_by_the_environment_is_no_compiler(fake: dict[str, Path],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "ccache-that-is-not-there gcc")
    with pytest.raises(NoCompilerError, match="no C compiler"):
        llamacpp.find_toolchain()


def test_build_configures_and_builds_once_then_trusts_the_stamp(fake: dict[str, Path]) -> None:
    p = llamacpp.paths()
    found = llamacpp.build(["llama-simple", "ggml-base"], amx=False)
    assert found == {"llama-simple": p.bin / "llama-simple", "ggml-base": p.bin / "libggml-base.so"}
    calls = _calls(fake)
    assert [c[0] for c in calls] == ["-S", "--build"]
    assert calls[0][:4] == ["-S", str(p.llama_cpp), "-B", str(p.build)]
    assert calls[1][calls[1].index("--target") + 1: calls[1].index("--parallel")] == ["llama-simple", "ggml-base"]
    stamp = json.loads(p.stamp.read_text())
    assert stamp["targets"] == ["ggml-base", "llama-simple"] and stamp["sdist"] == "llama-cpp-python==0.3.36"

    assert llamacpp.build(["llama-simple"], amx=False) == {"llama-simple": p.bin / "llama-simple"}
    assert len(_calls(fake)) == 2  # cached: cmake not run again

    llamacpp.build(["llama-bench"], amx=False)  # a new target: built without configuring again
    assert [c[0] for c in _calls(fake)] == ["-S", "--build", "--build"]
    assert json.loads(p.stamp.read_text())["targets"] == ["ggml-base", "llama-bench", "llama-simple"]


def test_find_tool_needs_the_current_configuration(fake: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    assert llamacpp.find_tool("llama-simple") is None
    llamacpp.build(["llama-simple"])
    assert llamacpp.find_tool("llama-simple") == llamacpp.paths().bin / "llama-simple"
    assert llamacpp.find_tool("llama-bench") is None
    monkeypatch.setenv("CFLAGS", "-O1")  # another configuration: the build is stale
    assert llamacpp.find_tool("llama-simple") is None


def test_changed_flags_reconfigure(fake: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    llamacpp.build(["llama-simple", "llama-bench"], amx=False)
    monkeypatch.setenv("CFLAGS", "-O1")
    llamacpp.build(["llama-simple"], amx=False)
    calls = _calls(fake)
    assert [c[0] for c in calls] == ["-S", "--build", "-S", "--build"]
    assert "-DCMAKE_C_FLAGS=-O1" in calls[2]
    # llama-bench was built with the old flags: it is not listed until it is built again
    assert json.loads(llamacpp.paths().stamp.read_text())["targets"] == ["llama-simple"]


@pytest.mark.parametrize("step", ["configure", "build"])
def test_a_failed_build_is_a_build_error_with_the_log(fake: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                      step: str) -> None:
    monkeypatch.setenv("FAKE_CMAKE_FAIL", step)
    with pytest.raises(BuildError, match=f"fake {step} failure") as info:
        llamacpp.require_tools(["llama-simple"])
    assert str(llamacpp.paths().log) in str(info.value)
    assert not llamacpp.paths().stamp.exists()
    monkeypatch.delenv("FAKE_CMAKE_FAIL")
    assert llamacpp.require_tool("llama-simple").name == "llama-simple"  # the next call builds


def test_a_target_without_output_is_a_build_error(fake: dict[str, Path]) -> None:
    with pytest.raises(BuildError, match="made no makes-nothing"):
        llamacpp.build(["llama-simple", "makes-nothing"])


def test_require_tools_without_building(fake: dict[str, Path]) -> None:
    with pytest.raises(BuildError, match="not built"):
        llamacpp.require_tools(["llama-simple"], build_missing=False)
    assert _calls(fake) == []


def test_two_processes_build_once(fake: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CMAKE_SLEEP", "1.5")  # the second process starts while the first builds
    code = "from pyggml.testing.llamacpp import build; print(build(['llama-simple'])['llama-simple'])"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    assert {out.strip() for out, _ in outs} == {str(llamacpp.paths().bin / "llama-simple")}
    assert [c[0] for c in _calls(fake)] == ["-S", "--build"]


def test_sdist_is_extracted_from_the_cached_tarball(fake: dict[str, Path], tmp_path: Path) -> None:
    p = llamacpp.paths()
    (p.llama_cpp / "CMakeLists.txt").unlink()
    staging = tmp_path / "staging" / p.sdist.name / "vendor" / "llama.cpp"
    staging.mkdir(parents=True)
    (staging / "CMakeLists.txt").write_text("# from the tarball\n")
    (staging / ".git").write_text("gitdir: ../../.git/modules/vendor/llama.cpp\n")
    head = staging.parents[1] / ".git" / "modules" / "vendor" / "llama.cpp" / "HEAD"
    head.parent.mkdir(parents=True)
    head.write_text("0c1e57098bba43ac29e6e3b677cdceebdd22334f\n")
    with tarfile.open(p.tarball, "w:gz") as tar:  # present: no download
        tar.add(staging.parents[1], arcname=p.sdist.name)
    assert llamacpp.ensure_source(p) == p.llama_cpp
    assert (p.llama_cpp / "CMakeLists.txt").read_text() == "# from the tarball\n"
    llamacpp.build(["llama-simple"])
    assert json.loads(p.stamp.read_text())["commit"] == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


def test_command_line(fake: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    bin_dir = llamacpp.paths().bin
    assert llamacpp.main(["-q", "path", "llama-simple"]) == 1
    assert "not built" in capsys.readouterr().err
    assert llamacpp.main(["-q", "build", "llama-simple", "llama-tokenize"]) == 0
    assert capsys.readouterr().out.split() == [str(bin_dir / "llama-simple"), str(bin_dir / "llama-tokenize")]
    assert llamacpp.main(["-q", "path", "llama-simple"]) == 0
    assert capsys.readouterr().out.strip() == str(bin_dir / "llama-simple")
    (fake["tools"] / "cc").unlink()
    assert llamacpp.main(["-q", "build", "llama-bench"]) == 3  # no compiler: its own exit status
    assert "no C compiler" in capsys.readouterr().err


def test_command_line_in_a_fresh_process(fake: dict[str, Path]) -> None:
    r = subprocess.run([sys.executable, "-m", "pyggml.testing.llamacpp", "-v", "build", "llama-simple"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(llamacpp.paths().bin / "llama-simple")
    # progress goes to stderr with -v: what is built, where, and the end
    assert "targets llama-simple" in r.stderr and "build: done" in r.stderr, textwrap.shorten(r.stderr, 500)
    # stderr not a terminal and no -v: quiet (the build is cached now: it says nothing else either)
    (llamacpp.paths().bin / "llama-tokenize").unlink(missing_ok=True)
    r = subprocess.run([sys.executable, "-m", "pyggml.testing.llamacpp", "build", "llama-tokenize"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr


# --- llama.cpp's tests: their own build folder, the RPC-devices patch ---

MAIN_OF_TEST_BACKEND_OPS = """struct test_case {
    test_status_t eval(ggml_backend_t backend1, ggml_backend_t backend2, const char * op_names_filter) {
        if (!matches_filter(out, op_names_filter)) {
            //printf("  %s: skipping\\n", op_desc(out).c_str());
            return test_status_t::SKIPPED;
        }

        // check if the backends support the ops
        return test_status_t::OK;
    }
};

int main(int argc, char ** argv) {
    // load and enumerate backends
    ggml_backend_load_all();

    return 0;
}
"""


def _with_test_source(fake: dict[str, Path]) -> Path:
    source = llamacpp.paths().llama_cpp / "tests" / "test-backend-ops.cpp"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(MAIN_OF_TEST_BACKEND_OPS)
    return source


def test_a_test_target_builds_in_its_own_folder_with_tests_on_and_the_patch(fake: dict[str, Path]) -> None:
    source = _with_test_source(fake)
    tools, tests = llamacpp.paths(), llamacpp.paths(tests=True)
    assert tests.build == tools.build.parent / "build-tests" and tests.llama_cpp == tools.llama_cpp
    found = llamacpp.build(["llama-simple", "test-backend-ops"])  # this machine's configuration, as find_tool's
    assert found == {"llama-simple": tools.bin / "llama-simple", "test-backend-ops": tests.bin / "test-backend-ops"}
    configures = [c for c in _calls(fake) if c[0] == "-S"]
    assert [c[3] for c in configures] == [str(tools.build), str(tests.build)]
    assert "-DLLAMA_BUILD_TESTS=OFF" in configures[0] and "-DLLAMA_BUILD_TESTS=ON" in configures[1]
    assert json.loads(tools.stamp.read_text())["targets"] == ["llama-simple"]  # the tools' build is left alone
    assert json.loads(tests.stamp.read_text())["targets"] == ["test-backend-ops"]
    patched = source.read_text()
    assert patched.count(f'getenv("{llamacpp.RPC_SERVERS_ENV}")') == 1
    assert patched.index("ggml_backend_load_all();") < patched.index("ggml_backend_rpc_add_server")
    assert patched.count(f'getenv("{llamacpp.SKIP_CASES_ENV}")') == 1
    # after the op filter, before the backends' support check
    assert patched.index("// check if the backends support the ops") < patched.index(llamacpp.SKIP_CASES_ENV)
    assert patched.index(llamacpp.SKIP_CASES_ENV) < patched.index("return test_status_t::OK;")
    assert llamacpp.find_tool("test-backend-ops") == tests.bin / "test-backend-ops"
    assert llamacpp.require_tools(["test-backend-ops", "llama-simple"]) == found  # cached: nothing run
    assert len(_calls(fake)) == 4


def test_the_patch_is_applied_once_and_refuses_another_source(fake: dict[str, Path]) -> None:
    source = _with_test_source(fake)
    root = llamacpp.paths().llama_cpp
    assert llamacpp.apply_rpc_devices_patch(root) is True
    once = source.read_text()
    assert llamacpp.apply_rpc_devices_patch(root) is False and source.read_text() == once
    source.write_text("int main() { return 0; }\n")
    with pytest.raises(BuildError, match="0 places for the pyggml patch's hunk after 'ggml_backend_load_all"):
        llamacpp.apply_rpc_devices_patch(root)
    source.unlink()
    with pytest.raises(BuildError, match="cannot read"):
        llamacpp.apply_rpc_devices_patch(root)


def test_another_version_of_the_patch_is_replaced_from_the_sdist(fake: dict[str, Path], tmp_path: Path) -> None:
    """A source patched by another pyggml (its marker, not this patch) is restored from the sdist's copy first."""
    source = _with_test_source(fake)
    p = llamacpp.paths()
    tarball = tmp_path / "sdist.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(source, arcname=f"{p.sdist.name}/vendor/llama.cpp/tests/test-backend-ops.cpp")
    older = MAIN_OF_TEST_BACKEND_OPS.replace("ggml_backend_load_all();\n",
                                             "ggml_backend_load_all();\n    // pyggml patch: an older one\n")
    source.write_text(older)
    with pytest.raises(BuildError, match="another version of the pyggml patch"):
        llamacpp.apply_rpc_devices_patch(p.llama_cpp)
    assert llamacpp.apply_rpc_devices_patch(p.llama_cpp, tarball) is True
    patched = source.read_text()
    assert "an older one" not in patched and patched.count(llamacpp.SKIP_CASES_ENV) >= 1
    assert llamacpp.apply_rpc_devices_patch(p.llama_cpp, tarball) is False
