"""Minari datasets (format of Minari 0.5.x), written and read without importing minari.

On disk (what ``minari.load_dataset(id)`` reads, with ``MINARI_DATASETS_PATH`` = the root):

``<root>/<dataset_id>/data/metadata.json``
    ``dataset_id``, ``minari_version`` (must be one of the reader's supported dataset
    versions), ``data_format`` (``arrow`` | ``hdf5``), ``jpeg_encoding`` (false: arrays are
    stored raw), ``observation_space`` / ``action_space`` (Minari's JSON serialisation of
    gymnasium spaces), ``total_episodes``, ``total_steps``, plus ``replaystore`` (the source
    schema and the mapping used).
Arrow backend: ``data/<episode id>/part-0.arrow``
    one Arrow IPC file holding one record batch of T + 1 rows: ``observations``,
    ``actions``, ``rewards``, ``terminations``, ``truncations`` (the last four padded with one
    zero row) and ``infos`` (a struct, one row per observation); ``data/<id>/metadata.json``
    holds ``id`` and ``total_steps``.
HDF5 backend: ``data/main_data.hdf5``
    one group ``episode_<id>`` per episode with datasets ``observations`` (T + 1 rows),
    ``actions``, ``rewards``, ``terminations``, ``truncations`` (T rows) and group ``infos``;
    attributes ``id`` and ``total_steps``.

Both backends also record ``replaystore_stream`` and ``replaystore_first_step`` per episode,
which import uses to restore streams and steps. The mapping from replaystore fields is in
docs/EXPORT.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from replaystore.errors import ImportSourceError, SchemaError, StoreError
from replaystore.schemas import Dense, Schema, nested
from replaystore.schemas import episode as episode_schema
from replaystore.store import Store, open_store
from replaystore.tools.formats import minari_obs as mo
from replaystore.tools.formats.common import (
    FRAME_FIELD,
    Episode,
    ImportDestination,
    SourceErrors,
    StepMapping,
    check_stack,
    chunk_rows,
    expand_local,
    flags,
    frame_records,
    frame_steps,
    h5_dataset,
    iter_chunks,
    iter_episodes,
    numeric_kind,
    pick_table,
    progress_bar,
    require_h5py,
    stack_frames,
    step_mapping,
    stream_key_json,
    tree_concat,
)

MINARI_VERSION = "0.5.4"
"""The Minari dataset version written: the on-disk layout of Minari 0.5.4 (``jpeg_encoding`` honoured)."""
DATASET_ID_RE = re.compile(r"^(?:(?P<namespace>[-_\w][-_\w/]*[-_\w]+)/)?(?P<dataset>[-_\w]+?)-v(?P<version>\d+)$")
NAMESPACE_RE = re.compile(r"[-_\w][-_\w/]*[-_\w]+")
NAMESPACE_METADATA = "namespace_metadata.json"
HDF5_FILE = "main_data.hdf5"
COMMIT_BYTES = 64 << 20


# -- spaces ------------------------------------------------------------------------------------------


def box_space(dtype: np.dtype, shape: tuple[int, ...], bound: int | None = None) -> dict[str, Any]:
    """A gymnasium Box as Minari serialises it (``low``/``high`` spelled out over the shape).

    Parameters
    ----------
    dtype : numpy.dtype
        The space's dtype.
    shape : tuple of int
        The space's shape.
    bound : int, optional
        For integer dtypes, the bounds are ``[0, bound - 1]`` (default: the
        dtype's range).

    Returns
    -------
    dict of str to Any
        The JSON-ready space document.
    """
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        low, high = -np.inf, np.inf
    elif dtype.kind == "b":
        low, high = False, True
    elif bound is not None:
        low, high = 0, bound - 1
    else:
        info = np.iinfo(dtype)
        low, high = info.min, info.max
    return {"type": "Box", "dtype": str(dtype), "shape": list(shape),
            "low": np.full(shape, low, dtype=dtype).tolist(), "high": np.full(shape, high, dtype=dtype).tolist()}


def discrete_space(n: int) -> dict[str, Any]:
    """A gymnasium Discrete space of ``n`` actions as Minari serialises it.

    Parameters
    ----------
    n : int
        The number of actions.

    Returns
    -------
    dict of str to Any
        The JSON-ready space document.
    """
    return {"type": "Discrete", "dtype": "int64", "start": 0, "n": int(n)}


def _parse_space(text: Any, what: str, nested: bool = False) -> dict[str, Any]:
    try:
        doc = json.loads(text) if isinstance(text, str) else text
    except ValueError as exc:
        raise StoreError(f"Minari {what}: not a JSON space document ({exc})") from None
    if nested and isinstance(doc, dict) and doc.get("type") in mo.NESTED_TYPES:
        mo.check_space(doc, what)
        return doc
    if not isinstance(doc, dict) or doc.get("type") not in mo.LEAF_TYPES:
        kind = doc.get("type") if isinstance(doc, dict) else type(doc).__name__
        raise StoreError(f"Minari {what} of type {kind!r}: only {', '.join(mo.LEAF_TYPES)} spaces can be "
                         f"imported")
    mo.leaf_layout(doc)  # a malformed document is a StoreError
    return doc


def _is_image(space: dict[str, Any]) -> bool:
    shape = space.get("shape", [])
    return (space["type"] == "Box" and space.get("dtype") == "uint8" and len(shape) in (2, 3)
            and shape[0] >= 32 and shape[1] >= 32 and bool(np.all(np.asarray(space["low"]) == 0))
            and bool(np.all(np.asarray(space["high"]) == 255)))


# -- environment metadata and infos ------------------------------------------------------------------

INFO_PREFIX, VALID_SUFFIX, RESET_SUFFIX = "info_", "_valid", "_reset"
"""Recorded info columns: ``info_<key>`` (the step's info), ``info_<key>_valid`` (whether it had the key) and,
in imported stores, ``info_<key>_reset`` (the reset info, on an episode's first record)."""


def _recorded_space(schema: Schema, key: str, name: str) -> tuple[dict[str, Any], str] | None:
    """The space ``key`` the schema metadata keeps (Minari's JSON) and its text, when it describes field ``name``.

    It describes the field when its Dict/Tuple nesting and every leaf's dtype and shape are the field's
    (:func:`~replaystore.tools.formats.minari_obs.space_fits`); otherwise (or when absent or malformed) None.
    """
    text = schema.metadata.get(key)
    if not isinstance(text, str):
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return (doc, text) if mo.space_fits(doc, schema, name) else None


@dataclass(frozen=True)
class InfoColumns:
    """The columns one recorded info key is stored in (see :data:`INFO_PREFIX`).

    Attributes
    ----------
    key : str
        The info key (``infos/<key>`` in Minari).
    value, valid : str
        The step value and presence columns.
    reset : str or None
        The reset-info column, when the store has one.
    """

    key: str
    value: str
    valid: str
    reset: str | None


def info_columns(schema: Schema) -> list[InfoColumns]:
    """The recorded info keys of ``schema``: every Dense ``info_<key>`` with a bool ``info_<key>_valid``.

    Parameters
    ----------
    schema : Schema
        The table's schema.

    Returns
    -------
    list of InfoColumns
        In field order. Cost: one pass over the fields.
    """
    dense = {f.name: f for f in schema.fields if isinstance(f, Dense)}
    out = []
    for name, f in dense.items():
        valid = dense.get(name + VALID_SUFFIX)
        if valid is None or not name.startswith(INFO_PREFIX) or len(name) == len(INFO_PREFIX):
            continue
        if valid.dtype != np.bool_ or valid.shape:
            continue
        reset = dense.get(name + RESET_SUFFIX)
        kept = reset.name if reset is not None and reset.dtype == f.dtype and reset.shape == f.shape else None
        out.append(InfoColumns(name[len(INFO_PREFIX):], name, valid.name, kept))
    return out


def _info_rows(ic: InfoColumns, data: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Minari's T + 1 rows of info key ``ic.key`` for one episode and which rows had the key.

    Row 0 is the reset info (zero and absent without a reset column), rows 1.. the steps' infos
    (zero where the step lacked the key).
    """
    values, valid = data[ic.value], data[ic.valid].astype(bool)
    first = data[ic.reset][:1] if ic.reset else np.zeros((1, *values.shape[1:]), values.dtype)
    where = valid.reshape(-1, *([1] * (values.ndim - 1)))
    rows = np.concatenate([first, np.where(where, values, np.zeros((), values.dtype))])
    return rows, np.concatenate([[ic.reset is not None], valid])


# -- export --------------------------------------------------------------------------------------------


def default_dataset_id(store: Store, table: str) -> str:
    """The Minari dataset id an export uses when none is given: ``replaystore/<name>-v0``.

    Parameters
    ----------
    store : Store
        The store; ``<name>`` is its URL's last part, sanitised.
    table : str
        Fallback name when the URL has no last part.

    Returns
    -------
    str
        The dataset id.
    """
    name = re.sub(r"[^-_\w]+", "_", os.path.basename(store.url.rstrip("/")) or table).strip("_") or "store"
    return f"replaystore/{name}-v0"


def _check_id(dataset_id: Any) -> None:
    """Minari's own id rule (``minari.dataset.minari_dataset.DATASET_ID_RE``, with the version required).

    The id becomes a path under the datasets root; the rule admits no ``.``, no leading ``/``
    and no backslash, so it cannot leave that root.
    """
    if isinstance(dataset_id, str) and DATASET_ID_RE.fullmatch(dataset_id):
        return
    hint = ""
    if isinstance(dataset_id, str) and "/" in dataset_id:
        namespace = dataset_id.rpartition("/")[0]
        if not NAMESPACE_RE.fullmatch(namespace):
            hint = (f"; the namespace {namespace!r} must be at least two characters of letters, digits, '-' and "
                    f"'_', with '/' only between its parts (Minari's own rule)")
    raise StoreError(f"Minari dataset id {dataset_id!r}: expected (namespace/)name-v<version>, "
                     f"e.g. tictactoe/random-v0{hint}")


def _mark_namespaces(root: Path, dataset_id: str) -> None:
    """Write Minari's ``namespace_metadata.json`` (``{}``) into each namespace level that lacks one.

    As ``minari.namespace.create_namespace`` does, so ``minari.list_local_namespaces()`` lists them.
    """
    namespace = dataset_id.rpartition("/")[0]
    parts = [p for p in namespace.split("/") if p]
    for depth in range(1, len(parts) + 1):
        marker = root.joinpath(*parts[:depth]) / NAMESPACE_METADATA
        if not marker.exists():
            marker.write_text("{}")


def _action_space(m: StepMapping, table: Any, rows: int) -> tuple[dict[str, Any], bool]:
    """The action space and whether its size was inferred from the data (no declared count)."""
    f = m.schema.field(m.action)
    assert isinstance(f, Dense)
    if f.dtype.kind == "f" or f.dtype.kind == "b":
        return box_space(f.dtype, f.shape), False
    declared = f.id_bound or m.schema.metadata.get("actions")
    if f.shape:
        return box_space(f.dtype, f.shape, declared), False
    if declared:
        return discrete_space(declared), False
    top = -1
    for b in table.scan([m.action], rows):  # one column only
        if b.num_rows:
            top = max(top, int(np.max(b.column(0).to_numpy())))
    return discrete_space(max(top + 1, 1)), True


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    kind = f"u{a.dtype.itemsize}"
    return bool(np.array_equal(a.view(kind), b.view(kind)))


def _pad(a: np.ndarray) -> np.ndarray:
    return np.concatenate([a, np.zeros((1, *a.shape[1:]), dtype=a.dtype)])


class _Episodes:
    """Turns exported episodes into Minari's per-episode arrays."""

    def __init__(self, m: StepMapping, obs_space: dict[str, Any], action_space: dict[str, Any]) -> None:
        self.m = m
        self.obs_space, self.action_space = obs_space, action_space
        self.warned = False
        self.next_obs_kept = False
        self.info = info_columns(m.schema)
        self.info_names = {n for ic in self.info for n in (ic.value, ic.valid, ic.reset) if n}

    def frame_arrays(self, ep: Episode, stack: int | None) -> dict[str, Any] | None:
        """A frames-store episode of N records: N observations (stacked when asked), N - 1 steps."""
        m = self.m
        fe = frame_steps(m, ep)
        if fe is None:
            return None
        actions = fe.steps[m.action]
        if self.action_space["type"] == "Discrete":
            actions = actions.astype(np.int64, copy=False)
        where = f"in stream {ep.stream!r}"
        mo.check_in_space(self.action_space, actions, m.action, "action", where)
        obs = fe.frames if stack is None else stack_frames(fe.frames, stack)
        mo.check_in_space(self.obs_space, obs, m.obs, "observation", where)
        return {
            "observations": obs,
            "actions": actions,
            "rewards": fe.steps[m.reward],
            "terminations": fe.term,
            "truncations": fe.trunc,
            "infos": dict(fe.extras),  # T + 1 rows already: one per record, the last the final frame's
            "meta": {"replaystore_stream": stream_key_json(ep.stream), "replaystore_first_step": ep.first_step,
                     "replaystore_cut": fe.cut},
        }

    def arrays(self, ep: Episode) -> dict[str, Any]:
        m = self.m
        obs, nxt = ep.data[m.obs], ep.data[m.next_obs]
        infos = {e.key: _pad(ep.data[e.key]) for e in m.extras if e.name not in self.info_names}
        for ic in self.info:
            infos[ic.key], present = _info_rows(ic, ep.data)
            if not present.all():  # as Gymnasium's vector infos mark it: "_<key>", true where the key was
                infos["_" + ic.key] = present
        cut = mo.tree_map(lambda a: a[:-1], nxt)
        chained = mo.tree_same_bits(cut, mo.tree_map(lambda a: a[1:], obs), _same_bits)
        if not m.episodic or not chained:
            if m.episodic and not self.warned:
                warnings.warn(f"Minari export: in stream {ep.stream!r} from step {ep.first_step}, "
                              f"'{m.next_obs}' is not the next step's '{m.obs}'; every record's "
                              f"'{m.next_obs}' of such episodes is kept in infos['next_obs']", stacklevel=4)
                self.warned = True
            if isinstance(nxt, (dict, tuple)):  # a nested observation: one infos key per leaf
                infos.update({k: _pad(v) for k, v in mo.tree_flat(m.next_obs, nxt).items()})
            else:
                infos["next_obs"] = _pad(nxt)
            self.next_obs_kept = True
        actions = ep.data[m.action]
        where = f"in stream {ep.stream!r}"
        if self.action_space["type"] == "Discrete":
            actions = actions.astype(np.int64, copy=False)
        mo.check_in_space(self.action_space, actions, m.action, "action", where)
        mo.check_in_space(self.obs_space, obs, m.obs, "observation", where)
        mo.check_in_space(self.obs_space, nxt, m.next_obs, "observation", where)
        return {
            "observations": tree_concat([obs, mo.tree_map(lambda a: a[-1:], nxt)]),
            "actions": actions,
            "rewards": ep.data[m.reward],
            "terminations": ep.term,
            "truncations": ep.trunc,
            "infos": infos,
            "meta": {"replaystore_stream": stream_key_json(ep.stream), "replaystore_first_step": ep.first_step},
        }


def _fixed(a: np.ndarray) -> pa.Array:
    flat = np.ascontiguousarray(a).reshape(len(a), -1)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])


class _ArrowWriter:
    """Episodes as Minari's ``ArrowStorage`` writes them.

    Discrete: plain int64; Box, MultiDiscrete and MultiBinary: fixed-size lists of their dtype;
    Dict/Tuple: structs.
    """

    def __init__(self, data: Path, obs_space: dict[str, Any], action_space: dict[str, Any]) -> None:
        self.data, self.obs_space, self.action_space = data, obs_space, action_space

    def write(self, i: int, ep: dict[str, Any]) -> None:
        t = len(ep["rewards"])
        cols = {
            "observations": mo.encode_arrow(self.obs_space, ep["observations"], _fixed),
            "actions": mo.encode_arrow(self.action_space, _pad(ep["actions"]), _fixed),
            "rewards": pa.array(_pad(ep["rewards"])),
            "terminations": pa.array(_pad(ep["terminations"])),
            "truncations": pa.array(_pad(ep["truncations"])),
        }
        if ep["infos"]:
            arrays, fields = [], []
            for key, value in ep["infos"].items():
                if value.ndim == 1:
                    arr = pa.array(value)
                    fields.append(pa.field(key, arr.type))
                else:  # as Minari encodes arrays: flattened fixed-size lists + the trailing shape
                    arr = _fixed(value)
                    fields.append(pa.field(key, arr.type, metadata={"shape": ",".join(map(str, value.shape[1:]))}))
                arrays.append(arr)
            cols["infos"] = pa.StructArray.from_arrays(arrays, fields=fields)
        batch = pa.RecordBatch.from_pydict(cols)
        folder = self.data / str(i)
        folder.mkdir()
        with pa.OSFile(str(folder / "part-0.arrow"), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as w:
            w.write_batch(batch)
        (folder / "metadata.json").write_text(json.dumps({"id": i, "total_steps": t, **ep["meta"]}))

    def close(self) -> None:
        pass


class _HDF5Writer:
    def __init__(self, data: Path, h5py: Any) -> None:
        self.file = h5py.File(data / HDF5_FILE, "w", track_order=True)

    def write(self, i: int, ep: dict[str, Any]) -> None:
        g = self.file.create_group(f"episode_{i}")
        g.attrs["id"] = i
        g.attrs["total_steps"] = len(ep["rewards"])
        for k, v in ep["meta"].items():
            g.attrs[k] = v
        mo.write_hdf5(g, "observations", ep["observations"])
        for k in ("actions", "rewards", "terminations", "truncations"):
            g.create_dataset(k, data=ep[k])
        infos = g.create_group("infos")  # always, so that Minari returns {} (not None) without extras
        for k, v in ep["infos"].items():
            infos.create_dataset(k, data=v)

    def close(self) -> None:
        self.file.close()


def export_minari(store: Store, out: str, *, table: str | None = None, dataset_id: str | None = None,
                  backend: str = "arrow", progress: bool = False, batch_rows: int | None = None,
                  stack: int | None = None) -> dict[str, Any]:
    """Write one table as the Minari dataset ``dataset_id`` under the datasets root ``out``.

    The files are written without importing minari; ``minari.load_dataset``
    reads them (docs/EXPORT.md). Reads each stream in step order a chunk at a
    time; memory is a few chunks plus the episode being assembled. A failed
    export removes the dataset directory.

    Parameters
    ----------
    store : Store
        The opened store.
    out : str
        A local datasets root (or ``file://`` URL).
    table : str, optional
        The table to export; required when the store has several.
    dataset_id : str, optional
        ``(namespace/)name-v<version>``; default :func:`default_dataset_id`.
    backend : {"arrow", "hdf5"}, optional
        Minari's data format.
    progress : bool, optional
        Show a progress bar on stderr (when it is a terminal).
    batch_rows : int, optional
        Records per read (default: about 16 MiB worth).
    stack : int, optional
        Frames stores only: each observation is the stack of the ``stack``
        latest frames of its episode (``(T + 1, stack, *frame_shape)`` per
        episode, reset-padded as gymnasium's ``FrameStackObservation``); default
        one frame per observation.

    Returns
    -------
    dict of str to Any
        ``format``, ``path``, ``dataset_id``, ``files``, ``records`` (steps
        exported), ``episodes`` and ``streams``.

    Raises
    ------
    StoreError
        A malformed dataset id, ``out`` not local or the dataset already
        existing, h5py missing for ``"hdf5"``, the store has several tables and
        none was chosen, the schema has no step fields, a ragged id lies outside
        its mask, ``batch_rows`` is not a positive int, or ``stack`` is not a
        positive int or is given for a store that is not a frames store.

    Notes
    -----
    A ``frames`` store (``replaystore.schemas.frames``) exports each episode's
    T + 1 records as T steps: its observations are the T + 1 frames (the last
    one the final frame), its actions, rewards and flags those of the first T
    records, its infos the extras of all T + 1 records. An episode still being
    collected (its last step without terminated or truncated) exports with
    ``truncations[-1]`` true (episode metadata ``replaystore_cut``); a lone
    first frame (no step yet) is left out.
    """
    out = expand_local(out)
    t = pick_table(store, table)
    m = step_mapping(t.schema, "Minari")
    stack = check_stack(stack, m, "Minari")
    h5py = require_h5py() if backend == "hdf5" else None
    dataset_id = dataset_id or default_dataset_id(store, t.name)
    _check_id(dataset_id)
    if "://" in out and not out.startswith("file://"):
        raise StoreError(f"{out}: Minari datasets are written to a local directory")
    root = Path(out.removeprefix("file://"))
    dataset_dir = root / dataset_id
    if dataset_dir.exists():
        raise StoreError(f"{dataset_dir}: a Minari dataset {dataset_id!r} already exists; "
                         f"choose another dataset id or version")
    rows = chunk_rows(t.schema, batch_rows)
    # the spaces the schema metadata keeps (recorded from the environment) where they describe the fields;
    # else Box spaces of the fields' dtypes and shapes (a Discrete action space for a scalar int action)
    recorded_obs = _recorded_space(t.schema, "observation_space", m.obs) if stack is None else None
    recorded_act = _recorded_space(t.schema, "action_space", m.action)
    obs_doc = (recorded_obs[0] if recorded_obs is not None else mo.obs_space(
        t.schema, m.obs, lambda f: box_space(f.dtype, (stack, *f.shape) if stack else f.shape)))
    if recorded_act is not None:
        action_space, inferred = recorded_act[0], False
    else:
        action_space, inferred = _action_space(m, t, rows)
    conv = _Episodes(m, obs_doc, action_space)
    data = dataset_dir / "data"
    data.mkdir(parents=True)
    writer: Any = _HDF5Writer(data, h5py) if backend == "hdf5" else _ArrowWriter(data, obs_doc, action_space)
    episodes = steps = 0
    try:
        with progress_bar(len(t), f"export minari ({backend})", progress) as bar:
            for ep in iter_episodes(iter_chunks(t, m, rows)):
                arrays = conv.frame_arrays(ep, stack) if m.frames else conv.arrays(ep)
                bar.update(len(ep))
                if arrays is None:  # a frames episode with no step yet
                    continue
                writer.write(episodes, arrays)
                episodes += 1
                steps += len(arrays["rewards"])
    except BaseException:
        writer.close()
        shutil.rmtree(dataset_dir, ignore_errors=True)
        raise
    writer.close()
    infos: dict[str, Any] = {e.key: ({"from": e.name, "encoding": "dense"} if e.kind == "dense" else
                                     {"from": e.name, "encoding": "bool mask", "width": e.width})
                             for e in m.extras if m.frames or e.name not in conv.info_names}
    for ic in conv.info if not m.frames else ():
        infos[ic.key] = {"from": ic.value, "valid": ic.valid, "reset": ic.reset, "encoding": "info",
                         "absent": f"zero, with _{ic.key} false (written where some row lacks the key)"}
    if conv.next_obs_kept:
        infos["next_obs"] = {"from": m.next_obs, "encoding": "dense"}
    size = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    metadata: dict[str, Any] = {
        "dataset_id": dataset_id,
        "minari_version": MINARI_VERSION,
        "data_format": backend,
        "jpeg_encoding": False,
        "observation_space": recorded_obs[1] if recorded_obs is not None else json.dumps(obs_doc),
        "action_space": recorded_act[1] if recorded_act is not None else json.dumps(action_space),
        "total_episodes": episodes,
        "total_steps": steps,
        "dataset_size": round(size / 1e6, 1),
        "description": f"Exported by replaystore from {store.url} (table {t.name!r}, schema {t.schema.name!r})",
        "replaystore": {
            "source": store.url, "table": t.name, "schema": t.schema.to_dict(),
            "observations": [m.obs, m.next_obs], "actions": m.action, "rewards": m.reward,
            "terminations": m.terminated or f"{m.dones} & ~{m.can_bootstrap}",
            "truncations": (m.truncated or (f"{m.dones} & {m.can_bootstrap}" if m.dones else None)),
            "infos": infos, "infos_last_row": "padding (zeros)", "actions_inferred": inferred,
        },
    }
    if m.frames:
        metadata["replaystore"].update({
            "layout": "frames", "stack": stack, "observations": [m.obs], "infos_last_row": "the final frame's record",
            "truncations": f"{m.truncated} | cut (episode metadata replaystore_cut)"})
    for key in ("env_spec", "eval_env_spec"):  # what recover_environment() makes the environment from
        if isinstance(t.schema.metadata.get(key), str):
            metadata[key] = t.schema.metadata[key]
    (data / "metadata.json").write_text(json.dumps(metadata))
    _mark_namespaces(root, dataset_id)
    files = sum(1 for p in data.rglob("*") if p.is_file())
    return {"format": f"minari-{backend}" if backend == "hdf5" else "minari", "path": str(dataset_dir),
            "dataset_id": dataset_id, "files": files, "records": steps, "episodes": episodes,
            "streams": len(t.streams())}


# -- import ------------------------------------------------------------------------------------------


def resolve_data_dir(src: str, dataset_id: str | None) -> Path:
    """The ``data`` directory of a Minari dataset given as a path or an id (see import_store).

    Parameters
    ----------
    src : str
        A dataset directory, its ``data`` directory, or a dataset id looked up
        under ``$MINARI_DATASETS_PATH`` (default ``~/.minari/datasets``); with
        ``dataset_id``, a datasets root.
    dataset_id : str, optional
        The dataset id, looked up under ``src``.

    Returns
    -------
    pathlib.Path
        The directory holding ``metadata.json``.

    Raises
    ------
    StoreError
        No ``metadata.json`` in any of the candidate directories, or a ``dataset_id``
        that breaks Minari's id rule (``(namespace/)name-v<version>``; no ``.``, so
        never a path out of ``src``).
    """
    src = src.removeprefix("file://")
    if dataset_id is not None:
        _check_id(dataset_id)  # an id, never a path: it cannot leave src
        candidates = [Path(src) / dataset_id / "data"]
    else:
        p = Path(src)
        root = Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")
        candidates = [p, p / "data"]
        if DATASET_ID_RE.fullmatch(src):  # looked up under the datasets root only when it is an id
            candidates.append(root / src / "data")
    for c in candidates:
        if (c / "metadata.json").is_file():
            return c
    raise StoreError(f"{src}: no Minari dataset there (looked for metadata.json in "
                     f"{', '.join(str(c) for c in candidates)})")


def _column(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _decode(space: dict[str, Any], col: pa.Array, column: str = "observations") -> np.ndarray:
    """A leaf column of Minari's Arrow layout as an array of its space's dtype and shape, checked first."""
    dtype, shape = mo.leaf_layout(space)
    if space["type"] == "Discrete":
        if not (pa.types.is_integer(col.type) and col.type.to_pandas_dtype() == dtype):
            raise ImportSourceError(column, f"{dtype} (a Discrete space)", str(col.type))
        return col.to_numpy(zero_copy_only=False)
    width = int(np.prod(shape, dtype=np.int64))
    want = pa.list_(pa.from_numpy_dtype(dtype), width)
    if not (pa.types.is_fixed_size_list(col.type) and col.type.list_size == width
            and col.type.value_type == want.value_type):
        raise ImportSourceError(column, f"{want} (a {space['type']} space of shape {shape})", str(col.type))
    values = col.flatten().to_numpy(zero_copy_only=False)
    return values.reshape(len(col), *shape)


def _nested(key: str) -> bool:
    """Warn that nested info ``key`` is left out; False (a filter)."""
    warnings.warn(f"Minari import: infos[{key!r}] is a nested dict; only flat info keys are imported", stacklevel=5)
    return False


def _arrow_infos(col: pa.Array) -> dict[str, np.ndarray]:
    """Flat info keys of Minari's ``infos`` struct column (as ``minari`` decodes them)."""
    out = {}
    for i, f in enumerate(col.type):
        if pa.types.is_struct(f.type):
            _nested(f.name)
            continue
        values = col.field(i)
        if pa.types.is_fixed_size_list(f.type):
            arr = values.flatten().to_numpy(zero_copy_only=False).reshape(len(values), -1)
        else:
            arr = values.to_numpy(zero_copy_only=False)
        if f.metadata is not None and b"shape" in f.metadata:
            shape = tuple(int(d) for d in f.metadata[b"shape"].split(b",") if d)
            arr = arr.reshape(len(arr), *shape)
        out[f.name] = arr
    return out


MAIN_COLUMNS = ("observations", "actions", "rewards", "terminations", "truncations")


def _json_file(path: Path, what: str) -> dict[str, Any]:
    """A JSON object file of the dataset, or an ImportSourceError naming it."""
    with SourceErrors(path, f"a readable {what}"):
        raw = path.read_bytes()
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImportSourceError(str(path), f"a JSON {what}", f"invalid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ImportSourceError(str(path), f"a JSON object ({what})", type(doc).__name__)
    return doc


class _ArrowReader:
    def __init__(self, data: Path, fmt: str, obs: dict[str, Any], act: dict[str, Any]) -> None:
        self.data, self.fmt, self.obs, self.act = data, fmt, obs, act

    def count(self) -> int:
        with SourceErrors(self.data, "a readable dataset directory"):
            return sum(1 for p in self.data.iterdir() if p.name.isdigit() and p.is_dir())

    def _dataset(self, i: int) -> Any:
        import pyarrow.dataset as ds

        folder = self.data / str(i)
        if not folder.is_dir():
            raise ImportSourceError(str(folder), f"episode {i}'s directory", "none")
        with SourceErrors(folder, f"readable {self.fmt} files"):
            dataset = ds.dataset(str(folder), format=self.fmt, ignore_prefixes=["_", ".", "metadata.json"])
            names = dataset.schema.names
        for column in MAIN_COLUMNS:
            if column not in names:
                raise ImportSourceError(column, "a column", "none", str(folder))
        return dataset

    def check(self, total: int) -> None:
        for i in range(total):  # each episode's file schemas (footers only)
            self._dataset(i)

    def meta(self, i: int) -> dict[str, Any]:
        p = self.data / str(i) / "metadata.json"
        return _json_file(p, "episode metadata") if p.is_file() else {}

    def episode(self, i: int) -> dict[str, np.ndarray]:
        dataset = self._dataset(i)
        with SourceErrors(self.data / str(i), f"readable {self.fmt} files"):
            table = dataset.to_table()
        where = str(self.data / str(i))
        return {
            "observations": mo.decode_arrow(self.obs, _column(table, "observations"), _decode),
            "actions": _decode(self.act, _column(table, "actions"), "actions")[:-1],
            "rewards": _numbers(table, "rewards", where)[:-1],
            "terminations": flags("terminations", _numbers(table, "terminations", where), where)[:-1],
            "truncations": flags("truncations", _numbers(table, "truncations", where), where)[:-1],
            "infos": _arrow_infos(_column(table, "infos")) if "infos" in table.column_names else {},
        }

    def close(self) -> None:
        pass


def _numbers(table: pa.Table, name: str, where: str) -> np.ndarray:
    col = _column(table, name)
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type)):
        raise ImportSourceError(name, "bool, integer or float values", str(col.type), where)
    return col.to_numpy(zero_copy_only=False)


class _HDF5Reader:
    def __init__(self, data: Path, h5py: Any) -> None:
        self.h5py = h5py
        self.path = data / HDF5_FILE
        if not self.path.is_file():
            raise ImportSourceError(str(self.path), "the dataset's HDF5 file", "none")
        try:
            self.file = h5py.File(self.path, "r")
        except OSError as exc:
            raise ImportSourceError(str(self.path), "an HDF5 file", f"unreadable ({exc})") from None

    def count(self) -> int:
        with SourceErrors(self.path, "a readable HDF5 file"):
            return sum(1 for k in self.file.keys() if k.startswith("episode_") and k[8:].isdigit())

    def _group(self, i: int) -> Any:
        name = f"episode_{i}"
        with SourceErrors(self.path, "a readable HDF5 file"):
            g = self.file.get(name)
        if not isinstance(g, self.h5py.Group):
            raise ImportSourceError(name, f"episode {i}'s group", "none" if g is None else type(g).__name__,
                                    str(self.path))
        return g

    def _tree(self, g: Any, name: str) -> Any:
        """The datasets under ``g[name]`` (a group for Dict/Tuple), each checked to hold its data."""
        with SourceErrors(self.path, "a readable HDF5 file"):
            obj = g.get(name)
        if isinstance(obj, self.h5py.Group):
            return {k: self._tree(obj, k) for k in obj.keys()}
        return h5_dataset(g, name, f"{self.path} {g.name}")

    def check(self, total: int) -> None:
        for i in range(total):  # each episode's datasets: present, and holding the data they declare
            g = self._group(i)
            for k in MAIN_COLUMNS:
                self._tree(g, k)

    def meta(self, i: int) -> dict[str, Any]:
        with SourceErrors(self.path, "a readable HDF5 file"):
            return {k: v.item() if isinstance(v, np.generic) else v for k, v in self._group(i).attrs.items()}

    def episode(self, i: int) -> dict[str, np.ndarray]:
        g = self._group(i)
        where = f"{self.path} {g.name}"
        with SourceErrors(self.path, "a readable HDF5 file"):
            ep = {k: _read_tree(self._tree(g, k)) for k in MAIN_COLUMNS}
            ep["infos"] = {}
            for k, v in (g["infos"].items() if "infos" in g else ()):
                if hasattr(v, "keys"):  # a group: a nested info dict
                    _nested(k)
                else:
                    ep["infos"][k] = h5_dataset(g["infos"], k, where)[()]
        numeric_kind("rewards", ep["rewards"].dtype, where)
        ep["terminations"] = flags("terminations", ep["terminations"], where)
        ep["truncations"] = flags("truncations", ep["truncations"], where)
        return ep

    def close(self) -> None:
        self.file.close()


def _read_tree(tree: Any) -> Any:
    """The arrays of a tree of datasets (``_index_<i>`` keys: a tuple, as Minari writes Tuple spaces)."""
    if not isinstance(tree, dict):
        return tree[()]
    keys = list(tree)
    if keys and all(k.startswith("_index_") and k[7:].isdigit() for k in keys):
        return tuple(_read_tree(tree.get(f"_index_{i}", {})) for i in range(len(keys)))
    return {k: _read_tree(v) for k, v in tree.items()}


def _stream_plan(metas: list[dict[str, Any]], lengths: list[int]) -> list[tuple[Any, int]]:
    """``(stream, first step)`` per episode.

    The keys replaystore wrote, when every episode has them and they are consistent (increasing,
    non-overlapping steps per stream), else one stream per episode.
    """
    plan: list[tuple[Any, int]] = []
    last: dict[Any, int] = {}
    for meta, n in zip(metas, lengths, strict=True):
        key, first = meta.get("replaystore_stream"), meta.get("replaystore_first_step")
        if not (isinstance(key, (int, str)) and not isinstance(key, bool) and isinstance(first, int)
                and first >= 0 and first > last.get(key, -1)):
            return [(i, 0) for i in range(len(metas))]
        plan.append((key, first))
        last[key] = first + n - 1
    return plan


def import_minari(src: str, url: str, *, dataset_id: str | None = None, progress: bool = False,
                  storage_options: Any = None) -> Store:
    """Create an ``episode``-schema store at ``url`` from a Minari dataset (Arrow, Parquet or HDF5).

    Each episode becomes steps of a stream (episodes a replaystore export wrote
    go back to their streams and steps); read an episode at a time, committed
    every 64 MiB of appended data. A dataset exported from a ``frames`` store
    (metadata ``replaystore.layout`` = ``"frames"``) becomes a frames store of
    the source's schema again: each episode's T + 1 records (the last frame of
    each stack when the export stacked them), the cut flag undone.

    Parameters
    ----------
    src : str
        A dataset directory or a datasets root (see :func:`resolve_data_dir`).
    url : str
        Where to create the store (it must not exist yet).
    dataset_id : str, optional
        The dataset id, when ``src`` is a datasets root.
    progress : bool, optional
        Show a progress bar on stderr (when it is a terminal).
    storage_options : mapping, optional
        Passed to the storage backend of ``url``.

    Returns
    -------
    Store
        The new store, opened and refreshed.

    Raises
    ------
    StoreError
        No dataset found, spaces that are missing or not Box/Discrete,
        JPEG-encoded image observations, an unknown data format, or h5py
        missing for an HDF5 dataset.
    StoreExistsError
        A store already exists at ``url``.
    """
    src = expand_local(src)
    url = expand_local(url)
    data = resolve_data_dir(src, dataset_id)
    meta = _json_file(data / "metadata.json", "dataset metadata")
    fmt = meta.get("data_format", "hdf5")
    if "observation_space" not in meta or "action_space" not in meta:
        raise StoreError(f"{data}: metadata.json has no observation_space/action_space (env_spec-only "
                         f"datasets need the environment installed; not supported)")
    obs = _parse_space(meta["observation_space"], "observation space", nested=True)
    act = _parse_space(meta["action_space"], "action space")
    try:
        jpeg = any(_is_image(leaf) for leaf in mo.leaf_spaces(obs))
    except (KeyError, TypeError, ValueError):
        raise ImportSourceError("observation_space", "a space document", "a malformed Box", str(data)) from None
    if bool(meta.get("jpeg_encoding", True)) and jpeg:
        raise StoreError(f"{data}: JPEG-encoded image observations are not supported; "
                         f"create the dataset with jpeg_encoding=False")
    total = meta.get("total_episodes", 0)
    if not isinstance(total, int) or isinstance(total, bool) or total < 0:
        raise ImportSourceError("total_episodes", "a count of episodes", repr(total)[:80], str(data / "metadata.json"))
    frames = _frames_source(meta, data)
    if fmt in ("arrow", "parquet"):
        reader: Any = _ArrowReader(data, fmt, obs, act)
    elif fmt == "hdf5":
        reader = _HDF5Reader(data, require_h5py())
    else:
        raise StoreError(f"{data}: unknown Minari data_format {fmt!r}")
    with ImportDestination(url, storage_options) as dest:
        try:
            present = reader.count()
            if total > present:
                raise ImportSourceError("total_episodes", f"at most {present} (the episodes the dataset holds)",
                                        total, str(data / "metadata.json"))
            reader.check(total)  # every episode's files and columns, before the store is created
            metas = [reader.meta(i) for i in range(total)]
            lengths = [mt.get("total_steps", -1) for mt in metas]
            lengths = [n if isinstance(n, int) and not isinstance(n, bool) else -1 for n in lengths]
            plan = _stream_plan(metas, lengths) if all(n >= 0 for n in lengths) else [(i, 0) for i in range(total)]
            schema: Schema | None = None
            st: Store | None = None
            with progress_bar(total, "import minari", progress, unit="ep") as bar:
                pending = 0
                w = None
                for i, (stream, first) in enumerate(plan):
                    ep = reader.episode(i)
                    if schema is None:
                        schema = frames[0] if frames is not None else _schema_for(meta, obs, act, ep)
                        # the first episode, checked before the store exists
                        _records(schema, ep, i, obs, act, frames, reader.meta(i))
                        st = dest.opened(open_store(url, schema, mode="w", storage_options=storage_options))
                        w = st.writer()
                    assert w is not None
                    batch = _records(schema, ep, i, obs, act, frames, metas[i])
                    n = len(batch["reward"])
                    reset = np.zeros(n, dtype=bool)
                    reset[:1] = True
                    w.append(batch, stream=stream, step=np.arange(first, first + n, dtype=np.int64), reset=reset)
                    pending += sum(mo.tree_nbytes(a) for a in batch.values())
                    if pending >= COMMIT_BYTES:
                        w.commit()
                        pending = 0
                    bar.update(1)
                if w is not None:
                    w.close()
        finally:
            reader.close()
        if st is None:  # no episodes: an empty store of the spaces' shapes (of the source's schema for frames)
            st = dest.opened(open_store(url, frames[0] if frames is not None else _schema_for(meta, obs, act, None),
                                        mode="w", storage_options=storage_options))
        st.refresh()
    return st


def _frames_source(meta: dict[str, Any], data: Path) -> tuple[Schema, int | None] | None:
    """The source schema and stack size of a frames-store export (``replaystore.layout`` = frames), else None.

    The schema keeps its dense fields (ragged ones, exported as masks, are left out with a warning).
    """
    ours = meta.get("replaystore")
    if not isinstance(ours, dict) or ours.get("layout") != "frames":
        return None
    where = str(data / "metadata.json")
    stack = ours.get("stack")
    if stack is not None and (not isinstance(stack, int) or isinstance(stack, bool) or stack < 1):
        raise ImportSourceError("replaystore.stack", "null or a positive int", repr(stack)[:80], where)
    try:
        source = Schema.from_dict(ours.get("schema"))  # type: ignore[arg-type]
    except (SchemaError, TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ImportSourceError("replaystore.schema", "the source frames schema", f"unusable ({exc})",
                                where) from None
    missing = [n for n in (FRAME_FIELD, "action", "reward", "terminated", "truncated") if n not in source]
    if missing:
        raise ImportSourceError("replaystore.schema", "a frames schema (frame, action, reward, terminated, "
                                "truncated)", f"one without {', '.join(missing)}", where)
    dropped = [f.name for f in source.fields if not isinstance(f, Dense)]
    if dropped:
        warnings.warn(f"Minari import: ragged field(s) {dropped} of the frames store left out (exported as masks)",
                      stacklevel=4)
        source = Schema(source.name, [f for f in source.fields if isinstance(f, Dense)], version=source.version,
                        metadata=dict(source.metadata))
    return source, stack


def _frame_batch(schema: Schema, ep: dict[str, Any], i: int, stack: int | None,
                 meta: dict[str, Any]) -> dict[str, np.ndarray]:
    """One exported frames episode back as its T + 1 records (see ``frame_records``)."""
    obs = np.asarray(ep["observations"])
    frame = schema.field(FRAME_FIELD)
    assert isinstance(frame, Dense)
    want = frame.shape if stack is None else (stack, *frame.shape)
    if obs.shape[1:] != want:
        raise ImportSourceError(f"episode {i} observations", f"per-step shape {want}", f"shape {obs.shape[1:]}")
    frames = obs if stack is None else obs[:, -1]
    batch = frame_records(frames, np.asarray(ep["actions"]), np.asarray(ep["rewards"]), ep["terminations"],
                          ep["truncations"], meta.get("replaystore_cut") is True)
    out = {name: mo.typed(schema, name, value) for name, value in batch.items()}
    infos: dict[str, np.ndarray] = ep.get("infos") or {}
    n = len(frames)
    for f in schema.fields:
        if f.name in out:
            continue
        value = infos.get(f.name)
        if value is None or np.shape(value)[:1] != (n,):
            got = "absent" if value is None else f"shape {np.shape(value)}"
            raise ImportSourceError(f"episode {i} infos[{f.name!r}]", f"{n} rows (one per frame)", got)
        out[f.name] = mo.typed(schema, f.name, value)
    return out


def _schema_for(meta: dict[str, Any], obs: dict[str, Any], act: dict[str, Any],
                ep: dict[str, np.ndarray] | None) -> Schema:
    obs_shape: tuple[int, ...]
    obs_dtype: Any
    if obs["type"] in mo.NESTED_TYPES:
        obs_shape, obs_dtype = (), np.float32  # replaced by nested fields below
    else:
        obs_dtype, obs_shape = mo.leaf_layout(obs)
    count = None
    action_dtype, action_shape = mo.leaf_layout(act)
    if act["type"] == "Discrete":
        count = int(act["n"]) if int(act.get("start", 0)) == 0 else None
    reward_dtype = ep["rewards"].dtype if ep is not None and ep["rewards"].dtype.kind in "fiu" else np.float64
    extra: dict[str, Any] = {"minari_dataset_id": meta.get("dataset_id"), "source": "minari"}
    for key in ("observation_space", "action_space", "env_spec", "eval_env_spec"):
        text = meta.get(key)
        if isinstance(text, str):
            extra[key] = text
        elif isinstance(text, dict):
            extra[key] = json.dumps(text)
    if "env_spec" in extra:
        try:
            extra["env_id"] = json.loads(extra["env_spec"])["id"]
        except (ValueError, KeyError, TypeError):
            pass
    source_schema = (meta.get("replaystore") or {}).get("schema") or {}
    for key in ("env_id", "observation", "action_frame"):
        if key in (source_schema.get("metadata") or {}):
            extra[key] = source_schema["metadata"][key]
    base = episode_schema(obs_shape, action_shape, action_dtype, obs_dtype=obs_dtype, reward_dtype=reward_dtype,
                          actions=count, metadata=extra)
    fields: list[Any] = list(base.fields)
    if obs["type"] in mo.NESTED_TYPES:  # one column per leaf: obs__image, next_obs__image, ...
        tree = mo.structure(obs)
        fields = [nested(f.name, tree) if f.name in ("obs", "next_obs") else f for f in fields]
    for key, (dtype, shape) in _info_layout(ep, meta).items():
        name = INFO_PREFIX + key
        fields += [Dense(name, dtype, shape, finite=False, description=f"info[{key!r}] of the step"),
                   Dense(name + VALID_SUFFIX, np.dtype(np.bool_), description=f"whether the step's info had {key!r}")]
        if _reset_known(ep, key):  # (an export of a recorded store has no reset infos)
            fields.append(Dense(name + RESET_SUFFIX, dtype, shape, finite=False,
                                description=f"info[{key!r}] at the reset, on an episode's first record"))
    return Schema(base.name, fields, version=base.version, metadata=dict(base.metadata))


def _info_layout(ep: dict[str, Any] | None, meta: dict[str, Any]) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """The info keys an episode's infos are imported as: key -> (dtype, per-step shape).

    ``_<key>`` bool arrays beside ``<key>`` are presence masks (folded into the valid columns); keys
    that are not identifiers or not numeric/bool arrays are left out with a warning. Of a dataset
    replaystore exported, only recorded info keys are (its other infos are per-step fields, row T padding).
    """
    out: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
    infos = ep["infos"] if ep is not None else {}
    ours = meta.get("replaystore")
    recorded = None
    if isinstance(ours, dict) and isinstance(ours.get("infos"), dict):
        recorded = {k for k, v in ours["infos"].items() if isinstance(v, dict) and v.get("encoding") == "info"}
    for key, value in infos.items():
        if key.startswith("_") and key[1:] in infos and value.dtype == np.bool_:
            continue
        if recorded is not None and key not in recorded:
            continue
        if not (INFO_PREFIX + key + RESET_SUFFIX).isidentifier() or value.dtype.kind not in "biuf":
            warnings.warn(f"Minari import: infos[{key!r}] left out (need an identifier key and numeric or "
                          f"bool values, got {value.dtype})", stacklevel=4)
            continue
        out[key] = (value.dtype, tuple(value.shape[1:]))
    return out


def _reset_known(ep: dict[str, Any] | None, key: str) -> bool:
    """Whether the first episode's reset info had ``key`` (no ``_<key>`` mask, or the mask's row 0 is true)."""
    mask = (ep or {}).get("infos", {}).get("_" + key)
    return mask is None or bool(np.asarray(mask)[:1].all())


def _records(schema: Schema, ep: dict[str, Any], i: int, obs_space: dict[str, Any] | None = None,
             act_space: dict[str, Any] | None = None, frames: tuple[Schema, int | None] | None = None,
             meta: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    obs = ep["observations"]
    for name in ("rewards", "terminations", "truncations", "actions"):
        if np.ndim(ep[name]) < 1:
            raise ImportSourceError(name, f"one row per step of episode {i}", f"shape {np.shape(ep[name])}")
    n = len(ep["rewards"])
    leaves = mo.leaves_of(obs)
    if any(np.ndim(a) < 1 for a in leaves):
        raise ImportSourceError("observations", f"one row per observation of episode {i}", "a scalar")
    n_obs = {len(a) for a in leaves}
    if n_obs != {n + 1} or len(ep["actions"]) != n or {len(ep["terminations"]), len(ep["truncations"])} != {n}:
        raise ImportSourceError(f"episode {i}", f"T + 1 observations and T actions, terminations and "
                                f"truncations for T = {n} rewards",
                                f"{sorted(n_obs)} observations, {len(ep['actions'])} actions, "
                                f"{len(ep['terminations'])} terminations, {len(ep['truncations'])} truncations")
    if obs_space is not None and act_space is not None:
        mo.check_in_space(obs_space, obs, "obs", "observation", f"in episode {i}")
        mo.check_in_space(act_space, np.asarray(ep["actions"]), "action", "action", f"in episode {i}")
    if frames is not None:
        return _frame_batch(schema, ep, i, frames[1], meta or {})

    def typed(name: str, value: Any) -> Any:
        return mo.typed(schema, name, value)

    out = {
        "obs": typed("obs", mo.tree_map(lambda a: a[:-1], obs)),
        "action": typed("action", ep["actions"]),
        "reward": typed("reward", ep["rewards"]),
        "next_obs": typed("next_obs", mo.tree_map(lambda a: a[1:], obs)),
        "terminated": typed("terminated", ep["terminations"]),
        "truncated": typed("truncated", ep["truncations"]),
    }
    infos: dict[str, np.ndarray] = ep.get("infos") or {}
    for ic in info_columns(schema):
        value = infos.get(ic.key)
        f = schema.field(ic.value)
        assert isinstance(f, Dense)
        if value is None or value.shape != (n + 1, *f.shape) or not np.can_cast(value.dtype, f.dtype, "safe"):
            got = "absent" if value is None else f"{value.dtype} {value.shape}"
            raise StoreError(f"Minari episode {i}: infos[{ic.key!r}] is {got}; expected {f.dtype} "
                             f"{(n + 1, *f.shape)} as in the first episode")
        present = infos.get("_" + ic.key)
        present = np.ones(n + 1, bool) if present is None else np.asarray(present, dtype=bool)
        value = np.ascontiguousarray(value, dtype=f.dtype)
        reset = np.zeros((n, *f.shape), f.dtype)
        reset[:1] = value[:1]
        out[ic.value], out[ic.valid] = value[1:], present[1:]
        if ic.reset:
            out[ic.reset] = reset
    return out
