"""``export_store``: a store's records in the formats offline-RL tools load.

==============  =====================================================================
format          what is written at ``out``
==============  =====================================================================
``parquet``     a hive-partitioned Parquet dataset (``stream=<key>/part-N.parquet``)
                plus ``_replaystore.json``; DuckDB and pyarrow.dataset read it directly
``minari``      a Minari dataset (Arrow backend) under the datasets root ``out``:
                ``out/<dataset_id>/data/`` — ``minari.load_dataset(id)`` loads it
``minari-hdf5`` the same with Minari's HDF5 backend (needs h5py)
``d4rl``        one D4RL-style HDF5 file at ``out`` (needs h5py)
``lerobot``     a LeRobot v3.0 dataset in the new directory ``out`` (images need Pillow,
                videos PyAV: stored packets are remuxed, not re-encoded)
==============  =====================================================================

Every format streams the table in bounded chunks; see docs/EXPORT.md for the layouts
and the field mappings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from replaystore.errors import StoreError
from replaystore.tools.formats.common import expand_local
from replaystore.tools.info import size_text

EXPORT_FORMATS = ("parquet", "minari", "minari-hdf5", "d4rl", "lerobot")


def export_store(store: Any, out: str, to: str, *, table: str | None = None, dataset_id: str | None = None,
                 progress: bool = False, stack: int | None = None, data_files_size_in_mb: float | None = None,
                 video_files_size_in_mb: float | None = None, chunks_size: int | None = None) -> dict[str, Any]:
    """Export ``store`` to ``out`` in format ``to`` (one of :data:`EXPORT_FORMATS`).

    Parameters
    ----------
    store : Store
        The store to export (its records as of the call).
    out : str
        Where to write (see the module's table).
    to : str
        The format: ``"parquet"``, ``"minari"``, ``"minari-hdf5"``, ``"d4rl"`` or ``"lerobot"``.
    table : str, optional
        One table of a multi-table store (Parquet exports every table when it is None;
        the episode formats need exactly one).
    dataset_id : str, optional
        The Minari dataset id (default ``replaystore/<store name>-v0``); Minari only.
    progress : bool
        Show a progress bar when stderr is a terminal.
    stack : int, optional
        ``frames`` stores, Minari and D4RL only: each observation is the stack of
        the ``stack`` latest frames of its episode (default: one frame). Parquet
        keeps one frame per record (and the frame field's codec).
    data_files_size_in_mb, video_files_size_in_mb, chunks_size : optional
        LeRobot only: the size limits of its data (and episode) files and video files in
        MiB, and the files per chunk directory; files split as LeRobot's writer splits
        them (default: an imported dataset's values, else LeRobot's 100, 200 and 1000).

    Returns
    -------
    dict
        A summary: format, path, files written, records, episodes (episode formats) and
        streams.

    Raises
    ------
    StoreError
        An unknown format, ``dataset_id`` for a format other than Minari, ``stack``
        for Parquet, a LeRobot size limit for another format, or what the format's
        exporter raises (an unknown table, ``out`` not empty, ``stack`` for a store that is not a frames store, ...).


    Notes
    -----
    Cost: one streaming read of the table in bounded chunks, and the files written.

    A ``frames`` store (one frame per record, an episode's final frame on a
    frame-only record) exports its episodes of T + 1 records as T steps: Minari
    observations are the T + 1 frames, D4RL rows pair frame t with frame t + 1.
    Importing the export gives the frames store back (docs/EXPORT.md, "Frames
    stores").
    """
    out = expand_local(out)
    if to not in EXPORT_FORMATS:
        raise StoreError(f"unknown export format {to!r}: expected one of {', '.join(EXPORT_FORMATS)}")
    if dataset_id is not None and not to.startswith("minari"):
        raise StoreError(f"dataset_id applies to Minari exports only, not {to!r}")
    limits = {"data_files_size_in_mb": data_files_size_in_mb, "video_files_size_in_mb": video_files_size_in_mb,
              "chunks_size": chunks_size}
    given = [k for k, v in limits.items() if v is not None]
    if given and to != "lerobot":
        raise StoreError(f"{given[0]} applies to LeRobot exports only, not {to!r}")
    if stack is not None and to == "parquet":
        raise StoreError(f"stack={stack!r}: Parquet exports keep one frame per record (and its codec); "
                         f"stack applies to Minari and D4RL exports of frames stores")
    if to == "parquet":
        from replaystore.tools.formats.parquet import export_parquet

        return export_parquet(store, out, table=table, progress=progress)
    if to in ("minari", "minari-hdf5"):
        from replaystore.tools.formats.minari import export_minari

        return export_minari(store, out, table=table, dataset_id=dataset_id, progress=progress,
                             backend="hdf5" if to == "minari-hdf5" else "arrow", stack=stack)
    if to == "lerobot":
        if stack is not None:
            raise StoreError(f"stack={stack!r}: LeRobot exports keep one frame per record")
        from replaystore.tools.formats.lerobot import export_lerobot

        return export_lerobot(store, out, table=table, progress=progress, data_files_size_in_mb=data_files_size_in_mb,
                              video_files_size_in_mb=video_files_size_in_mb, chunks_size=chunks_size)
    from replaystore.tools.formats.d4rl import export_d4rl

    return export_d4rl(store, out, table=table, progress=progress, stack=stack)


def _local_bytes(path: str) -> int | None:
    """The bytes of the files at local ``path`` (a file, or a directory's files); None for a URL."""
    if "://" in path and not path.startswith("file://"):
        return None
    path = path.removeprefix("file://")
    if os.path.isfile(path):
        return os.path.getsize(path)
    if not os.path.isdir(path):
        return None
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def export_summary(summary: Mapping[str, Any]) -> str:
    """One line a person reads on what :func:`export_store` wrote (``replaystore export`` prints it).

    Parameters
    ----------
    summary : mapping
        What :func:`export_store` returned.

    Returns
    -------
    str
        ``"<format> at <path>: N records in S streams, E episodes, F files, <size>"`` (the
        parts the summary has; the size of a local output's files).
    """
    parts = [f"{summary['records']} records"
             + (f" in {summary['streams']} stream{'s' if summary['streams'] != 1 else ''}"
                if summary.get("streams") is not None else "")]
    if summary.get("episodes") is not None:
        parts.append(f"{summary['episodes']} episodes")
    if summary.get("files") is not None:
        parts.append(f"{summary['files']} file{'s' if summary['files'] != 1 else ''}")
    size = _local_bytes(str(summary["path"]))
    if size is not None:
        parts.append(size_text(size))
    what = summary["format"] + (f" dataset {summary['dataset_id']}" if summary.get("dataset_id") else "")
    return f"{what} at {summary['path']}: {', '.join(parts)}"


__all__ = ["EXPORT_FORMATS", "export_store", "export_summary"]
