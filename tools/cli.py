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
    unknown = [n for n in names if n not in BUILTINS]
    if unknown:
        raise ReplayStoreError(f"unknown schema(s) {unknown}; built-ins: {', '.join(BUILTINS)}")
    for name in names:
        example = EXAMPLE_ARGS[name]
        sizes = ", ".join(f"{k}={v}" for k, v in example.items())
        print(f"{name}({sizes})")
        print("\n".join(BUILTINS[name](**example).describe().splitlines()[1:]))
        print()
    return 0


def _open(args: argparse.Namespace):
    from replaystore.store import open_store

    return open_store(args.url, mode="r", storage_options=_options(args))


def _options(args: argparse.Namespace) -> dict | None:
    import json

    if not getattr(args, "storage_options", None):
        return None
    try:
        return json.loads(args.storage_options)
    except ValueError as exc:
        raise ReplayStoreError(f"--storage-options: expected a JSON object ({exc})") from None


def _cmd_info(args: argparse.Namespace) -> int:
    from replaystore.tools.info import print_info

    print_info(_open(args))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from replaystore.tools.info import run_verify

    return run_verify(args.url, _options(args))


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

    p = sub.add_parser("info", help="schema, records, streams, writers, capacity, size, format version",
                       description="Describe a store: tables and schemas, record counts, streams, writers, "
                                   "capacity, size on disk and format version.")
    p.add_argument("url", help="store path or URL (file://, memory://, s3://bucket/prefix)")
    p.add_argument("--storage-options", help="fsspec storage options as a JSON object")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("verify", help="full integrity check (exit 0 only if everything is intact)",
                       description="Read every record document and every live data object back and check "
                                   "its checksum; print each damaged object; exit 1 if any.")
    p.add_argument("url", help="store path or URL")
    p.add_argument("--storage-options", help="fsspec storage options as a JSON object")
    p.set_defaults(func=_cmd_verify)

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
