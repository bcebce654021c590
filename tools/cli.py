"""The ``replaystore`` command: one clear error line and a non-zero exit for user mistakes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from replaystore import __version__
from replaystore.errors import ReplayStoreError


def _cmd_schemas(args: argparse.Namespace) -> int:
    from replaystore.schemas.builtin import BUILTINS, EXAMPLE_ARGS

    names = args.names or list(BUILTINS)
    for name in names:
        if name not in BUILTINS:
            raise ReplayStoreError(f"unknown schema {name!r}; built-ins: {', '.join(BUILTINS)}")
        example = EXAMPLE_ARGS[name]
        sizes = ", ".join(f"{k}={v}" for k, v in example.items())
        print(f"{name}({sizes})")
        print("\n".join(BUILTINS[name](**example).describe().splitlines()[1:]))
        print()
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from replaystore.tools.demo import run_demo

    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="replaystore",
        description="A persistent, on-disk dataset and replay store for reinforcement learning.",
    )
    parser.add_argument("--version", action="version", version=f"replaystore {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("schemas", help="list the built-in schemas with their fields",
                       description="List the built-in batch schemas, their fields, dtypes and shapes.")
    p.add_argument("names", nargs="*", help="only these schemas (default: all)")
    p.set_defaults(func=_cmd_schemas)

    p = sub.add_parser("demo", help="run the end-to-end demo",
                       description="Run replaystore end to end on a small built-in example.")
    p.add_argument("dir", nargs="?", default=None, help="where to put the demo store (default: a temp dir)")
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except ReplayStoreError as exc:
        print(f"replaystore {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
