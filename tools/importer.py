"""``import_store``: a new store from a replaystore Parquet export, a Minari dataset or a D4RL HDF5 file.

==============  =====================================================================
format          what ``src`` is, and the store created at ``url``
==============  =====================================================================
``parquet``     a directory written by ``export_store(..., to="parquet")``: the exact
                schema(s), streams, steps, resets and values come back
``minari``      a Minari dataset (Arrow, Parquet or HDF5 backend, detected from its
                ``metadata.json``): its ``data`` directory, the dataset directory, a
                dataset id under ``$MINARI_DATASETS_PATH`` (default
                ``~/.minari/datasets``), or — with ``dataset_id`` — the datasets root.
                Creates an ``episode``-schema store
``minari-hdf5`` the same (accepted for symmetry with the export names)
``d4rl``        a D4RL-style HDF5 file: an ``episode``-schema store when it has
                ``timeouts``, a ``transitions`` store otherwise
``lerobot``     a LeRobot v3.0 dataset directory: one stream per episode, one field per
                feature, videos as their demuxed packets (not re-encoded)
==============  =====================================================================

See docs/EXPORT.md for the mappings.
"""

from __future__ import annotations

from typing import Any

from replaystore.errors import StoreError
from replaystore.tools.formats.common import expand_local

IMPORT_FORMATS = ("parquet", "minari", "minari-hdf5", "d4rl", "lerobot")


def import_store(src: str, url: str, from_: str, *, dataset_id: str | None = None, progress: bool = False,
                 storage_options: Any = None) -> Any:
    """Create the store at ``url`` (it must not exist) from ``src`` in format ``from_``.

    Parameters
    ----------
    src : str
        What to import (see the module's table).
    url : str
        Where to create the store (new, or an empty directory).
    from_ : str
        The format: ``"parquet"``, ``"minari"``, ``"minari-hdf5"``, ``"d4rl"`` or ``"lerobot"``.
    dataset_id : str, optional
        The Minari dataset id, with ``src`` the datasets root; Minari only.
    progress : bool
        Show a progress bar when stderr is a terminal.
    storage_options : dict, optional
        The fsspec options of ``url`` (and of ``src`` for Parquet URLs).

    Returns
    -------
    Store
        The new store, opened.

    Raises
    ------
    ImportSourceError
        ``src`` is malformed: a file that cannot be read (garbage, truncated), a column or
        dataset missing, or one whose type or shape differs from the target schema's
        (nothing is cast or reinterpreted; complex values are refused). Names the column.
    StoreError
        An unknown format, ``dataset_id`` for a format other than Minari, or what the
        format's importer raises otherwise.
    StoreExistsError
        ``url`` is not new or empty (a store, or anything else, is there); it is left as it was.

    Notes
    -----
    Cost: one streaming read of ``src`` (and of the files' footers, checked first) and the
    appends and commits of its records. The source is checked before the store is created;
    an import that fails later removes what it created, so a failed import leaves ``url``
    as it was (absent, or an empty directory).
    """
    src = expand_local(src)
    url = expand_local(url)
    if from_ not in IMPORT_FORMATS:
        raise StoreError(f"unknown import format {from_!r}: expected one of {', '.join(IMPORT_FORMATS)}")
    if dataset_id is not None and not from_.startswith("minari"):
        raise StoreError(f"dataset_id applies to Minari imports only, not {from_!r}")
    if from_ == "parquet":
        from replaystore.tools.formats.parquet import import_parquet

        return import_parquet(src, url, progress=progress, storage_options=storage_options)
    if from_ in ("minari", "minari-hdf5"):
        from replaystore.tools.formats.minari import import_minari

        return import_minari(src, url, dataset_id=dataset_id, progress=progress, storage_options=storage_options)
    if from_ == "lerobot":
        from replaystore.tools.formats.lerobot import import_lerobot

        return import_lerobot(src, url, progress=progress, storage_options=storage_options)
    from replaystore.tools.formats.d4rl import import_d4rl

    return import_d4rl(src, url, progress=progress, storage_options=storage_options)


__all__ = ["IMPORT_FORMATS", "import_store"]
