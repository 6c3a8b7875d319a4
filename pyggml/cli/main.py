"""`pyggml`: the command line (run, chat, serve, info, bench, devices, rpc-server, test-ops).

Errors a user can cause end in one line on stderr and a non-zero exit code
(1 for a failed command, 2 for a bad option); `--debug` re-raises them, so
the traceback shows, and turns on debug logging.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

from pyggml.cli import bench, chat, devices, info, rpc_server, run, serve
from pyggml.cli._common import GGUF_MODEL, CLIError, Parser, add_debug
from pyggml.cli._compile_notice import compile_notice

# the subcommands that compute with the CPU kernels (numba compiles them on a first run)
_COMPILING = frozenset(("run", "chat", "serve", "bench", "test-ops"))


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="pyggml", description="ggml's backend layer in Python: run, inspect and benchmark "
                                               f"a {GGUF_MODEL}, test backends")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("--debug", action="store_true", default=False,
                        help="show the traceback of an error and debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run.add_parser(sub)
    chat.add_parser(sub)
    info.add_parser(sub)
    bench.add_parser(sub)
    devices.add_parser(sub)
    rpc_server.add_parser(sub)
    serve.add_parser(sub)
    ops_parser = sub.add_parser("test-ops", help="check every op of a backend against the CPU backend or real ggml "
                                               "(like ggml's test-backend-ops)")
    ops_parser.add_argument("-b", "--backend", default="cpu", help="backend to test, by registry name (default: cpu)")
    ops_parser.add_argument("--against", choices=("cpu", "ggml"), default="cpu",
                          help="the reference: pyggml's CPU backend, or real ggml (llama.cpp's libggml, built from "
                               "source on first use; needs a C compiler) (default: cpu)")
    ops_parser.add_argument("-o", "--op", default=None, help="only the cases of this op (ggml's op name, e.g. ADD, "
                                                           "MUL_MAT, GELU)")
    ops_parser.add_argument("-v", "--verbose", action="store_true", help="say why a case is not supported")
    add_debug(ops_parser)
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        return run.run(args)
    if args.command == "chat":
        return chat.run(args)
    if args.command == "info":
        return info.run(args)
    if args.command == "devices":
        return devices.run(args)
    if args.command == "bench":
        return bench.run(args)
    if args.command == "serve":
        return serve.run(args)
    if args.command == "rpc-server":
        return rpc_server.run(args)
    if args.command == "test-ops":
        from pyggml.core.errors import GGMLError
        from pyggml.testing import op_check
        from pyggml.testing.llamacpp import LlamaCppError, NoCompilerError

        try:
            code = op_check.run(args.backend, args.op, sys.stdout, args.verbose, against=args.against)
        except GGMLError as e:  # an unknown backend name, a backend that cannot start (exit code 2, as before)
            if args.debug:
                raise
            print(f"pyggml test-ops: {e}", file=sys.stderr)
            return 2
        except NoCompilerError as e:  # --against ggml on a machine that cannot build libggml
            if args.debug:
                raise
            print(f"pyggml test-ops: --against ggml needs real ggml, built from llama.cpp's source, and this machine "
                  f"has no C compiler: {_one_line(e)}", file=sys.stderr)
            return 3
        except LlamaCppError as e:  # the download or the build of libggml failed
            if args.debug:
                raise
            print(f"pyggml test-ops: --against ggml: real ggml is not available: {_one_line(e)}", file=sys.stderr)
            return 1
        if args.op is not None and not op_check.select(op_check.all_cases(), args.op):
            # the table said so on stdout; a failure is also one line on stderr, as everywhere else
            labels = sorted({c.label for c in op_check.all_cases()})
            print(f"pyggml test-ops: error: --op {args.op}: no test case for this op (ops: {', '.join(labels)})",
                  file=sys.stderr)
        return code
    raise AssertionError(args.command)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from pyggml import __version__

        print(__version__)
        return 0
    if args.command is None:
        parser.print_help()
        return 0
    prog = f"pyggml {args.command}"
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not args.debug:
        # NaN or overflow inside a kernel is reported by the finite check of the logits, in one line
        warnings.filterwarnings("ignore", message=r"(invalid value|overflow|divide by zero) encountered",
                                category=RuntimeWarning)
    from pyggml.core.errors import GGMLError

    try:
        if args.command not in _COMPILING:
            return _dispatch(args)
        with compile_notice(sys.stderr, prog, getattr(args, "verbose", False)):
            return _dispatch(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `pyggml run | head`: the reader left
        sys.stderr.close()
        return 1
    except (CLIError, GGMLError, OSError, ValueError, MemoryError) as e:
        if args.debug:
            raise
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug: still one line, the traceback is one --debug away
        if args.debug:
            raise
        print(f"{prog}: internal error: {type(e).__name__}: {_one_line(e)} (run with --debug for the traceback)",
              file=sys.stderr)
        return 1


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, OSError) and e.filename and str(e.filename) not in text:
        text += f": '{e.filename}'"
    return text


if __name__ == "__main__":
    sys.exit(main())
