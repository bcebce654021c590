"""The ``replaystore`` command.

One clear error line and a distinct non-zero exit code for every operational error
(:data:`EXIT_CODES`); never a traceback unless ``REPLAYSTORE_TRACEBACK=1``.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from replaystore import __version__
from replaystore.errors import CorruptObjectError, FormatVersionError, ReplayStoreError, StoreNotFoundError

EXIT_OK = 0
EXIT_DAMAGED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CORRUPT = 4
EXIT_STORAGE = 5
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_DAMAGED: "verify found damage (each damaged object printed)",
    EXIT_USAGE: "a usage mistake: bad arguments or options, an unknown URL protocol, a query DuckDB "
                "rejects, a mode or schema that does not fit the store",
    EXIT_NOT_FOUND: "no store at the URL (nothing there, or a file)",
    EXIT_CORRUPT: "the store is damaged or not a replaystore store of a known format version",
    EXIT_STORAGE: "the storage failed or refused: missing credentials, unreachable endpoint, "
                  "permission denied, disk full, an unwritable output file",
    EXIT_INTERNAL: "an internal error (a bug: please report it with REPLAYSTORE_TRACEBACK=1's output)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
    EXIT_BROKEN_PIPE: "the output pipe was closed early (e.g. by head); nothing is printed",
}


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
        options = json.loads(args.storage_options)
    except ValueError as exc:
        raise ReplayStoreError(f"--storage-options: expected a JSON object ({exc})") from None
    if not isinstance(options, dict):
        raise ReplayStoreError(f"--storage-options: expected a JSON object, got {type(options).__name__}")
    return options


def _cmd_info(args: argparse.Namespace) -> int:
    from replaystore.tools.info import print_info

    print_info(_open(args), verbose=args.verbose, as_json=args.json)
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from replaystore.tools.info import run_verify

    return run_verify(args.url, _options(args), progress=not args.quiet)


def _cmd_vacuum(args: argparse.Namespace) -> int:
    from replaystore.store import open_store
    from replaystore.tools.info import size_text

    options = _options(args)
    st = open_store(args.url, mode="r", storage_options=options)  # a clear error if there is no store
    if not args.dry_run:
        st = open_store(args.url, mode="a", storage_options=options)
    report = st.vacuum(older_than_s=args.older_than, dry_run=args.dry_run, progress=not args.quiet)
    verb = "would delete" if args.dry_run else "deleted"
    for unit in report.deleted:
        print(f"{verb} {unit.kind} {unit.path} ({len(unit.objects)} objects, {size_text(unit.bytes)})")
    print(f"{verb} {_count(len(report.deleted), 'unreferenced unit')}, {_count(report.objects, 'object')}, "
          f"{size_text(report.bytes)}; kept {_count(len(report.recent), 'unreferenced unit')} newer than "
          f"{args.older_than:g} s")
    return 0


def _count(n: int, what: str) -> str:
    """``"1 unit"``, ``"2 units"``."""
    return f"{n} {what}{'' if n == 1 else 's'}"


def _cmd_copy(args: argparse.Namespace) -> int:
    from replaystore.tools.copy import copy_store
    from replaystore.tools.info import size_text

    options = _options(args)
    report = copy_store(args.src, args.dst, src_options=options, dst_options=options, progress=not args.quiet)
    print(f"copied {report.objects} objects ({size_text(report.bytes)}, {size_text(report.written)} of data "
          f"written) from {args.src} to {args.dst}; verified")
    return 0


def _cmd_query(args: argparse.Namespace) -> int:
    from replaystore.tools.query import run_query

    return run_query(_open(args), args.sql, args.format, args.output, args.allow_file_access)


def _cmd_export(args: argparse.Namespace) -> int:
    from replaystore.tools.export import export_store, export_summary

    summary = export_store(_open(args), args.out, args.to, table=args.table, dataset_id=args.dataset_id,
                           progress=not args.quiet, stack=args.stack, data_files_size_in_mb=args.data_files_size_in_mb,
                           video_files_size_in_mb=args.video_files_size_in_mb, chunks_size=args.chunks_size)
    print(f"exported {args.url} to {export_summary(summary)}")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from replaystore.tools.importer import import_store
    from replaystore.tools.info import size_text

    st = import_store(args.src, args.url, args.from_, dataset_id=args.dataset_id, progress=not args.quiet,
                      storage_options=_options(args))
    info = st.info()
    records = sum(t["records"] for t in info["tables"].values())
    streams = sum(t["streams"] for t in info["tables"].values())
    print(f"imported {args.src} ({args.from_}) into {args.url}: {records} records in {streams} "
          f"stream{'s' if streams != 1 else ''}, {size_text(info['bytes'])} on disk")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from replaystore.report.html import build_report, store_name

    st = _open(args)
    out = args.output if args.output is not None else f"{store_name(st.url)}-report.html"
    done = build_report(st, out, table=args.table, progress=not args.quiet)
    print(done)  # one line: the path, its size and the seconds it took
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    from replaystore.tools.stats import stats_document, write_stats

    doc = stats_document(_open(args), args.table, progress=not args.quiet)
    write_stats(doc, args.output)
    if args.output is not None and not args.quiet:
        print(f"wrote the statistics of {len(doc)} fields to {args.output}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from replaystore.tools.bench import run_bench

    return run_bench(args.which, args.quick)


def _cmd_demo(args: argparse.Namespace) -> int:
    from replaystore.tools.demo import run_demo

    return run_demo(args)


def _quiet_option(p: argparse.ArgumentParser) -> None:
    """Give a long command ``--quiet``: no progress bar (shown only when stderr is a terminal anyway)."""
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar on stderr (one is shown only when stderr is a terminal)")


def build_parser() -> argparse.ArgumentParser:
    """The ``replaystore`` command line parser, with one subcommand per tool.

    Returns
    -------
    argparse.ArgumentParser
        The parser; each subcommand sets ``func``, which runs it.
    """
    parser = argparse.ArgumentParser(
        prog="replaystore",
        description="A persistent, on-disk dataset and replay store for reinforcement learning.",
    )
    parser.add_argument("--version", action="version", version=f"replaystore {__version__}")
    # (its own dest: a command's --quiet default would overwrite it; main() merges the two)
    parser.add_argument("-q", "--quiet", dest="quiet_all", action="store_true",
                        help="no progress bars (long commands show one on stderr when it is a terminal)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("schemas", help="list the built-in schemas with their fields",
                       description="List the built-in batch schemas, their fields, dtypes and shapes.")
    p.add_argument("names", nargs="*", help="only these schemas (default: all)")
    p.set_defaults(func=_cmd_schemas)

    p = sub.add_parser("info", help="schema, records, streams, episodes, writers, capacity, size, format version",
                       description="Describe a store: tables and their schemas as tables, metadata, record "
                                   "counts, streams, episodes and returns, writers, commits and their time "
                                   "span, capacity, size on disk and format version (docs/GUIDE.md, "
                                   "'Command line: info').")
    p.add_argument("url", help="store path or URL (file://, memory://, s3://bucket/prefix)")
    p.add_argument("--json", action="store_true", help="print one JSON document (its keys: docs/GUIDE.md)")
    p.add_argument("--verbose", action="store_true",
                   help="also the internals: fragments, column sizes and codecs, state slots, log checkpoint, "
                        "chunk cache")
    p.add_argument("--storage-options", help="fsspec storage options as a JSON object")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("verify", help="full integrity check (exit 0 only if everything is intact)",
                       description="Read every record document and every live data object back and check "
                                   "its checksum; print each damaged object; exit 1 if any.")
    p.add_argument("url", help="store path or URL")
    p.add_argument("--storage-options", help="fsspec storage options as a JSON object")
    _quiet_option(p)
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("vacuum", help="delete objects no live commit references (crash leftovers, compacted data)",
                       description="Delete the objects under a store that no live commit references: crashed "
                                   "writers' uncommitted fragments, compacted-away and evicted fragments, "
                                   "unnamed state payloads, temporary objects; only those unreferenced for "
                                   "longer than --older-than (docs/FORMAT.md, 'Vacuum').")
    p.add_argument("url", help="store path or URL")
    p.add_argument("--older-than", type=float, default=3600.0, metavar="SECONDS",
                   help="only garbage unreferenced for at least this long (default: 3600; in-flight "
                        "commits of live writers are younger)")
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    p.add_argument("--storage-options", help="fsspec storage options as a JSON object")
    _quiet_option(p)
    p.set_defaults(func=_cmd_vacuum)

    p = sub.add_parser("copy", help="copy a store's committed state to a new location, keeping sparse files sparse",
                       description="Copy what the source's log references (records, live data, state slots) "
                                   "into a new store, writing only the data ranges of sparse segment files, "
                                   "then verify the copy (docs/GUIDE.md, 'Copying a store').")
    p.add_argument("src", help="source store path or URL")
    p.add_argument("dst", help="destination path or URL (must not exist, or be empty)")
    p.add_argument("--storage-options", help="fsspec storage options (JSON object) for both locations")
    _quiet_option(p)
    p.set_defaults(func=_cmd_copy)

    p = sub.add_parser("query", help="DuckDB SQL over a store",
                       description="Run DuckDB SQL over a store. Each table is a view under its name "
                                   "(single-schema stores: records), plus commits and appends.")
    p.add_argument("url", help="store path or URL")
    p.add_argument("sql", help='the query, e.g. "SELECT stream, count(*) FROM records GROUP BY 1"')
    p.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table",
                   help="output format (default: an aligned table on stdout)")
    p.add_argument("-o", "--output", help="write to this file instead of stdout (required for parquet)")
    p.add_argument("--allow-file-access", action="store_true",
                   help="let the query itself read or write files and load extensions (COPY ... TO, "
                        "read_csv, ATTACH, INSTALL); off by default: only the store is readable")
    p.add_argument("--storage-options", help="fsspec storage options as a JSON object")
    p.set_defaults(func=_cmd_query)

    p = sub.add_parser("export", help="export a store (parquet, minari, minari-hdf5, d4rl, lerobot)",
                       description="Export a store's records to a format offline-RL tools load.")
    p.add_argument("url", help="store path or URL")
    p.add_argument("out", help="output directory or file")
    p.add_argument("--to", required=True, help="parquet | minari | minari-hdf5 | d4rl | lerobot")
    p.add_argument("--table", help="which table (stores with several tables)")
    p.add_argument("--dataset-id", help="Minari dataset id, e.g. tictactoe/random-v0")
    p.add_argument("--stack", type=int, default=None,
                   help="frames stores, Minari and D4RL: observations are stacks of this many frames "
                        "(default: one frame each)")
    p.add_argument("--data-files-size-in-mb", type=float, default=None,
                   help="LeRobot: size limit of data and episode files in MiB (default: the imported "
                        "dataset's, else 100)")
    p.add_argument("--video-files-size-in-mb", type=float, default=None,
                   help="LeRobot: size limit of video files in MiB (default: the imported dataset's, else 200)")
    p.add_argument("--chunks-size", type=int, default=None,
                   help="LeRobot: files per chunk-XXX directory (default: the imported dataset's, else 1000)")
    p.add_argument("--storage-options", help="fsspec storage options as a JSON object")
    _quiet_option(p)
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("import", help="import parquet, minari or d4rl data into a new store",
                       description="Create a store from a replaystore Parquet export, a Minari dataset "
                                   "or a D4RL-style HDF5 file.")
    p.add_argument("src", help="source directory, file, or Minari dataset id")
    p.add_argument("url", help="the store to create")
    p.add_argument("--from", dest="from_", required=True, help="parquet | minari | d4rl | lerobot")
    p.add_argument("--dataset-id", help="Minari dataset id (when SRC is a directory)")
    p.add_argument("--storage-options", help="fsspec storage options as a JSON object")
    _quiet_option(p)
    p.set_defaults(func=_cmd_import)

    p = sub.add_parser("report", help="write a self-contained HTML report of a store (plots, statistics, frames)",
                       description="Write one self-contained HTML file about a store: the summary, streams, "
                                   "episode returns and lengths (histograms, the learning curve), per-field "
                                   "statistics, data health, frame strips of image fields, saved sampler states "
                                   "and commits per writer. It needs no network to view.")
    p.add_argument("url", help="store URL or path")
    p.add_argument("-o", "--output", help="the HTML file (default: <store name>-report.html here)")
    p.add_argument("--table", help="the table to report on (a store with several tables)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--storage-options", help="fsspec storage options as a JSON object")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("stats", help="per-field statistics as LeRobot's meta/stats.json",
                       description="Per-field statistics of a table (min, max, mean, std, count and the "
                                   "quantiles q01 q10 q50 q90 q99; per dimension for small vectors, per "
                                   "channel for images) in the layout of a LeRobot dataset's meta/stats.json "
                                   "(docs/GUIDE.md, 'Statistics and data health').")
    p.add_argument("url", help="store path or URL")
    p.add_argument("-o", "--output", help="write the JSON to this file (default: stdout)")
    p.add_argument("--table", help="which table (stores with several tables)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary line")
    p.add_argument("--storage-options", help="fsspec storage options as a JSON object")
    p.set_defaults(func=_cmd_stats)

    p = sub.add_parser("bench", help="run the benchmarks against TorchRL (bench/*.py)",
                       description="Run the benchmark scripts of a source checkout (bench/): they print "
                                   "our figures, the peers' figures and the ratios measured in the same run. "
                                   "Needs the bench extra: pip install 'replaystore[bench]'.")
    p.add_argument("which", nargs="*", help="store, loader, ... (default: every bench/*_bench.py)")
    p.add_argument("--quick", action="store_true", help="smaller sizes (about a minute each)")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("demo", help="run the end-to-end demo",
                       description="Run replaystore end to end on a small built-in example.")
    p.add_argument("dir", nargs="?", default=None, help="where to put the demo store (default: a temp dir)")
    _quiet_option(p)
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``replaystore`` command line.

    Errors are reported on stderr as one line and turned into an exit code
    (:func:`exit_code`); ``REPLAYSTORE_TRACEBACK=1`` also prints the traceback.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit code (0 on success; see :data:`EXIT_CODES`).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    if args.quiet_all:  # replaystore --quiet COMMAND: as COMMAND --quiet
        args.quiet = True
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at exit
        return code
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print(f"replaystore {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        code = exit_code(exc)
        what = "internal error: " + type(exc).__name__ + ": " if code == EXIT_INTERNAL else "error: "
        print(f"replaystore {args.command}: {what}{_one_line(exc)}", file=sys.stderr)
        if os.environ.get("REPLAYSTORE_TRACEBACK") == "1":
            traceback.print_exc()
        return code


def exit_code(exc: BaseException) -> int:
    """The exit code of the command that raised ``exc`` (see :data:`EXIT_CODES`).

    Parameters
    ----------
    exc : BaseException
        The error.

    Returns
    -------
    int
        Not found, corrupt, usage (replaystore's other errors and bad storage
        URLs), storage (``OSError`` and ``StorageError``) or internal.
    """
    from replaystore.store.storage import StorageURLError

    if isinstance(exc, StoreNotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(exc, (CorruptObjectError, FormatVersionError)):
        return EXIT_CORRUPT
    if isinstance(exc, StorageURLError):
        return EXIT_USAGE
    if isinstance(exc, OSError) or type(exc).__name__ == "StorageError":
        return EXIT_STORAGE
    if isinstance(exc, ReplayStoreError):
        return EXIT_USAGE
    return EXIT_INTERNAL


def _one_line(exc: BaseException) -> str:
    """``exc``'s message on one line (OSError: its strerror and file name, as the shell shows them)."""
    if isinstance(exc, OSError) and not isinstance(exc, ReplayStoreError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's own flush at exit cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
