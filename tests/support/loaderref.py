"""Small in-memory reference models for the loader tests (tests/loaders/).

Everything here is written from the specs (issue 4, ../shared/formats/), not from
``replaystore.loaders``: the probe schema whose every record carries its identity
(``tag``), a model of one writer's appends (steps, resets, commits, capacity
eviction, stable row ids), hypothesis strategies for append plans, the sequence
window rules, prioritized-replay bookkeeping, episode splitting, chi-square
helpers, a toy DQN MDP, and the child-process entry point of the resume tests.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as hs

from replaystore.schemas import Dense, Ragged, Schema, dqn

I64, F32, BOOL = np.int64, np.float32, np.bool_
ACTIONS = 7
KEYS: tuple[int | str, ...] = (0, 7, "0", "x")  # int 0 and str "0" are different streams

PROBE = Schema("probe", [
    Dense("tag", I64, description="unique per record: the reference's identity of the record"),
    Dense("obs", F32, (2,)),
    Dense("flag", BOOL),
    Dense("value", np.float64),
    Ragged("legal_ids", I64, "legal_offsets", id_bound=ACTIONS),
])


# -- the probe records ------------------------------------------------------------------------

def legal_of(tag: int) -> np.ndarray:
    """The legal ids of record ``tag``: 0..3 distinct ids (empty for tag % 4 == 0), sorted."""
    count = tag % 4
    return np.sort(np.array([(tag * 3 + 2 * j) % ACTIONS for j in range(count)], dtype=I64))


def probe_arrays(tags: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
    """The probe records of ``tags`` in ``Table.read`` layout (ragged values + offsets from 0)."""
    tags = np.asarray(tags, dtype=I64).reshape(-1)
    legal = [legal_of(int(t)) for t in tags]
    offsets = np.zeros(len(tags) + 1, dtype=I64)
    np.cumsum([len(x) for x in legal], out=offsets[1:])
    return {
        "tag": tags.copy(),
        "obs": np.stack([tags, -tags / 2], axis=1).astype(F32) if len(tags) else np.zeros((0, 2), F32),
        "flag": tags % 3 == 0,
        "value": tags * 0.25 - 1.0,
        "legal_ids": np.concatenate(legal).astype(I64) if legal else np.zeros(0, I64),
        "legal_offsets": offsets,
    }


# -- a model of one writer's appends -----------------------------------------------------------

@dataclass(frozen=True)
class Append:
    """One ``writer.append``: per-record stream keys, step gaps, and how resets are given."""

    keys: tuple[int | str, ...]
    explicit: bool  # explicit steps (last + 1 + gap per record) or auto-increment (step=None)
    gaps: tuple[int, ...]
    reset_mode: str  # "none" (reset=None), "first" (reset=True), "array" (per-record bools)
    resets: tuple[bool, ...]


@dataclass
class Plan:
    commits: list[list[Append]]
    capacity: int | None


@dataclass
class Rec:
    tag: int
    stream: int | str
    step: int
    reset: bool
    row: int = -1  # row id once committed


class RefStore:
    """Committed records under capacity eviction, appended in one process.

    Steps: auto-increment continues from the stream's last step (this writer's,
    evicted or not); explicit steps are ``last + 1 + gap``. ``reset="first"`` marks
    the first record of each stream in the append. Row ids are ``writer << 40 | n`` for
    a writer's n-th committed record; commits are ordered as ``commit`` is called. The
    newest ``capacity`` committed records are visible.
    """

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.committed: list[Rec] = []
        self.pending: list[Rec] = []
        self.last: dict[tuple[type, int | str], int] = {}
        self.next_tag = 0
        self.by_tag: dict[int, Rec] = {}
        self.by_row: dict[int, Rec] = {}
        self.local_rows: dict[int, int] = {}

    @staticmethod
    def _k(key: int | str) -> tuple[type, int | str]:
        return (type(key), key)

    def stage(self, ap: Append) -> dict[str, Any]:
        """Model ``ap``; returns the keyword arguments of the matching ``writer.append``."""
        n = len(ap.keys)
        tags = list(range(self.next_tag, self.next_tag + n))
        self.next_tag += n
        steps = []
        for key, gap in zip(ap.keys, ap.gaps, strict=True):
            s = self.last.get(self._k(key), -1) + 1 + (gap if ap.explicit else 0)
            self.last[self._k(key)] = s
            steps.append(s)
        if ap.reset_mode == "none":
            resets = [False] * n
            reset_arg: Any = None
        elif ap.reset_mode == "first":
            seen: set[tuple[type, int | str]] = set()
            resets = []
            for key in ap.keys:
                resets.append(self._k(key) not in seen)
                seen.add(self._k(key))
            reset_arg = True
        else:
            resets = list(ap.resets)
            reset_arg = np.array(resets, dtype=bool)
        for t, k, s, r in zip(tags, ap.keys, steps, resets, strict=True):
            rec = Rec(t, k, s, r)
            self.pending.append(rec)
            self.by_tag[t] = rec
        single = len({self._k(k) for k in ap.keys}) == 1
        stream_arg: Any = ap.keys[0] if single else list(ap.keys)
        if not ap.explicit:
            step_arg: Any = None
        elif single and all(g == 0 for g in ap.gaps[1:]):
            step_arg = steps[0]  # the scalar form: consecutive steps from it
        else:
            step_arg = np.array(steps, dtype=I64)
        return {"batch": probe_arrays(tags), "stream": stream_arg, "step": step_arg, "reset": reset_arg}

    def commit(self, writer: int = 0) -> None:
        """Commit the staged records through writer number ``writer`` (row ids ``writer << 40 | local``)."""
        local = self.local_rows.get(writer, 0)
        for i, rec in enumerate(self.pending):
            rec.row = (writer << 40) | (local + i)
            self.committed.append(rec)
            self.by_row[rec.row] = rec
        self.local_rows[writer] = local + len(self.pending)
        self.pending.clear()

    def visible(self) -> list[Rec]:
        if self.capacity is None:
            return list(self.committed)
        return self.committed[-self.capacity:] if self.capacity else []

    def visible_rows(self) -> np.ndarray:
        return np.array([r.row for r in self.visible()], dtype=I64)

    def rec_of_row(self, row: int) -> Rec:
        return self.by_row[row]


class Harness:
    """A real store on local disk driven together with its :class:`RefStore`."""

    def __init__(self, url: str, capacity: int | None, schema: Schema = PROBE) -> None:
        from replaystore.store import open_store
        self.store = open_store(url, schema, capacity=capacity)
        self.ref = RefStore(capacity)
        self.writer = self.store.writer()

    def append(self, ap: Append) -> None:
        kw = self.ref.stage(ap)
        self.writer.append(kw["batch"], stream=kw["stream"], step=kw["step"], reset=kw["reset"])

    def commit(self) -> None:
        self.writer.commit()
        self.ref.commit(self.writer.id)

    def run(self, plan: Plan) -> Harness:
        for appends in plan.commits:
            for ap in appends:
                self.append(ap)
            self.commit()
        return self


# -- hypothesis strategies ----------------------------------------------------------------------

@hs.composite
def appends(draw: Any, max_records: int = 6) -> Append:
    n = draw(hs.integers(1, max_records))
    if draw(hs.booleans()):
        keys = tuple(draw(hs.lists(hs.sampled_from(KEYS), min_size=n, max_size=n)))
    else:
        keys = (draw(hs.sampled_from(KEYS)),) * n
    explicit = draw(hs.booleans())
    gaps = tuple(draw(hs.lists(hs.sampled_from((0, 0, 0, 1, 3)), min_size=n, max_size=n))) if explicit \
        else (0,) * n
    reset_mode = draw(hs.sampled_from(("none", "first", "array")))
    resets = tuple(draw(hs.lists(hs.sampled_from((False, False, False, True)), min_size=n, max_size=n))) \
        if reset_mode == "array" else (False,) * n
    return Append(keys, explicit, gaps, reset_mode, resets)


@hs.composite
def plans(draw: Any, max_commits: int = 6, max_appends: int = 3, max_records: int = 6,
          capacity: bool = True) -> Plan:
    commits = [draw(hs.lists(appends(max_records), min_size=1, max_size=max_appends))
               for _ in range(draw(hs.integers(1, max_commits)))]
    cap = draw(hs.one_of(hs.none(), hs.integers(3, 40))) if capacity else None
    return Plan(commits, cap)


def plan_size(plan: Plan) -> int:
    return sum(len(ap.keys) for c in plan.commits for ap in c)


# -- sequence windows, per the contract ---------------------------------------------------------

@dataclass(frozen=True)
class RefWindow:
    """A legal window of ``stream``: ``slots`` holds ``burn_in + length`` records, None on
    (left) padding; ``learn_step`` is the step of its first learning slot."""

    stream: int | str
    learn_step: int
    slots: tuple[Rec | None, ...]

    @property
    def pad(self) -> int:
        return sum(r is None for r in self.slots)

    @property
    def first_real_step(self) -> int:
        return next(r.step for r in self.slots if r is not None)


def skey(key: int | str) -> tuple[str, int | str]:
    return (type(key).__name__, key)


def ref_windows(visible: Iterable[Rec], length: int, burn_in: int) -> dict[tuple[Any, int], RefWindow]:
    """Every legal window, keyed by (stream, first learning step).

    Rules (sequence-replay-contract.txt, issue 4): the ``length`` learning steps are
    consecutive steps of one stream; the context before them is the consecutive steps
    of that stream walking back, cut at the latest reset (the reset record is kept, the
    records before it are not) and at ``burn_in`` records; a window with fewer than
    ``burn_in`` context records is legal only if its first real record is a reset, and
    is then left-padded.
    """
    by_stream: dict[tuple[str, int | str], list[Rec]] = {}
    for r in visible:
        by_stream.setdefault(skey(r.stream), []).append(r)
    out: dict[tuple[Any, int], RefWindow] = {}
    for key, recs in by_stream.items():
        recs = sorted(recs, key=lambda r: r.step)
        for i in range(len(recs)):
            learn = recs[i:i + length]
            if len(learn) < length or any(b.step != a.step + 1 for a, b in itertools.pairwise(learn)):
                continue
            first = i
            while True:
                if recs[first].reset or i - first == burn_in:
                    break
                if first > 0 and recs[first - 1].step == recs[first].step - 1:
                    first -= 1
                else:
                    break
            context = i - first
            if context < burn_in and not recs[first].reset:
                continue
            slots = (None,) * (burn_in - context) + tuple(recs[first:i + length])
            out[(key, recs[i].step)] = RefWindow(recs[i].stream, recs[i].step, slots)
    return out


# -- prioritized replay bookkeeping -------------------------------------------------------------

class RefPrioritized:
    """Priorities per tracked row: new rows at the running max, |p| + eps on update, eviction drops."""

    def __init__(self, alpha: float, beta: float, eps: float = 1e-6) -> None:
        self.alpha, self.beta, self.eps = alpha, beta, eps
        self.max_priority = 1.0
        self.prio: dict[int, float] = {}

    def sync(self, visible: Iterable[int]) -> None:
        visible = {int(r) for r in visible}
        for r in list(self.prio):
            if r not in visible:
                del self.prio[r]
        for r in sorted(visible - set(self.prio)):
            self.prio[r] = self.max_priority

    def update(self, rows: Sequence[int], priorities: Sequence[float]) -> None:
        tracked = [(int(r), abs(float(p)) + self.eps) for r, p in zip(rows, priorities, strict=True)
                   if int(r) in self.prio]
        if tracked:
            self.max_priority = max(self.max_priority, max(p for _, p in tracked))
        for r, p in tracked:  # the last write wins
            self.prio[r] = p

    def probability(self, rows: Iterable[int]) -> np.ndarray:
        total = sum(p ** self.alpha for p in self.prio.values())
        return np.array([self.prio[int(r)] ** self.alpha / total for r in rows])

    def weights(self, rows: Sequence[int]) -> np.ndarray:
        w = (len(self.prio) * self.probability(rows)) ** (-self.beta)
        return w / w.max()


# -- episodes ----------------------------------------------------------------------------------

@dataclass
class RefEpisode:
    stream: Any
    steps: list[int]
    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    final_obs: np.ndarray
    terminated: bool
    truncated: bool


def split_episodes(stream: Any, steps: np.ndarray, obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
                   next_obs: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                   complete_only: bool = True) -> list[RefEpisode]:
    """One stream's steps (consecutive, in order) cut after every terminated/truncated step."""
    out, lo = [], 0
    n = len(steps)
    for i in range(n):
        ended = bool(terminated[i] or truncated[i])
        if ended or (i == n - 1 and not complete_only):
            out.append(RefEpisode(stream, [int(s) for s in steps[lo:i + 1]], obs[lo:i + 1], action[lo:i + 1],
                                  reward[lo:i + 1], next_obs[i], bool(terminated[i]),
                                  bool(truncated[i]) or not ended))
            lo = i + 1
    return out


# -- statistics --------------------------------------------------------------------------------

def chi2_stat(observed: np.ndarray, expected: np.ndarray) -> float:
    observed = np.asarray(observed, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    return float(((observed - expected) ** 2 / expected).sum())


def chi2_bound(df: int, z: float = 5.0) -> float:
    """A generous upper quantile of chi-square(df) (Wilson-Hilferty; z=5 is p ~ 3e-7)."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


# -- batch checks --------------------------------------------------------------------------------

def torch_dtype(dtype: Any) -> Any:
    import torch
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


def csr_rows(values: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    return [values[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]


def dense_legal(rows: Sequence[Sequence[int]], actions: int) -> np.ndarray:
    mask = np.zeros((len(rows), actions), dtype=bool)
    for i, ids in enumerate(rows):
        for a in ids:
            mask[i, a] = True
    return mask


def to_numpy_batch(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in batch.items()}


def same_batches(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> None:
    """Assert two lists of minibatches are identical, key for key, dtype for dtype, bit for bit."""
    assert len(a) == len(b), (len(a), len(b))
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        x, y = to_numpy_batch(x), to_numpy_batch(y)
        assert set(x) == set(y), (i, sorted(x), sorted(y))
        for k in x:
            if isinstance(x[k], np.ndarray):
                assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape, (i, k)
                assert np.array_equal(x[k], y[k]), (i, k)
            else:
                assert x[k] == y[k], (i, k)


# -- a toy MDP for the DQN smoke test -------------------------------------------------------------

TOY_STATES, TOY_ACTIONS, TOY_HEADS = 6, 4, 2


def toy_legal(s: int) -> np.ndarray:
    """Legal actions change with the state (never empty for a live state)."""
    return np.array([a for a in range(TOY_ACTIONS) if (s + a) % 3 != 0 or a == 0 and s % 3 == 0], dtype=I64)


def toy_records(rng: np.random.Generator, episodes: int, gamma: float = 0.9, max_len: int = 4,
                ) -> dict[str, np.ndarray]:
    """DqnBatch-shaped records of a deterministic chain MDP under a random behaviour policy.

    State s (one-hot), action a moves to s + 1 + (a == 3); reaching TOY_STATES - 1 or
    beyond terminates (no next legal ids, discount 0); an episode cut at ``max_len``
    steps is a bootstrappable truncation (next legal ids present, discount gamma).
    """
    s_, a_ = np.meshgrid(np.arange(TOY_STATES), np.arange(TOY_ACTIONS), indexing="ij")
    reward_table = ((s_ * 3 + a_ * 5) % 7 - 3) / 3.0  # in [-1, 1], varying with state and action
    rows: dict[str, list[Any]] = {k: [] for k in ("obs", "next_obs", "actions", "rewards", "dones",
                                                   "can_bootstrap", "discounts", "legal", "next_legal")}
    eye = np.eye(TOY_STATES, dtype=F32)
    for _ in range(episodes):
        s = 0
        for t in range(max_len):
            legal = toy_legal(s)
            a = int(rng.choice(legal))
            s2 = s + 1 + (a == 3)
            terminal = s2 >= TOY_STATES - 1
            s2 = min(s2, TOY_STATES - 1)
            truncated = not terminal and t == max_len - 1
            rows["obs"].append(eye[s])
            rows["next_obs"].append(eye[s2])
            rows["actions"].append(a)
            rows["rewards"].append(float(reward_table[s, a]) + (1.0 if terminal else 0.0))
            rows["dones"].append(terminal or truncated)
            rows["can_bootstrap"].append(not terminal)
            rows["discounts"].append(0.0 if terminal else gamma)
            rows["legal"].append(legal)
            rows["next_legal"].append(np.zeros(0, I64) if terminal else toy_legal(s2))
            if terminal:
                break
            s = s2
    n = len(rows["obs"])

    def csr(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        off = np.zeros(len(parts) + 1, dtype=I64)
        np.cumsum([len(p) for p in parts], out=off[1:])
        return np.concatenate(parts).astype(I64), off

    legal_ids, legal_offsets = csr(rows["legal"])
    next_ids, next_offsets = csr(rows["next_legal"])
    return {
        "obs": np.stack(rows["obs"]), "next_obs": np.stack(rows["next_obs"]),
        "players": np.zeros(n, I64), "actions": np.array(rows["actions"], I64),
        "rewards": np.array(rows["rewards"], np.float64), "dones": np.array(rows["dones"], bool),
        "can_bootstrap": np.array(rows["can_bootstrap"], bool), "discounts": np.array(rows["discounts"]),
        "masks": (rng.random((n, TOY_HEADS)) < 0.7).astype(F32),
        "legal_ids": legal_ids, "legal_offsets": legal_offsets,
        "next_legal_ids": next_ids, "next_legal_offsets": next_offsets,
    }


def toy_schema() -> Schema:
    return dqn(observation_size=TOY_STATES, heads=TOY_HEADS, actions=TOY_ACTIONS)


# -- resume across processes ------------------------------------------------------------------------

RESUME_KINDS = ("uniform", "epoch", "sequence", "prioritized", "reservoir")
RESUME_K, RESUME_M = 4, 6


def resume_prepare(base: str, options: dict[str, Any] | None = None) -> None:
    """One probe store per sampler kind under ``base`` (a directory or an s3:// prefix, with its
    ``options``), written by the parent (writer 0)."""
    from replaystore.store import open_store
    for kind in RESUME_KINDS:
        st = open_store(f"{base}/{kind}", PROBE, capacity=40 if kind == "prioritized" else None,
                        storage_options=options)
        ref = RefStore(st.capacity)
        with st.writer() as w:
            for c in range(3):
                for key in ("a", 5):
                    kw = ref.stage(Append((key,) * 5, c == 2, (2,) + (0,) * 4, "first" if c != 1 else "none",
                                          (False,) * 5))
                    w.append(kw["batch"], stream=kw["stream"], step=kw["step"], reset=kw["reset"])
                w.commit()


def make_sampler(kind: str, st: Any, resume: bool) -> Any:
    from replaystore import loaders as L
    if kind == "uniform":
        return L.UniformSampler(st, batch_size=5, seed=11, resume=resume)
    if kind == "epoch":
        return L.EpochSampler(st, batch_size=4, seed=12, resume=resume)
    if kind == "sequence":
        return L.SequenceSampler(st, length=3, burn_in=2, batch_size=4, seed=13, resume=resume)
    if kind == "prioritized":
        return L.PrioritizedSampler(st, batch_size=6, alpha=0.7, beta=0.5, seed=14, resume=resume)
    return L.ReservoirSampler(st, capacity=9, batch_size=5, seed=15, resume=resume)


def resume_priorities(batch: dict[str, Any], drawn: int) -> np.ndarray:
    """Priority updates derived deterministically from a minibatch and the draw counter."""
    tags = batch["tag"].numpy()
    return 0.05 + ((tags * 31 + drawn * 7) % 17) / 4.0


def _ingest(st: Any, writer: Any, i: int) -> None:
    """Deterministic extra records (stream "late"), committed by this process's writer."""
    tags = 1000 + 10 * i + np.arange(3)
    writer.append(probe_arrays(tags), stream="late", reset=(i == 0))
    writer.commit()


def resume_child(role: str, root: str, kind: str, base: str | None = None,
                 options: dict[str, Any] | None = None) -> None:
    """Role "A": k draws (with ingestion for prioritized/reservoir), save(), one more commit for
    those, then m recorded draws. Role "B": reopen, resume=True, m recorded draws. The store is
    ``<base>/<kind>`` (``base``: ``root`` by default); writes ``<root>/<kind>-<role>.npz`` and
    ``.json`` (stream keys)."""
    from replaystore.loaders import gather
    from replaystore.store import open_store
    st = open_store(f"{base or root}/{kind}", storage_options=options)
    sampler = make_sampler(kind, st, resume=role == "B")
    ingest = kind in ("prioritized", "reservoir")
    writer = st.writer() if role == "A" and ingest else None

    def draw() -> dict[str, Any]:
        batch = gather(sampler.table, sampler.sample())
        if kind == "prioritized":
            sampler.update(batch["indices"], resume_priorities(batch, sampler.batches_drawn))
        return batch

    if role == "A":
        for i in range(RESUME_K):
            if writer is not None:
                _ingest(st, writer, i)
            draw()
        sampler.save()
        if writer is not None:
            _ingest(st, writer, RESUME_K)  # after the save: B must ingest it exactly as A does
    recorded = [draw() for _ in range(RESUME_M)]
    arrays, keys = {}, []
    for i, b in enumerate(recorded):
        for k, v in b.items():
            if hasattr(v, "numpy"):
                arrays[f"{i}/{k}"] = v.numpy()
        keys.append(b.get("stream_keys"))
    np.savez(f"{root}/{kind}-{role}.npz", **arrays)
    with open(f"{root}/{kind}-{role}.json", "w") as f:
        extra = {"seen": sampler.seen, "members": sampler.members.tolist()} if kind == "reservoir" else {}
        json.dump({"stream_keys": keys, "batches_drawn": sampler.batches_drawn, **extra}, f)


def resume_children(role: str, root: str, base: str | None = None, options: dict[str, Any] | None = None) -> None:
    for kind in RESUME_KINDS:
        resume_child(role, root, kind, base, options)


@dataclass
class Loaded:
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def load_result(root: str, kind: str, role: str) -> Loaded:
    with np.load(f"{root}/{kind}-{role}.npz") as z:
        arrays = {k: z[k] for k in z.files}
    with open(f"{root}/{kind}-{role}.json") as f:
        meta = json.load(f)
    return Loaded(arrays, meta)
