"""``replaystore info`` and ``replaystore verify``."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from tqdm import tqdm

from replaystore.errors import ReplayStoreError
from replaystore.store import Store, open_store
from replaystore.store.maintenance import Problem, verify_store


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def size_text(n: int) -> str:
    """A byte count as ``replaystore info`` prints it (``"1.3 MiB"``).

    Parameters
    ----------
    n : int
        Bytes.

    Returns
    -------
    str
        The size in B, KiB, MiB or GiB.
    """
    return _size(n)


def print_info(st: Store) -> None:
    """Print ``replaystore info``'s report on store ``st``: its manifest, size, state slots and tables.

    Cost: one ``Store.info`` (a listing of the store).
    """
    info = st.info()
    print(f"store           {info['url']}")
    print(f"format version  {info['format_version']}")
    print(f"capacity        {info['capacity'] if info['capacity'] is not None else 'unbounded (dataset)'}")
    print(f"writers         {info['writers']} ({info['writers_closed']} closed)")
    print(f"commits         {info['commits']}")
    checkpoint = info["log_checkpoint"]
    print(f"log checkpoint  {'none' if checkpoint is None else f'#{checkpoint}'}")
    print(f"size on disk    {_size(info['bytes'])} allocated, {_size(info['apparent_bytes'])} apparent")
    cache = info["chunk_cache"]
    if cache is not None:  # a store on S3: where this machine keeps its chunk objects
        print(f"chunk cache     {cache['directory']} ({_size(cache['bytes'])} of this store here)")
    slots = info["state"]
    print(f"state slots     {len(slots) or 'none'}")
    for slot, st_info in slots.items():
        versions = st_info["versions"]
        print(f"  {slot!r}: {len(versions)} version(s) {versions[0]}..{versions[-1]}, {_size(st_info['bytes'])}")
    for name, t in info["tables"].items():
        print(f"\ntable {name!r}: {t['records']} records, {t['streams']} streams, {t['fragments']} fragments")
        print("\n".join("  " + line for line in st.schemas[name].describe().splitlines()))
        for col, c in t.get("columns", {}).items():
            ratio = f"{c['raw'] / c['stored']:.1f}x" if c["stored"] else "-"
            print(f"  {col:24s} {_size(c['stored']):>10s} stored, {_size(c['raw']):>10s} raw ({ratio}) "
                  f"codec {c['codec'] or 'none'}")


def run_verify(url: str, storage_options: Mapping[str, Any] | None) -> int:
    """Verify the store at ``url`` and print each problem found (``replaystore verify``).

    Returns the command's exit status: 0 when the store is intact, 1 when damaged. Cost: a
    read of every live fragment.
    """
    problems: list[Problem]
    try:
        st = open_store(url, mode="r", storage_options=storage_options)
    except ReplayStoreError as exc:
        if not getattr(exc, "path", None):
            raise
        print(f"DAMAGED {exc}")
        return 1
    total = sum(len(st.table(t).view().fragments) for t in st.tables)
    with tqdm(total=total, desc="verify", unit="fragment", disable=not sys.stderr.isatty()) as bar:

        def advance(n: int) -> None:
            bar.update(n - bar.n)

        problems = verify_store(st, progress=advance)
    for p in problems:
        print(f"DAMAGED {p}")
    if problems:
        print(f"{len(problems)} problem(s) in {st.url}")
        return 1
    print(f"ok: {st.url} verified ({total} fragments)")
    return 0
