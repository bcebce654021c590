"""D4RL-style HDF5: one row per step, in stream order and step order inside each stream.

Datasets (N rows each): ``observations``, ``actions``, ``rewards``, ``terminals``,
``timeouts``, ``next_observations``; ``infos/<field>`` for every other per-record field
(ragged id lists as boolean masks of width ``actions``), and ``infos/stream``,
``infos/step``, ``infos/reset`` (the stream index, so import can rebuild streams).
Root attributes ``replaystore.*`` carry the source schema and the mapping.

``terminals`` marks the steps whose TD target does not bootstrap at an episode end
(``terminated``; dqn: ``dones & ~can_bootstrap``); ``timeouts`` marks every other episode
end: truncation (dqn: ``dones & can_bootstrap``) and the last step of an episode cut by
a reset, a step gap or the end of its stream. So D4RL's ``qlearning_dataset`` — which
takes ``observations[i + 1]`` as the next observation and skips timeout steps — never
pairs steps of two episodes or two streams. See docs/EXPORT.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import ImportSourceError, SchemaError, StoreError
from replaystore.schemas import Dense, Schema
from replaystore.schemas import episode as episode_schema
from replaystore.schemas import transitions as transitions_schema
from replaystore.store import Store, open_store
from replaystore.tools.formats import minari_obs as mo
from replaystore.tools.formats.common import (
    FRAME_FIELD,
    ImportDestination,
    StepMapping,
    check_stack,
    chunk_rows,
    expand_local,
    flags,
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
    stream_index,
)

FORMAT = "replaystore.d4rl/1"
COMMIT_BYTES = 64 << 20


def _source_attrs(f: Any, url: str, table: str, schema: Schema, keys: list[Any], int_keys: bool) -> None:
    """The root attributes naming the source store, table, schema and stream key type of an export."""
    f.attrs["replaystore.format"] = FORMAT
    f.attrs["replaystore.source"] = url
    f.attrs["replaystore.table"] = table
    f.attrs["replaystore.schema"] = schema.to_json()
    f.attrs["replaystore.stream_type"] = "int" if int_keys else ("str" if not any(
        isinstance(k, int) for k in keys) else "mixed")
    f.attrs["replaystore.int_streams"] = json.dumps([k for k in keys if isinstance(k, int)] if not int_keys else [])


def _local(path: str) -> Path:
    if "://" in path and not path.startswith("file://"):
        raise StoreError(f"{path}: D4RL HDF5 files are written to and read from a local path")
    return Path(path.removeprefix("file://"))


def export_d4rl(store: Store, out: str, *, table: str | None = None, progress: bool = False,
                batch_rows: int | None = None, stack: int | None = None) -> dict[str, Any]:
    """Write one table as a D4RL-style HDF5 file at ``out``.

    Datasets ``observations``, ``next_observations``, ``actions``, ``rewards``,
    ``terminals``, ``timeouts``, the extras under ``infos/`` and the stream
    index under ``infos/stream``, ``infos/step`` and ``infos/reset``
    (docs/EXPORT.md). Reads each stream in step order a chunk (about 16 MiB of
    records) at a time, so memory stays at a few chunks. A failed export removes
    the file.

    Parameters
    ----------
    store : Store
        The opened store.
    out : str
        A local path (or ``file://`` URL) of a file that does not exist yet.
    table : str, optional
        The table to export; required when the store has several.
    progress : bool, optional
        Show a progress bar on stderr (when it is a terminal).
    batch_rows : int, optional
        Records per read (default: about 16 MiB worth).
    stack : int, optional
        Frames stores only: ``observations`` and ``next_observations`` are
        stacks of the ``stack`` latest frames of the episode (reset-padded, as
        gymnasium's ``FrameStackObservation``); default one frame each.

    Returns
    -------
    dict of str to Any
        ``format``, ``path``, ``files``, ``records`` (rows written: steps),
        ``episodes`` and ``streams``.

    Raises
    ------
    StoreError
        h5py is not installed, ``out`` is not local or already exists, the
        store has several tables and none was chosen, the schema has no step
        fields (obs, next_obs, action(s), reward(s), terminated or dones) or a
        field clashes with the stream index, a ragged id lies outside its mask,
        ``batch_rows`` is not a positive int, ``stack`` is not a positive int
        or is given for a store that is not a frames store, or the table
        changed during the export.

    Notes
    -----
    A ``frames`` store (``replaystore.schemas.frames``) exports one row per
    step, not per record: an episode of T + 1 records gives T rows, row t with
    ``observations`` = frame t and ``next_observations`` = frame t + 1 (the last
    step's: the final frame), the extras of record t, and ``infos/cut`` (the
    episode stopped here without a flag; ``timeouts`` is set for it). Root
    attributes ``replaystore.layout`` = ``"frames"`` and ``replaystore.stack``.
    """
    out = expand_local(out)
    h5py = require_h5py()
    t = pick_table(store, table)
    m = step_mapping(t.schema, "D4RL")
    stack = check_stack(stack, m, "D4RL")
    if m.frames:
        return _export_frames(store, t, m, out, h5py, progress, batch_rows, stack)
    path = _local(out)
    if path.exists():
        raise StoreError(f"{path}: already exists; export into a new file")
    path.parent.mkdir(parents=True, exist_ok=True)
    t.view()  # the records as of now: what follows reads this view
    n = len(t)
    keys = t.streams()
    int_keys = all(isinstance(k, int) for k in keys)
    schema = t.schema

    def spec(name: str) -> tuple[tuple[int, ...], np.dtype]:
        f = schema.field(name)
        assert isinstance(f, Dense)
        return f.shape, f.dtype

    layout: dict[str, tuple[tuple[int, ...], Any, str | None]] = {
        "observations": (*spec(m.obs), m.obs),
        "next_observations": (*spec(m.next_obs), m.next_obs),
        "actions": (*spec(m.action), m.action),
        "rewards": (*spec(m.reward), m.reward),
        "terminals": ((), np.dtype(bool), None),
        "timeouts": ((), np.dtype(bool), None),
    }
    for e in m.extras:
        if e.kind == "mask":
            assert e.width is not None  # step_mapping gives every mask its width
            layout[f"infos/{e.key}"] = ((e.width,), np.dtype(bool), e.key)
        else:
            layout[f"infos/{e.key}"] = (*spec(e.name), e.key)
    layout["infos/stream"] = ((), np.dtype(np.int64) if int_keys else h5py.string_dtype(), None)
    layout["infos/step"] = ((), np.dtype(np.int64), None)
    layout["infos/reset"] = ((), np.dtype(bool), None)
    rows = chunk_rows(schema, batch_rows)
    try:
        with h5py.File(path, "w") as f, progress_bar(n, "export d4rl", progress) as bar:
            ds = {name: f.create_dataset(name, shape=(n, *shape), dtype=dtype, chunks=_chunks(n, shape, dtype))
                  for name, (shape, dtype, _) in layout.items()}
            _source_attrs(f, store.url, t.name, schema, keys, int_keys)
            f.attrs["replaystore.mapping"] = json.dumps(_mapping_doc(m))
            pos = 0
            for c in iter_chunks(t, m, rows):
                hi = pos + len(c)
                for name, (_, _, source) in layout.items():
                    if source is not None:
                        ds[name][pos:hi] = c.data[source]
                ds["terminals"][pos:hi] = c.term
                ds["timeouts"][pos:hi] = c.trunc
                ds["infos/stream"][pos:hi] = (np.full(len(c), c.stream, dtype=np.int64) if int_keys
                                              else np.array([str(c.stream)] * len(c), dtype=object))
                ds["infos/step"][pos:hi] = c.steps
                ds["infos/reset"][pos:hi] = c.resets
                pos = hi
                bar.update(len(c))
            if pos != n:
                raise StoreError(f"table {t.name!r} changed during export ({pos} records read, {n} expected)")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return {"format": "d4rl", "path": str(path), "files": 1, "records": n,
            "episodes": _episodes(path, h5py), "streams": len(keys)}


def _export_frames(store: Store, t: Any, m: StepMapping, out: str, h5py: Any, progress: bool,
                   batch_rows: int | None, stack: int | None) -> dict[str, Any]:
    """The frames layout of :func:`export_d4rl`: one row per step, an episode at a time."""
    path = _local(out)
    if path.exists():
        raise StoreError(f"{path}: already exists; export into a new file")
    path.parent.mkdir(parents=True, exist_ok=True)
    t.view()
    keys = t.streams()
    int_keys = all(isinstance(k, int) for k in keys)
    schema = t.schema
    n_records = 0
    n_steps = 0
    for k in keys:  # steps = records - episodes (an episode's last record holds its final frame only)
        _, steps, resets = stream_index(t, k)
        starts = 1 + int(np.count_nonzero(resets[1:] | (np.diff(steps) != 1))) if len(steps) else 0
        n_records += len(steps)
        n_steps += len(steps) - starts

    def spec(name: str) -> tuple[tuple[int, ...], np.dtype]:
        f = schema.field(name)
        assert isinstance(f, Dense)
        return f.shape, f.dtype

    frame_shape, frame_dtype = spec(m.obs)
    obs_shape = frame_shape if stack is None else (stack, *frame_shape)
    layout: dict[str, tuple[tuple[int, ...], Any]] = {
        "observations": (obs_shape, frame_dtype),
        "next_observations": (obs_shape, frame_dtype),
        "actions": spec(m.action),
        "rewards": spec(m.reward),
        "terminals": ((), np.dtype(bool)),
        "timeouts": ((), np.dtype(bool)),
    }
    for e in m.extras:
        if e.kind == "mask":
            assert e.width is not None  # step_mapping gives every mask its width
            layout[f"infos/{e.key}"] = ((e.width,), np.dtype(bool))
        else:
            layout[f"infos/{e.key}"] = spec(e.name)
    layout["infos/stream"] = ((), np.dtype(np.int64) if int_keys else h5py.string_dtype())
    layout["infos/step"] = ((), np.dtype(np.int64))
    layout["infos/reset"] = ((), np.dtype(bool))
    layout["infos/cut"] = ((), np.dtype(bool))
    episodes = 0
    try:
        with h5py.File(path, "w") as f, progress_bar(n_records, "export d4rl", progress) as bar:
            ds = {name: f.create_dataset(name, shape=(n_steps, *shape), dtype=dtype,
                                         chunks=_chunks(n_steps, shape, dtype))
                  for name, (shape, dtype) in layout.items()}
            _source_attrs(f, store.url, t.name, schema, keys, int_keys)
            mapping = _mapping_doc(m)
            mapping.update({"observations": f"{m.obs}[t]", "next_observations": f"{m.obs}[t + 1]",
                            "timeouts": f"{m.truncated} | cut (infos/cut)"})
            f.attrs["replaystore.mapping"] = json.dumps(mapping)
            f.attrs["replaystore.layout"] = "frames"
            f.attrs["replaystore.stack"] = json.dumps(stack)
            pos = 0
            for ep in iter_episodes(iter_chunks(t, m, chunk_rows(schema, batch_rows))):
                bar.update(len(ep))
                fe = frame_steps(m, ep)
                if fe is None:
                    continue
                n = len(fe)
                hi = pos + n
                if hi > n_steps:
                    raise StoreError(f"table {t.name!r} changed during export (more steps than {n_steps})")
                obs = fe.frames if stack is None else stack_frames(fe.frames, stack)
                ds["observations"][pos:hi] = obs[:-1]
                ds["next_observations"][pos:hi] = obs[1:]
                ds["actions"][pos:hi] = fe.steps[m.action]
                ds["rewards"][pos:hi] = fe.steps[m.reward]
                ds["terminals"][pos:hi] = fe.term
                ds["timeouts"][pos:hi] = fe.trunc
                for e in m.extras:
                    ds[f"infos/{e.key}"][pos:hi] = fe.extras[e.key][:-1]
                ds["infos/stream"][pos:hi] = (np.full(n, fe.stream, dtype=np.int64) if int_keys
                                              else np.array([str(fe.stream)] * n, dtype=object))
                ds["infos/step"][pos:hi] = np.arange(fe.first_step, fe.first_step + n, dtype=np.int64)
                reset = np.zeros(n, dtype=bool)
                reset[0] = fe.reset
                ds["infos/reset"][pos:hi] = reset
                cut = np.zeros(n, dtype=bool)
                cut[-1] = fe.cut
                ds["infos/cut"][pos:hi] = cut
                pos = hi
                episodes += 1
            if pos != n_steps:
                raise StoreError(f"table {t.name!r} changed during export ({pos} steps read, {n_steps} expected)")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return {"format": "d4rl", "path": str(path), "files": 1, "records": n_steps, "episodes": episodes,
            "streams": len(keys)}


def _chunks(n: int, shape: tuple[int, ...], dtype: Any) -> tuple[int, ...] | None:
    """HDF5 chunks of about 1 MiB along the rows (whole rows per chunk)."""
    if not n:
        return None
    row = max(int(np.prod(shape, dtype=np.int64)) * max(np.dtype(dtype).itemsize, 8), 1)
    return (int(np.clip((1 << 20) // row, 1, n)), *shape)


def _episodes(path: Path, h5py: Any) -> int:
    with h5py.File(path, "r") as f:
        n = len(f["rewards"])
        count = 0
        for lo in range(0, n, 1 << 20):
            count += int(np.count_nonzero(f["terminals"][lo:lo + (1 << 20)] | f["timeouts"][lo:lo + (1 << 20)]))
        return count


def _mapping_doc(m: StepMapping) -> dict[str, Any]:
    return {
        "observations": m.obs, "next_observations": m.next_obs, "actions": m.action, "rewards": m.reward,
        "terminals": m.terminated or f"{m.dones} & ~{m.can_bootstrap}",
        "timeouts": ((m.truncated + " | " if m.truncated else "") if m.terminated
                     else f"{m.dones} & {m.can_bootstrap} | ") + "cut (reset, step gap or stream end)",
        "infos": {e.key: ({"from": e.name, "encoding": "dense"} if e.kind == "dense" else
                          {"from": e.name, "encoding": "bool mask", "width": e.width}) for e in m.extras},
    }


# -- import -------------------------------------------------------------------------------------------


def _actions_count(f: Any) -> int | None:
    doc = f.attrs.get("replaystore.schema")
    if doc is None:
        return None
    try:
        actions = json.loads(doc).get("metadata", {}).get("actions")
    except (ValueError, TypeError, AttributeError):
        return None
    return actions if isinstance(actions, int) and not isinstance(actions, bool) and actions > 0 else None


def _source(f: Any, src: str) -> dict[str, Any]:
    """The datasets of a D4RL-style file, checked before anything is created.

    Presence, dtypes, shapes, lengths, written data, and the stream-index attributes.
    """
    ds = {key: h5_dataset(f, key, src) for key in ("observations", "actions", "rewards", "terminals")}
    for key in ("next_observations", "timeouts", "infos/stream", "infos/step", "infos/reset"):
        if key in f:
            ds[key] = h5_dataset(f, key, src)
    for key in ("observations", "next_observations", "actions", "rewards", "terminals", "timeouts", "infos/step",
                "infos/reset"):
        if key in ds:
            numeric_kind(key, ds[key].dtype, src, "iu" if key == "infos/step" else "biuf")
    rew = ds["rewards"]
    if len(rew.shape) != 1:
        raise ImportSourceError("rewards", "one value per step (shape (N,))", f"shape {rew.shape}", src)
    n = rew.shape[0]
    for key, d in ds.items():
        if not d.shape or d.shape[0] != n:
            raise ImportSourceError(key, f"{n} rows (one per step, as rewards)", f"shape {d.shape}", src)
        if key in ("terminals", "timeouts", "infos/stream", "infos/step", "infos/reset") and len(d.shape) != 1:
            raise ImportSourceError(key, f"one value per step (shape ({n},))", f"shape {d.shape}", src)
    if "next_observations" in ds and (ds["next_observations"].shape, ds["next_observations"].dtype) != (
            ds["observations"].shape, ds["observations"].dtype):
        nxt, obs = ds["next_observations"], ds["observations"]
        raise ImportSourceError("next_observations", f"{obs.dtype} {obs.shape} (as observations)",
                                f"{nxt.dtype} {nxt.shape}", src)
    if "infos/stream" in ds and ds["infos/stream"].dtype.kind not in "iuO":
        raise ImportSourceError("infos/stream", "integer or string stream keys", f"{ds['infos/stream'].dtype}", src)
    return ds


def _schema(f: Any, ds: dict[str, Any]) -> Schema:
    obs, act, rew = ds["observations"], ds["actions"], ds["rewards"]
    count = _actions_count(f) if act.dtype.kind in "iu" else None
    factory = episode_schema if "timeouts" in ds else transitions_schema
    reward_dtype = rew.dtype if rew.dtype.kind == "f" else np.dtype(np.float64)
    return factory(obs.shape[1:], act.shape[1:], act.dtype, obs_dtype=obs.dtype, reward_dtype=reward_dtype,
                   actions=count, metadata={"source": "d4rl"})


def _stream_attrs(f: Any, src: str) -> tuple[str, set[int]]:
    kind = f.attrs.get("replaystore.stream_type", "int")
    if isinstance(kind, bytes):
        kind = kind.decode(errors="replace")
    if kind not in ("int", "str", "mixed"):
        raise ImportSourceError("replaystore.stream_type", "'int', 'str' or 'mixed'", repr(kind), src)
    raw = f.attrs.get("replaystore.int_streams", "[]")
    try:
        ints = json.loads(raw)
    except (ValueError, TypeError):
        ints = None
    if not isinstance(ints, list) or not all(isinstance(k, int) and not isinstance(k, bool) for k in ints):
        raise ImportSourceError("replaystore.int_streams", "a JSON list of ints", repr(raw)[:80], src)
    return kind, set(ints)


def import_d4rl(src: str, url: str, *, progress: bool = False, storage_options: Any = None,
                batch_rows: int | None = None) -> Store:
    """Create a store at ``url`` from a D4RL-style HDF5 file.

    An ``episode`` store when the file has ``timeouts``, else a ``transitions``
    store; a file exported from a ``frames`` store (``replaystore.layout`` =
    ``"frames"``) gives a frames store of the source's schema again (each
    episode's steps, then its final frame as one more record; the last frame of
    each stack when the export stacked them; the cut flag undone). A file
    written by :func:`export_d4rl` gets its streams, steps and resets back;
    without ``next_observations``, timeout steps whose successor is not in the
    file are left out, with a warning (as D4RL's
    ``qlearning_dataset`` does). The file is checked before the store is
    created (every dataset present, numeric, one row per step, its data written
    in the file); reads a chunk of rows at a time and commits every 64 MiB of
    appended data. A failed import leaves nothing at ``url``.

    Parameters
    ----------
    src : str
        A local path (or ``file://`` URL) of the HDF5 file.
    url : str
        Where to create the store (new, or an empty directory).
    progress : bool, optional
        Show a progress bar on stderr (when it is a terminal).
    storage_options : mapping, optional
        Passed to the storage backend of ``url``.
    batch_rows : int, optional
        Records per read (default: about 16 MiB worth).

    Returns
    -------
    Store
        The new store, opened and refreshed.

    Raises
    ------
    ImportSourceError
        ``src`` is not an HDF5 file (or is truncated), lacks a D4RL dataset, or a
        dataset has the wrong dtype (complex, strings), shape or length, declares
        data it does not hold, or holds flags other than 0/1 or a malformed stream
        index.
    StoreError
        h5py is not installed, ``src`` is not a local file, or ``batch_rows`` is
        not a positive int.
    StoreExistsError
        ``url`` is not new or empty.
    """
    src = expand_local(src)
    url = expand_local(url)
    h5py = require_h5py()
    path = _local(src)
    if not path.is_file():
        raise StoreError(f"{src}: no such file")
    with ImportDestination(url, storage_options) as dest:
        try:
            f = h5py.File(path, "r")
        except OSError as exc:
            raise ImportSourceError(str(src), "an HDF5 file", f"unreadable ({exc})") from None
        with f:
            ds = _source(f, src)
            kind, int_streams = _stream_attrs(f, src)
            frames = _frames_source(f, ds, src)
            if frames is not None:
                return _import_frames(f, ds, frames[0], frames[1], src, url, kind, int_streams, progress,
                                      storage_options, batch_rows, dest)
            schema = _schema(f, ds)
            st = _import_rows(f, ds, schema, src, url, kind, int_streams, progress, storage_options, batch_rows,
                              dest)
    return st


def _import_rows(f: Any, ds: dict[str, Any], schema: Schema, src: str, url: str, kind: str, int_streams: set[int],
                 progress: bool, storage_options: Any, batch_rows: int | None, dest: ImportDestination) -> Store:
    n = len(ds["rewards"])
    has_next = "next_observations" in ds
    has_timeouts = "timeouts" in ds
    indexed = all(k in ds for k in ("infos/stream", "infos/step", "infos/reset"))
    rows = chunk_rows(schema, batch_rows)

    def read(key: str, lo: int, hi: int) -> np.ndarray:
        try:
            d = ds[key]
            return np.asarray(d.asstr()[lo:hi] if d.dtype.kind == "O" else d[lo:hi])
        except (OSError, ValueError, RuntimeError, UnicodeDecodeError) as exc:
            raise ImportSourceError(key, f"readable rows {lo}..{hi}", f"an error ({exc})", src) from None

    st = dest.opened(open_store(url, schema, mode="w", storage_options=storage_options))
    dropped = 0
    with st.writer() as w, progress_bar(n, "import d4rl", progress) as bar:
        pending = 0
        prev_end = True  # the first row starts an episode
        for lo in range(0, n, rows):
            hi = min(lo + rows, n)
            obs = read("observations", lo, hi)
            term = flags("terminals", read("terminals", lo, hi), src)
            tout = flags("timeouts", read("timeouts", lo, hi), src) if has_timeouts else np.zeros(hi - lo, bool)
            keep = np.ones(hi - lo, dtype=bool)
            if has_next:
                nxt = read("next_observations", lo, hi)
            else:  # D4RL's own derivation: the next row's observation, inside an episode only
                nxt = np.concatenate([obs[1:], read("observations", hi, hi + 1)]) if hi < n else np.concatenate(
                    [obs[1:], obs[-1:]])
                nxt[term] = obs[term]  # terminal: the successor's value is never used
                keep &= ~(tout & ~term)  # a timeout step's successor is not in the file
                if hi == n and not term[-1]:
                    keep[-1] = False
            ends = term | tout
            starts = np.r_[prev_end, ends[:-1]]
            prev_end = bool(ends[-1])
            if indexed:
                raw = read("infos/stream", lo, hi)
                try:
                    streams = [_key(k, kind, int_streams) for k in raw.tolist()]
                except (ValueError, TypeError):
                    raise ImportSourceError("infos/stream", f"{kind} stream keys", f"values {raw[:3].tolist()}",
                                            src) from None
                steps = read("infos/step", lo, hi).astype(np.int64)
                resets = flags("infos/reset", read("infos/reset", lo, hi), src)
            else:
                streams = [0] * (hi - lo)
                steps = np.arange(lo, hi, dtype=np.int64)
                resets = starts
            if not keep.all():
                dropped += int(np.count_nonzero(~keep))
                streams = [s for s, k in zip(streams, keep, strict=True) if k]
                obs, nxt, term, tout, steps, resets = (a[keep] for a in (obs, nxt, term, tout, steps, resets))
            if len(steps):
                reward = read("rewards", lo, hi)[keep]
                if reward.dtype.kind != "f":  # (int or bool rewards: exact in the schema's float64)
                    reward = reward.astype(np.float64)
                batch = {"obs": obs, "action": read("actions", lo, hi)[keep], "reward": reward,
                         "next_obs": nxt, "terminated": term}
                if has_timeouts:
                    batch["truncated"] = tout
                w.append(batch, stream=streams, step=steps, reset=resets)
                pending += sum(a.nbytes for a in batch.values())
                if pending >= COMMIT_BYTES:
                    w.commit()
                    pending = 0
            bar.update(hi - lo)
    if dropped:
        import warnings

        warnings.warn(f"D4RL import: {dropped} timeout step(s) left out: the file has no next_observations "
                      f"and their successor is not in it (as D4RL's qlearning_dataset does)", stacklevel=4)
    st.refresh()
    return st


def _frames_source(f: Any, ds: dict[str, Any], src: str) -> tuple[Schema, int | None] | None:
    """The source schema and stack of a frames export (dense fields only), checked; None for other files."""
    layout = f.attrs.get("replaystore.layout")
    if isinstance(layout, bytes):
        layout = layout.decode(errors="replace")
    if layout != "frames":
        return None
    for key in ("next_observations", "timeouts", "infos/stream", "infos/step", "infos/reset", "infos/cut"):
        if key not in ds and key not in f:
            raise ImportSourceError(key, "a dataset (the file says it holds a frames export)", "none", src)
    try:
        stack = json.loads(f.attrs.get("replaystore.stack", "null"))
        schema = Schema.from_json(f.attrs["replaystore.schema"])
    except (SchemaError, ValueError, TypeError, KeyError) as exc:
        raise ImportSourceError("replaystore.schema", "the source frames schema and stack", f"unusable ({exc})",
                                src) from None
    if stack is not None and (not isinstance(stack, int) or isinstance(stack, bool) or stack < 1):
        raise ImportSourceError("replaystore.stack", "null or a positive int", repr(stack)[:80], src)
    missing = [n for n in (FRAME_FIELD, "action", "reward", "terminated", "truncated") if n not in schema]
    if missing:
        raise ImportSourceError("replaystore.schema", "a frames schema (frame, action, reward, terminated, "
                                "truncated)", f"one without {', '.join(missing)}", src)
    frame = schema.field(FRAME_FIELD)
    assert isinstance(frame, Dense)
    want = frame.shape if stack is None else (stack, *frame.shape)
    if tuple(ds["observations"].shape[1:]) != want:
        raise ImportSourceError("observations", f"per-step shape {want}", f"shape {ds['observations'].shape[1:]}",
                                src)
    dropped = [x.name for x in schema.fields if not isinstance(x, Dense)]
    if dropped:
        import warnings

        warnings.warn(f"D4RL import: ragged field(s) {dropped} of the frames store left out (exported as masks)",
                      stacklevel=4)
        schema = Schema(schema.name, [x for x in schema.fields if isinstance(x, Dense)], version=schema.version,
                        metadata=dict(schema.metadata))
    return schema, stack


def _import_frames(f: Any, ds: dict[str, Any], schema: Schema, stack: int | None, src: str, url: str, kind: str,
                   int_streams: set[int], progress: bool, storage_options: Any, batch_rows: int | None,
                   dest: ImportDestination) -> Store:
    """A frames export back as a frames store: each step's record, and after an episode's last step its final frame."""
    n = len(ds["rewards"])
    rows = chunk_rows(schema, batch_rows)
    extras = [x.name for x in schema.fields if x.name not in (FRAME_FIELD, "action", "reward", "terminated",
                                                                "truncated")]
    for name in extras:
        if f"infos/{name}" not in f:
            raise ImportSourceError(f"infos/{name}", "a dataset (a field of the source schema)", "none", src)

    def read(key: str, lo: int, hi: int) -> np.ndarray:
        try:
            d = f[key]
            return np.asarray(d.asstr()[lo:hi] if d.dtype.kind == "O" else d[lo:hi])
        except (OSError, ValueError, RuntimeError, UnicodeDecodeError) as exc:
            raise ImportSourceError(key, f"readable rows {lo}..{hi}", f"an error ({exc})", src) from None

    def last(a: np.ndarray) -> np.ndarray:
        return a if stack is None else a[:, -1]

    st = dest.opened(open_store(url, schema, mode="w", storage_options=storage_options))
    with st.writer() as w, progress_bar(n, "import d4rl", progress) as bar:
        pending = 0
        for lo in range(0, n, rows):
            hi = min(lo + rows, n)
            term = flags("terminals", read("terminals", lo, hi), src)
            tout = flags("timeouts", read("timeouts", lo, hi), src)
            cut = flags("infos/cut", read("infos/cut", lo, hi), src)
            ends = term | tout
            if hi == n:
                ends[-1] = True
            raw = read("infos/stream", lo, hi)
            try:
                streams = np.array([_key(k, kind, int_streams) for k in raw.tolist()], dtype=object)
            except (ValueError, TypeError):
                raise ImportSourceError("infos/stream", f"{kind} stream keys", f"values {raw[:3].tolist()}",
                                        src) from None
            steps = read("infos/step", lo, hi).astype(np.int64)
            resets = flags("infos/reset", read("infos/reset", lo, hi), src)
            # each step row becomes a record; after each episode's last step, one more: its final frame
            where = np.arange(hi - lo) + np.r_[0, np.cumsum(ends)[:-1]]
            finals = np.flatnonzero(ends)
            extra_at = where[finals] + 1
            total = hi - lo + len(finals)

            def spread(step_values: np.ndarray, final_values: np.ndarray, total: int = total,
                       where: np.ndarray = where, extra_at: np.ndarray = extra_at) -> np.ndarray:
                out = np.zeros((total, *step_values.shape[1:]), dtype=step_values.dtype)
                out[where] = step_values
                out[extra_at] = final_values
                return out

            obs = last(read("observations", lo, hi))
            nxt = last(read("next_observations", lo, hi))
            action, reward = read("actions", lo, hi), read("rewards", lo, hi)
            batch = {
                FRAME_FIELD: spread(obs, nxt[finals]),
                "action": spread(action, np.zeros((len(finals), *action.shape[1:]), action.dtype)),
                "reward": spread(reward, np.zeros(len(finals), reward.dtype)),
                "terminated": spread(term, np.zeros(len(finals), bool)),
                "truncated": spread(tout & ~cut, np.zeros(len(finals), bool)),
            }
            for name in extras:
                values = read(f"infos/{name}", lo, hi)
                batch[name] = spread(values, np.zeros((len(finals), *values.shape[1:]), values.dtype))
            batch = {name: mo.typed(schema, name, value) for name, value in batch.items()}
            rec_streams = spread(streams, streams[finals])
            rec_steps = spread(steps, steps[finals] + 1)
            rec_resets = spread(resets, np.zeros(len(finals), bool))
            w.append(batch, stream=rec_streams.tolist(), step=rec_steps, reset=rec_resets)
            pending += sum(a.nbytes for a in batch.values())
            if pending >= COMMIT_BYTES:
                w.commit()
                pending = 0
            bar.update(hi - lo)
    st.refresh()
    return st


def _key(raw: Any, kind: str, int_streams: set[int]) -> Any:
    if kind == "int":
        return int(raw)
    if kind == "mixed" and str(raw).lstrip("-").isdigit() and int(raw) in int_streams:
        return int(raw)
    return str(raw)
