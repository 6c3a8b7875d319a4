"""Real llama.cpp as an oracle for tests: built once per machine from the llama-cpp-python sdist and cached.

The llama-cpp-python 0.3.36 source package carries llama.cpp at commit 0c1e570
(`vendor/llama.cpp`). This module downloads it, configures it with the cmake
line of DESIGN.md ("Oracles") and builds only the targets asked for, into

    ${PYGGML_CACHE:-~/.cache/pyggml}/llama.cpp/src/llama_cpp_python-0.3.36/   the extracted sdist
    ${PYGGML_CACHE:-~/.cache/pyggml}/llama.cpp/build/bin/                     the tools and shared libraries
    ${PYGGML_CACHE:-~/.cache/pyggml}/llama.cpp/build-tests/bin/               llama.cpp's tests (TEST_TARGETS)

llama.cpp's tests (test-backend-ops) are built in their own folder, configured
with LLAMA_BUILD_TESTS=ON, so asking for them never reconfigures the tools'
build; before configuring it, test-backend-ops' `main` is patched in the
extracted source (`apply_rpc_devices_patch`) to add the RPC servers named by
$PYGGML_RPC_SERVERS as devices, so that `test-backend-ops test -b RPC0` runs
ggml's op cases on any RPC server, and to name each case before it runs, skip
the first $PYGGML_SKIP_CASES (a run resumes after a case a server refused) or
only list them ($PYGGML_LIST_CASES).

A file lock keeps two processes from building at once (the second waits, then
finds the work done); a stamp file in the build folder records the sdist, the
llama.cpp commit, the cmake arguments and the targets built with them, so a
later call returns at once and a change of flags reconfigures.

Tests call `require_tools(...)`: it returns the tools' paths, building them on
demand, and raises `NoCompilerError` only when this machine has no C/C++
compiler (the one reason a test may skip); any other failure raises
`BuildError`, which must fail the test. `require_libs()` does the same for
ggml's shared libraries (libggml-base, libggml-cpu: `pyggml.testing.ggml_c`
loads them), and `include_dir()` gives ggml's headers.

Command line::

    python -m pyggml.testing.llamacpp build [TARGET ...]   # default: DEFAULT_TARGETS; prints each path
    python -m pyggml.testing.llamacpp build test-backend-ops  # a test target: built in build-tests/
    python -m pyggml.testing.llamacpp path TOOL [--build]  # prints the tool's path

Exit status: 0 done, 1 build or download failure, 2 bad usage, 3 no C/C++ compiler.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyggml.cache import cache_dir

__all__ = [
    "BINDINGS_PRELUDE",
    "DEFAULT_TARGETS",
    "models_dir",
    "source_file",
    "GGML_LIBS",
    "LLAMA_CPP_COMMIT",
    "SDIST_NAME",
    "SDIST_VERSION",
    "BuildError",
    "LlamaCppError",
    "NoCompilerError",
    "Paths",
    "CASE_ANNOUNCE",
    "LIST_CASES_ENV",
    "RPC_SERVERS_ENV",
    "SKIP_CASES_ENV",
    "TEST_TARGETS",
    "Toolchain",
    "apply_rpc_devices_patch",
    "build",
    "cache_dir",
    "cmake_args",
    "cpu_has_amx",
    "ensure_source",
    "find_tool",
    "find_toolchain",
    "include_dir",
    "main",
    "output_path",
    "paths",
    "require_libs",
    "require_tool",
    "require_tools",
]

log = logging.getLogger(__name__)

SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
LLAMA_CPP_COMMIT = "0c1e570"  # what the sdist's vendor/llama.cpp is (its CHANGELOG and .git say so)

# What the oracle tests use: the text peers, token ids, logits, quantized variants (and the importance
# matrices some types need), speed and RPC peers, embeddings.
DEFAULT_TARGETS: tuple[str, ...] = (
    "llama-completion",
    "llama-simple",
    "llama-tokenize",
    "llama-debug",
    "llama-quantize",
    "llama-imatrix",
    "llama-bench",
    "ggml-rpc-server",
    "llama-embedding",
)

# llama.cpp's test programs: built in the build-tests folder (LLAMA_BUILD_TESTS=ON, the RPC-devices patch).
TEST_TARGETS: tuple[str, ...] = ("test-backend-ops",)

# The shared libraries of ggml that pyggml.testing.ggml_c loads with ctypes (libggml-base.so, libggml-cpu.so).
GGML_LIBS: tuple[str, ...] = ("ggml-base", "ggml-cpu")

# DESIGN.md's configuration ("Oracles"); the C/C++ flags are added by cmake_args (AMX, $CFLAGS).
BASE_CMAKE_ARGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DGGML_RPC=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
)
# llama.cpp's AMX kernels crashed on q8_0/q4_0 models on these machines: build without them.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

STAMP_FORMAT = 1
_PROGRESS_STEP = 10  # log the build's progress every this many percent
_PROGRESS_SECONDS = 60.0  # ... or at least this often


class LlamaCppError(RuntimeError):
    """llama.cpp could not be made available."""


class NoCompilerError(LlamaCppError):
    """This machine has no C or C++ compiler, so llama.cpp cannot be built (tests may skip for this alone)."""


class BuildError(LlamaCppError):
    """Downloading, configuring or building llama.cpp failed (a real failure, never a reason to skip)."""


@dataclass(frozen=True)
class Paths:
    """The cache layout. `root` is `<cache>/llama.cpp`."""

    root: Path
    src: Path  # where the sdist is downloaded and extracted
    sdist: Path  # src/llama_cpp_python-<version>
    llama_cpp: Path  # sdist/vendor/llama.cpp, the cmake source folder
    build: Path
    bin: Path
    stamp: Path
    lock: Path
    log: Path

    @property
    def tarball(self) -> Path:
        return self.src / f"{SDIST_NAME.replace('-', '_')}-{SDIST_VERSION}.tar.gz"


@dataclass(frozen=True)
class Toolchain:
    """What a build needs: C and C++ compilers, cmake, and a build tool cmake can drive."""

    cc: str
    cxx: str
    cmake: str
    generator: str | None  # None: cmake's default (Unix Makefiles, needs make)


def paths(cache: str | os.PathLike[str] | None = None, tests: bool = False) -> Paths:
    """The cache layout; `tests`: the folder of TEST_TARGETS' build (build-tests) instead of the tools' (build).
    Both share the source and the lock."""
    root = (Path(cache).expanduser() if cache is not None else cache_dir()) / "llama.cpp"
    src = root / "src"
    sdist = src / f"{SDIST_NAME.replace('-', '_')}-{SDIST_VERSION}"
    build_dir = root / ("build-tests" if tests else "build")
    return Paths(root=root, src=src, sdist=sdist, llama_cpp=sdist / "vendor" / "llama.cpp", build=build_dir,
                 bin=build_dir / "bin", stamp=build_dir / "pyggml-build.json", lock=root / "build.lock",
                 log=build_dir / "pyggml-build.log")


# the start of a script (run as `python -c SCRIPT SDIST ...`) that imports the sdist's `llama_cpp` ctypes bindings
# as `ll`, without the package's high-level imports; LLAMA_CPP_LIB_PATH in its environment names libllama's folder
BINDINGS_PRELUDE = r"""
import ctypes, importlib, json, sys, types
import numpy as np
sdist = sys.argv[1]
pkg = types.ModuleType("llama_cpp")
pkg.__path__ = [sdist + "/llama_cpp"]
sys.modules["llama_cpp"] = pkg
ll = importlib.import_module("llama_cpp.llama_cpp")
ll.llama_backend_init()
"""


# --- the machine ---


def cpu_has_amx(cpuinfo: str | None = None) -> bool:
    """Whether the CPU advertises AMX (an `amx*` flag in /proc/cpuinfo, or in the `cpuinfo` text given)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags" and any(flag.startswith("amx") for flag in value.split()):
            return True
    return False


def compiler_defines(macro: str) -> bool:
    """Whether this machine's C compiler defines `macro` for a -march=native build (with $CFLAGS), as the one
    that builds llama.cpp here does: what the build's `#if defined(...)` paths see."""
    cc = _find_program("CC", ("cc", "gcc", "clang"))
    if cc is None:
        return False
    cmd = [cc, *shlex.split(os.environ.get("CFLAGS", "")), "-march=native", "-dM", "-E", "-x", "c", os.devnull]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return r.returncode == 0 and any(line.split()[1:2] == [macro] for line in r.stdout.splitlines())


def _is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def cmake_args(amx: bool | None = None, tests: bool = False) -> list[str]:
    """The cmake arguments of a build on this machine (without -S/-B/-G); `tests`: with LLAMA_BUILD_TESTS=ON.

    CMAKE_C_FLAGS/CMAKE_CXX_FLAGS are always given, from $CFLAGS/$CXXFLAGS plus
    the no-AMX flags when the CPU has AMX, so that a changed environment resets
    a cached value instead of inheriting it.
    """
    if amx is None:
        amx = _is_x86() and cpu_has_amx()
    extra = [NO_AMX_FLAGS] if amx else []
    cflags = " ".join([*shlex.split(os.environ.get("CFLAGS", "")), *extra])
    cxxflags = " ".join([*shlex.split(os.environ.get("CXXFLAGS", "")), *extra])
    base = [("-DLLAMA_BUILD_TESTS=ON" if tests and a == "-DLLAMA_BUILD_TESTS=OFF" else a) for a in BASE_CMAKE_ARGS]
    return [*base, f"-DCMAKE_C_FLAGS={cflags}", f"-DCMAKE_CXX_FLAGS={cxxflags}"]


def _find_program(env: str, candidates: Sequence[str]) -> str | None:
    """$env's program (its first word, e.g. "ccache gcc" is fine) or the first candidate on PATH."""
    value = os.environ.get(env)
    if value:
        words = shlex.split(value)
        return shutil.which(words[0]) if words else None
    for name in candidates:
        found = shutil.which(name)
        if found:
            return found
    return None


def _find_cmake(install: bool) -> str | None:
    found = shutil.which("cmake")
    scripts = Path(sysconfig.get_path("scripts"))  # where `pip install cmake` puts it
    if found is None and (scripts / "cmake").exists():
        found = str(scripts / "cmake")
    if found is None and install:
        log.info("cmake is missing: installing it with pip (pip install cmake)")
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "cmake"], capture_output=True, text=True)
        if r.returncode != 0:
            log.warning("pip install cmake failed:\n%s", r.stderr.strip()[-2000:])
        return _find_cmake(install=False)
    return found


def find_toolchain(install_cmake: bool = True) -> Toolchain:
    """The compilers, cmake and build tool of this machine.

    Raises NoCompilerError when there is no C or C++ compiler ($CC/$CXX or
    cc/gcc/clang and c++/g++/clang++ on PATH), BuildError when cmake is
    missing and pip cannot install it, or there is neither make nor ninja.
    """
    cc = _find_program("CC", ("cc", "gcc", "clang"))
    cxx = _find_program("CXX", ("c++", "g++", "clang++"))
    if cc is None or cxx is None:
        missing = " and ".join(n for n, p in (("C", cc), ("C++", cxx)) if p is None)
        raise NoCompilerError(f"no {missing} compiler on this machine ($CC/$CXX or cc, gcc, clang, c++, g++, "
                              f"clang++ on PATH): llama.cpp cannot be built here")
    cmake = _find_cmake(install_cmake)
    if cmake is None:
        raise BuildError("cmake is not installed and `pip install cmake` did not provide it")
    if shutil.which("make") or shutil.which("gmake"):
        generator = None
    elif shutil.which("ninja"):
        generator = "Ninja"
    else:
        raise BuildError("neither make nor ninja is installed: cmake has nothing to build llama.cpp with")
    return Toolchain(cc=cc, cxx=cxx, cmake=cmake, generator=generator)


# --- the source ---


def _git_commit(source: Path) -> str | None:
    """The commit of `source` from its git metadata (the sdist ships the submodule's .git), without git."""
    dot_git = source / ".git"
    try:
        if dot_git.is_file():  # a submodule: "gitdir: <relative path>"
            line = dot_git.read_text().strip()
            if not line.startswith("gitdir:"):
                return None
            dot_git = (source / line.partition(":")[2].strip()).resolve()
        head = (dot_git / "HEAD").read_text().strip()
        if head.startswith("ref:"):
            head = (dot_git / head.partition(":")[2].strip()).read_text().strip()
    except OSError:
        return None
    return head if re.fullmatch(r"[0-9a-f]{7,64}", head) else None


def ensure_source(p: Paths) -> Path:
    """The llama.cpp source folder, downloading and extracting the sdist first if needed.

    Call with the build lock held (build() does): extraction goes through a
    temporary folder and a rename, so a killed process leaves no half tree.
    """
    if (p.llama_cpp / "CMakeLists.txt").exists():
        return p.llama_cpp
    p.src.mkdir(parents=True, exist_ok=True)
    if not p.tarball.exists():
        spec = f"{SDIST_NAME}=={SDIST_VERSION}"
        log.info("downloading the %s sdist into %s", spec, p.src)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", spec, "-d", str(p.src)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 or not p.tarball.exists():
            raise BuildError(f"`{shlex.join(cmd)}` failed (exit {r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
    log.info("extracting %s", p.tarball.name)
    with tempfile.TemporaryDirectory(dir=p.src, prefix=".extract-") as tmp:
        try:
            with tarfile.open(p.tarball) as tar:
                if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: refuse links and paths out of the folder
                    tar.extractall(tmp, filter="data")
                else:
                    tar.extractall(tmp)  # older Pythons have no filter; the file is the pinned sdist from PyPI
        except (tarfile.TarError, OSError) as e:
            raise BuildError(f"cannot extract {p.tarball}: {e} (delete it to download again)") from e
        extracted = Path(tmp) / p.sdist.name
        if not (extracted / "vendor" / "llama.cpp" / "CMakeLists.txt").exists():
            raise BuildError(f"{p.tarball} has no {p.sdist.name}/vendor/llama.cpp/CMakeLists.txt")
        if p.sdist.exists():
            shutil.rmtree(p.sdist)  # an older, incomplete extraction
        extracted.rename(p.sdist)
    return p.llama_cpp


# --- the patch of test-backend-ops ---

RPC_SERVERS_ENV = "PYGGML_RPC_SERVERS"
SKIP_CASES_ENV = "PYGGML_SKIP_CASES"
LIST_CASES_ENV = "PYGGML_LIST_CASES"
CASE_ANNOUNCE = "  pyggml case "  # the patch's line before each case it runs: "  pyggml case INDEX: OP(PARAMS)"
_PATCHED_FILE = "tests/test-backend-ops.cpp"
_PATCH_MARKER = "// pyggml patch:"
# C++ added to test-backend-ops' main after its backends are loaded: what common/arg.cpp does for --rpc
_RPC_DEVICES = f"""
    {_PATCH_MARKER} RPC devices of ${RPC_SERVERS_ENV} (HOST:PORT,..., as --rpc), so that -b RPC0 tests a server
    if (const char * pyggml_rpc_servers = getenv("{RPC_SERVERS_ENV}")) {{
        ggml_backend_reg_t rpc_reg = ggml_backend_reg_by_name("RPC");
        if (rpc_reg == NULL) {{
            GGML_ABORT("{RPC_SERVERS_ENV} is set but this build has no RPC backend (GGML_RPC=OFF)");
        }}
        typedef ggml_backend_reg_t (*rpc_add_server_t)(const char * endpoint);
        auto rpc_add_server =
            (rpc_add_server_t) ggml_backend_reg_get_proc_address(rpc_reg, "ggml_backend_rpc_add_server");
        if (rpc_add_server == NULL) {{
            GGML_ABORT("the RPC backend has no ggml_backend_rpc_add_server");
        }}
        std::stringstream endpoints(pyggml_rpc_servers);
        std::string endpoint;
        while (std::getline(endpoints, endpoint, ',')) {{
            if (endpoint.empty()) {{
                continue;
            }}
            ggml_backend_reg_t server_reg = rpc_add_server(endpoint.c_str());
            if (server_reg == NULL) {{
                GGML_ABORT("RPC server %s of {RPC_SERVERS_ENV} has no devices (is it running?)", endpoint.c_str());
            }}
            ggml_backend_register(server_reg);
        }}
    }}
"""
# C++ added to test_case::eval after the op filter: a run that an RPC server ended names the case it ended at
# (flushed before the case runs) and the next run starts after it
_SKIP_CASES = f"""
        {_PATCH_MARKER} ${SKIP_CASES_ENV}=N skips the first N cases the op filter selects and announces each later one
        // (and with ${LIST_CASES_ENV} skips it too: the announcements list the cases)
        if (const char * pyggml_skip_cases = getenv("{SKIP_CASES_ENV}")) {{
            static long pyggml_cases_seen = 0;
            const long pyggml_case = pyggml_cases_seen++;
            if (pyggml_case < atol(pyggml_skip_cases)) {{
                return test_status_t::SKIPPED;
            }}
            printf("{CASE_ANNOUNCE}%ld: %s(%s)\\n", pyggml_case, current_op_name.c_str(), vars().c_str());
            fflush(stdout);
            if (getenv("{LIST_CASES_ENV}")) {{
                return test_status_t::SKIPPED;
            }}
        }}
"""
# (the line each hunk follows, the hunk)
_PATCH_HUNKS: tuple[tuple[str, str], ...] = (
    ("    // load and enumerate backends\n    ggml_backend_load_all();\n", _RPC_DEVICES),
    ("        if (!matches_filter(out, op_names_filter)) {\n"
     "            //printf(\"  %s: skipping\\n\", op_desc(out).c_str());\n"
     "            return test_status_t::SKIPPED;\n"
     "        }\n\n        // check if the backends support the ops\n", _SKIP_CASES),
)
_PATCH = "".join(hunk for _, hunk in _PATCH_HUNKS)


def apply_rpc_devices_patch(llama_cpp: Path, tarball: Path | None = None) -> bool:
    """Patch `tests/test-backend-ops.cpp` of the source folder `llama_cpp` so that its `main` adds the RPC
    servers of $PYGGML_RPC_SERVERS as devices (RPC0, RPC1, ...), its cases can be resumed after the first
    $PYGGML_SKIP_CASES and listed (with $PYGGML_LIST_CASES); idempotent. Whether it changed the file.

    A file with another version of the patch is first restored from the sdist `tarball` (BuildError without
    one). The file is replaced through a rename, so a killed process leaves it whole. Raises BuildError if the
    file or a line a hunk follows is missing (another llama.cpp version).
    """
    target = llama_cpp / _PATCHED_FILE
    try:
        text = target.read_text()
    except OSError as e:
        raise BuildError(f"cannot read {target} to patch it: {e}") from e
    if all(anchor + hunk in text for anchor, hunk in _PATCH_HUNKS):
        return False
    if _PATCH_MARKER in text:
        text = _pristine(target, llama_cpp, tarball)
    for anchor, hunk in _PATCH_HUNKS:
        if text.count(anchor) != 1:
            raise BuildError(f"{target} has {text.count(anchor)} places for the pyggml patch's hunk after "
                             f"{anchor.strip().splitlines()[-1].strip()!r}, not 1: not llama.cpp {LLAMA_CPP_COMMIT}?")
        text = text.replace(anchor, anchor + hunk)
    tmp = target.with_suffix(".cpp.pyggml-tmp")
    tmp.write_text(text)
    tmp.replace(target)
    return True


def _pristine(target: Path, llama_cpp: Path, tarball: Path | None) -> str:
    """The sdist's own copy of `target` (a file in the source folder `llama_cpp`), read from `tarball`."""
    if tarball is None:
        raise BuildError(f"{target} carries another version of the pyggml patch and no sdist was given to "
                         f"restore it from")
    sdist = llama_cpp.parent.parent
    member = f"{sdist.name}/{target.relative_to(sdist).as_posix()}"
    try:
        with tarfile.open(tarball) as tar:
            f = tar.extractfile(member)
            if f is None:
                raise BuildError(f"{tarball} has no file {member}")
            return f.read().decode()
    except (tarfile.TarError, OSError, KeyError) as e:
        raise BuildError(f"cannot read {member} from {tarball} to restore it: {e}") from e


# --- the build ---


def output_path(bin_dir: Path, target: str) -> Path | None:
    """The file a target makes in bin/: the executable `target`, or the shared library `lib<target>.so`
    (.dylib, .dll); None if there is none."""
    for name in (target, f"{target}.exe", f"lib{target}.so", f"lib{target}.dylib", f"{target}.dll"):
        candidate = bin_dir / name
        if candidate.is_file():
            return candidate
    return None


def _config(amx: bool | None, tests: bool = False) -> dict[str, Any]:
    """What a build depends on: a stamp with another config is stale (the tests' build: also the patch)."""
    config: dict[str, Any] = {"format": STAMP_FORMAT, "sdist": f"{SDIST_NAME}=={SDIST_VERSION}",
                              "cmake_args": cmake_args(amx, tests)}
    if tests:
        config["patch"] = hashlib.sha256(_PATCH.encode()).hexdigest()[:16]
    return config


def _is_test(target: str) -> bool:
    return target in TEST_TARGETS


def _read_stamp(p: Paths) -> dict[str, Any]:
    try:
        stamp = json.loads(p.stamp.read_text())
    except (OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) else {}


def _stamp_matches(stamp: dict[str, Any], config: dict[str, Any]) -> bool:
    return all(stamp.get(k) == v for k, v in config.items())


def _built(p: Paths, targets: Sequence[str], config: dict[str, Any]) -> dict[str, Path] | None:
    """The targets' outputs if the stamp says they were built with `config` and they exist, else None."""
    stamp = _read_stamp(p)
    if not _stamp_matches(stamp, config):
        return None
    done = set(stamp.get("targets", []))
    found: dict[str, Path] = {}
    for t in targets:
        out = output_path(p.bin, t)
        if t not in done or out is None:
            return None
        found[t] = out
    return found


@contextmanager
def _locked(p: Paths) -> Iterator[None]:
    """An exclusive lock on the cache (flock: released by the kernel if the process dies)."""
    p.root.mkdir(parents=True, exist_ok=True)
    with open(p.lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another process is building llama.cpp (lock %s): waiting for it", p.lock)
            t0 = time.monotonic()
            fcntl.flock(f, fcntl.LOCK_EX)
            log.info("the other build finished after %.0f s", time.monotonic() - t0)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run_logged(cmd: list[str], logfile: Path, what: str) -> None:
    """Run `cmd`, appending its output to `logfile` and logging its progress; BuildError with the log's
    tail if it fails."""
    log.info("%s: %s", what, shlex.join(cmd))
    pattern = re.compile(r"^\[\s*(\d+)%\]|^\[(\d+)/(\d+)\]")  # make's "[ 42%]", ninja's "[12/345]"
    last_pct, last_time, t0 = -_PROGRESS_STEP, time.monotonic(), time.monotonic()
    tail: list[str] = []
    with open(logfile, "a", encoding="utf-8", errors="replace") as out:
        out.write(f"\n$ {shlex.join(cmd)}\n")
        out.flush()
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    errors="replace")
        except OSError as e:
            raise BuildError(f"{what}: cannot run {cmd[0]}: {e}") from e
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            tail = [*tail[-59:], line.rstrip("\n")]
            m = pattern.match(line)
            if m is None:
                continue
            pct = int(m.group(1)) if m.group(1) else 100 * int(m.group(2)) // max(int(m.group(3)), 1)
            now = time.monotonic()
            if pct >= last_pct + _PROGRESS_STEP or now - last_time >= _PROGRESS_SECONDS:
                log.info("%s: %3d%% after %.0f s", what, pct, now - t0)
                last_pct, last_time = pct, now
        rc = proc.wait()
    if rc != 0:
        raise BuildError(f"{what} failed (exit {rc}); the full log is {logfile}; its end:\n" + "\n".join(tail))
    log.info("%s: done in %.0f s", what, time.monotonic() - t0)


def build(targets: Sequence[str] = DEFAULT_TARGETS, *, cache: str | os.PathLike[str] | None = None,
          jobs: int | None = None, amx: bool | None = None) -> dict[str, Path]:
    """Build `targets` (cmake target names: tools such as "llama-completion", libraries such as
    "ggml-base") unless the cache has them already; return each target's output path.

    `jobs`: parallel compile jobs (default: the number of CPUs); `amx`: force
    the no-AMX flags on or off (default: from /proc/cpuinfo). TEST_TARGETS
    are built in their own folder (see `paths`). Raises NoCompilerError or
    BuildError.
    """
    targets = list(dict.fromkeys(targets))
    if not targets:
        raise ValueError("build: no targets given")
    found: dict[str, Path] = {}
    for tests in (False, True):
        group = [t for t in targets if _is_test(t) == tests]
        if group:
            found.update(_build_folder(paths(cache, tests), group, _config(amx, tests), jobs))
    return {t: found[t] for t in targets}


def _build_folder(p: Paths, targets: list[str], config: dict[str, Any], jobs: int | None) -> dict[str, Path]:
    """`build` of targets that share one build folder (`p.build`) and configuration."""
    found = _built(p, targets, config)
    if found is not None:
        return found
    with _locked(p):
        found = _built(p, targets, config)  # another process may have built them while we waited
        if found is not None:
            return found
        toolchain = find_toolchain()
        source = ensure_source(p)
        if "patch" in config and apply_rpc_devices_patch(source, p.tarball):
            log.info("patched %s: RPC servers of $%s become devices, $%s resumes cases", _PATCHED_FILE,
                     RPC_SERVERS_ENV, SKIP_CASES_ENV)
        commit = _git_commit(source)
        p.build.mkdir(parents=True, exist_ok=True)
        log.info("building llama.cpp %s (%s %s) targets %s into %s (a build from scratch takes 6-10 minutes on "
                 "2 cores); log: %s", commit[:7] if commit else "(commit unknown)", SDIST_NAME, SDIST_VERSION,
                 " ".join(targets), p.bin, p.log)
        stamp = _read_stamp(p)
        fresh_config = not _stamp_matches(stamp, config) or not (p.build / "CMakeCache.txt").exists()
        if fresh_config:
            cmd = [toolchain.cmake, "-S", str(source), "-B", str(p.build), *config["cmake_args"]]
            if toolchain.generator and not (p.build / "CMakeCache.txt").exists():
                cmd[1:1] = ["-G", toolchain.generator]  # a generator can be chosen only for a new build folder
            _run_logged(cmd, p.log, "configure")  # cmake finds the compilers as we did ($CC/$CXX, then cc/c++)
        n_jobs = jobs or os.cpu_count() or 1
        _run_logged([toolchain.cmake, "--build", str(p.build), "--target", *targets, "--parallel", str(n_jobs)],
                    p.log, "build")
        missing = [t for t in targets if output_path(p.bin, t) is None]
        if missing:
            raise BuildError(f"the build succeeded but made no {', '.join(missing)} in {p.bin} (not executables "
                             f"or shared libraries?)")
        done = set() if fresh_config else set(stamp.get("targets", []))
        new_stamp = {**config, "commit": commit, "cc": toolchain.cc, "cxx": toolchain.cxx,
                     "targets": sorted(done | set(targets)), "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        tmp = p.stamp.with_suffix(".tmp")
        tmp.write_text(json.dumps(new_stamp, indent=2) + "\n")
        tmp.replace(p.stamp)
        return {t: out for t in targets if (out := output_path(p.bin, t)) is not None}


def find_tool(name: str, cache: str | os.PathLike[str] | None = None) -> Path | None:
    """The path of a target built with this machine's current configuration, or None (no build)."""
    tests = _is_test(name)
    found = _built(paths(cache, tests), [name], _config(None, tests))
    return found[name] if found else None


def require_tools(names: Sequence[str], *, cache: str | os.PathLike[str] | None = None,
                  build_missing: bool = True) -> dict[str, Path]:
    """For tests: the paths of `names`, building what is missing (unless `build_missing` is False, when a
    missing tool raises BuildError). Raises NoCompilerError only when there is no compiler to build with."""
    found = {name: path for name in names if (path := find_tool(name, cache)) is not None}
    missing = [name for name in names if name not in found]
    if not missing:
        return found
    if not build_missing:
        where = paths(cache, _is_test(missing[0])).bin
        raise BuildError(f"llama.cpp {', '.join(missing)} not built in {where}; run "
                         f"`python -m pyggml.testing.llamacpp build {' '.join(names)}`")
    return build(names, cache=cache)


def require_tool(name: str, **kwargs: Any) -> Path:
    """`require_tools([name])[name]`."""
    return require_tools([name], **kwargs)[name]


def require_libs(names: Sequence[str] = GGML_LIBS, *, cache: str | os.PathLike[str] | None = None,
                 build_missing: bool = True) -> dict[str, Path]:
    """For tests: the paths of the shared libraries of cmake targets `names` (`lib<name>.so`), building
    what is missing as `require_tools` does. Raises NoCompilerError only when there is no compiler."""
    return require_tools(names, cache=cache, build_missing=build_missing)


def source_file(relative: str, cache: str | os.PathLike[str] | None = None) -> Path:
    """A path in the extracted sdist's llama.cpp tree, downloading and extracting the sdist first if needed
    (no compiler needed). Raises BuildError if that fails or the sdist lacks it."""
    p = paths(cache)
    path = p.llama_cpp / relative
    if not path.exists():
        with _locked(p):
            ensure_source(p)
        if not path.exists():
            raise BuildError(f"the sdist in {p.sdist} has no {relative}")
    return path


def include_dir(cache: str | os.PathLike[str] | None = None) -> Path:
    """ggml's public headers (ggml.h, ggml-cpu.h, ggml-backend.h) in the extracted sdist (see source_file)."""
    return source_file("ggml/include/ggml.h", cache).parent


def models_dir(cache: str | os.PathLike[str] | None = None) -> Path:
    """llama.cpp's models/ folder in the extracted sdist: the ggml-vocab-*.gguf tokenizer suites and the chat
    templates (see source_file)."""
    return source_file("models/ggml-vocab-llama-bpe.gguf", cache).parent


# --- command line ---


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyggml.testing.llamacpp",
                                     description="Build real llama.cpp (from the llama-cpp-python "
                                                 f"{SDIST_VERSION} sdist) once per machine, cached in "
                                                 "${PYGGML_CACHE:-~/.cache/pyggml}/llama.cpp.")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress messages on stderr")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="progress messages on stderr even when it is not a terminal")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build targets unless cached; print each one's path")
    b.add_argument("targets", nargs="*", metavar="TARGET",
                   help=f"cmake targets (default: {' '.join(DEFAULT_TARGETS)})")
    b.add_argument("-j", "--jobs", type=int, default=None, help="parallel jobs (default: the number of CPUs)")
    t = sub.add_parser("path", help="print the path of a built tool (exit 1 if it is not built)")
    t.add_argument("tool")
    t.add_argument("--build", action="store_true", help="build it if it is not built yet")
    args = parser.parse_args(argv)
    progress = not args.quiet and (args.verbose or sys.stderr.isatty())  # a log file or CI: errors only
    logging.basicConfig(level=logging.INFO if progress else logging.WARNING, stream=sys.stderr,
                        format="llama.cpp: %(message)s")
    try:
        if args.command == "build":
            if args.jobs is not None and args.jobs < 1:
                parser.error(f"--jobs must be >= 1, got {args.jobs}")
            for path in build(args.targets or DEFAULT_TARGETS, jobs=args.jobs).values():
                print(path)
            return 0
        found = require_tools([args.tool], build_missing=args.build)
        print(found[args.tool])
        return 0
    except NoCompilerError as e:
        print(f"llama.cpp: {e}", file=sys.stderr)
        return 3
    except LlamaCppError as e:
        print(f"llama.cpp: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
