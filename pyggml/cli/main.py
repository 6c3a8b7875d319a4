"""`pyggml`: the command line. Subcommands are added by the layers that provide them."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyggml", description="ggml's backend layer in Python")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    test_ops = sub.add_parser("test-ops", help="check every op of a backend against the CPU backend "
                                               "(like ggml's test-backend-ops)")
    test_ops.add_argument("-b", "--backend", default="cpu", help="backend to test, by registry name (default: cpu)")
    test_ops.add_argument("-o", "--op", default=None, help="only the cases of this op (ggml's op name, e.g. ADD, "
                                                           "MUL_MAT, GELU)")
    test_ops.add_argument("-v", "--verbose", action="store_true", help="say why a case is not supported")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from pyggml import __version__

        print(__version__)
        return 0
    if args.command == "test-ops":
        from pyggml.core.errors import GGMLError
        from pyggml.testing import test_ops

        try:
            return test_ops.run(args.backend, args.op, sys.stdout, args.verbose)
        except GGMLError as e:  # an unknown backend name, a backend that cannot start
            print(f"pyggml test-ops: {e}", file=sys.stderr)
            return 2
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
