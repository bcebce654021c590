"""Multi-table stores (DeepCFR advantage + strategy), Rollout [T, B] and Episode appends.
Runs on every backend."""

from __future__ import annotations

import numpy as np
import pytest

from replaystore.errors import (
    MissingFieldError,
    SchemaMismatchError,
    StoreError,
    StreamKeyError,
    UnknownFieldError,
)
from replaystore.schemas import (
    deep_cfr_advantage,
    deep_cfr_strategy,
    episode,
    rollout,
    validate_tables,
)
from replaystore.schemas.columns import concat_columns
from support.batches import Rollout, deep_cfr_batch, episode_batch, rollout_batch
from support.storecheck import Backend, assert_same

CFR = {"advantage": deep_cfr_advantage(16, actions=9), "strategy": deep_cfr_strategy(16, actions=9)}


# -- tables ------------------------------------------------------------------------------------------
def test_deep_cfr_batch_splits_into_two_tables_committed_atomically(backend: Backend) -> None:
    rng = np.random.default_rng(0)
    st = backend.open(CFR)
    assert sorted(st.tables) == ["advantage", "strategy"]
    assert st.table("advantage").schema == CFR["advantage"] and st.table("strategy").name == "strategy"
    reader = backend.open(mode="r")
    batches = [deep_cfr_batch(rng, 12, 5, iteration=1), deep_cfr_batch(rng, 3, 9, iteration=2),
               deep_cfr_batch(rng, 0, 4, iteration=3)]
    w = st.writer()
    assert w.append(batches[0], stream="traverser-0") == 17
    w.append(batches[1], stream="traverser-1")
    for name in ("advantage", "strategy"):  # neither table shows anything before the commit
        assert len(st.table(name)) == 0
    result = w.commit(metadata={"iteration": 2})
    assert result is not None and result.rows == {"advantage": (0, 15), "strategy": (0, 14)}
    commit = st.commits()[-1]
    assert set(commit["tables"]) == {"advantage", "strategy"}  # one commit record covers both
    assert len(reader.table("advantage")) == 0 and len(reader.table("strategy")) == 0
    reader.refresh()
    assert len(reader.table("advantage")) == 15 and len(reader.table("strategy")) == 14
    w.append(batches[2], stream="traverser-0")  # no advantage records at all this time
    w.commit()
    w.close()
    split = [validate_tables(CFR, b) for b in batches]
    for handle in (st, backend.open(mode="r")):
        for name in ("advantage", "strategy"):
            t = handle.table(name)
            want = concat_columns([s[name] for s in split])
            assert len(t) == len(want)
            assert_same(t.read(t.row_ids()), want, name)
            pick = np.array([len(want) - 1, 0, 2])
            assert_same(t.read(pick), want.take(pick), name)
        adv, strat = handle.table("advantage"), handle.table("strategy")
        assert adv.rows("traverser-0")[1].tolist() == list(range(12))
        assert strat.rows("traverser-0")[1].tolist() == list(range(9))
        assert adv.rows("traverser-1")[1].tolist() == [0, 1, 2]
        assert sorted(strat.streams()) == ["traverser-0", "traverser-1"]
        appends = handle.commits()[0]["tables"]
        assert appends["advantage"]["appends"][0]["meta"] == {"telemetry": {"traversals": 8, "iteration": 1}}
        assert appends["strategy"]["appends"][1]["rows"] == [5, 14]
        with pytest.raises(StoreError):
            len(handle)
        with pytest.raises(StoreError):
            handle.read([0])
        with pytest.raises(StoreError):
            handle.streams()
        with pytest.raises(StoreError):
            handle.table("records")


def test_multi_table_append_errors_change_nothing(backend: Backend) -> None:
    rng = np.random.default_rng(1)
    st = backend.open(CFR)
    w = st.writer()
    good = deep_cfr_batch(rng, 4, 4)
    w.append(good, stream=0)
    w.commit()
    bad = dict(vars(deep_cfr_batch(rng, 3, 3)))
    bad["strategy_probs"] = bad["strategy_probs"].astype(np.float32)  # the *second* table is wrong
    with pytest.raises(Exception) as info:
        w.append(bad, stream=0)
    assert getattr(info.value, "field", "") == "strategy_probs"
    extra = dict(vars(deep_cfr_batch(rng, 3, 3)), bogus=np.zeros(3))
    with pytest.raises(UnknownFieldError):
        w.append(extra, stream=0)
    missing = dict(vars(deep_cfr_batch(rng, 3, 3)))
    del missing["advantage_iterations"]
    with pytest.raises(MissingFieldError):
        w.append(missing, stream=0)
    with pytest.raises(StreamKeyError):
        w.append(deep_cfr_batch(rng, 2, 2), stream=[0, 1])  # per-record keys cannot span two tables
    w.commit()
    assert len(st.table("advantage")) == 4 and len(st.table("strategy")) == 4
    # the rejected appends did not advance either table's steps
    w.append(deep_cfr_batch(rng, 1, 1), stream=0)
    w.commit()
    assert st.table("advantage").rows(0)[1].tolist() == [0, 1, 2, 3, 4]
    assert st.table("strategy").rows(0)[1].tolist() == [0, 1, 2, 3, 4]


def test_append_to_one_named_table(backend: Backend) -> None:
    rng = np.random.default_rng(2)
    st = backend.open(CFR)
    batch = deep_cfr_batch(rng, 6, 2)
    adv_only = {k: v for k, v in vars(batch).items() if k.startswith("advantage_")}
    with st.writer() as w:
        w.append(adv_only, stream="x", table="advantage")
        with pytest.raises(StoreError):
            w.append(adv_only, stream="x", table="nope")
    assert len(st.table("advantage")) == 6 and len(st.table("strategy")) == 0
    assert_same(st.table("advantage").read(np.arange(6)), CFR["advantage"].validate(adv_only))


def test_multi_table_schema_is_checked_on_reopen(backend: Backend) -> None:
    backend.open(CFR)
    assert sorted(backend.open(mode="r").tables) == ["advantage", "strategy"]
    with pytest.raises(SchemaMismatchError):
        backend.open({"advantage": CFR["advantage"]})
    with pytest.raises(SchemaMismatchError):
        backend.open({"advantage": CFR["strategy"], "strategy": CFR["advantage"]})
    assert len(backend.open(dict(reversed(list(CFR.items())))).table("strategy")) == 0  # order is irrelevant


# -- rollouts ------------------------------------------------------------------------------------------
ROLLOUT = rollout(4, actions=3)


def _rollout(rng: np.random.Generator, steps: int, envs: int, done_at_end: list[bool]) -> Rollout:
    r = rollout_batch(rng, steps, envs)
    r.terminated[-1] = np.array(done_at_end) & (np.arange(envs) % 2 == 0)
    r.truncated[-1] = np.array(done_at_end) & (np.arange(envs) % 2 == 1)
    return r


def _slot(r: Rollout, b: int) -> dict[str, np.ndarray]:
    return {k: getattr(r, k)[:, b] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}


def test_rollout_appends_as_one_stream_per_slot(backend: Backend) -> None:
    rng = np.random.default_rng(3)
    steps, envs = 6, 3
    keys = ["env-0", "env-1", "env-2"]
    r1 = _rollout(rng, steps, envs, done_at_end=[True, False, True])
    r1.terminated[2, 1] = True  # an episode ends inside the rollout on slot 1
    r1.truncated[2, 1] = False
    r2 = _rollout(rng, steps, envs, done_at_end=[False, False, False])
    st = backend.open(ROLLOUT)
    with st.writer() as w:
        assert w.append(r1, stream=keys) == steps * envs
        w.commit()
        w.append(r2, stream=keys)
    for handle in (st, backend.open(mode="r")):
        assert len(handle) == 2 * steps * envs
        assert sorted(handle.streams()) == keys
        for b, key in enumerate(keys):
            rows, st_steps = handle.rows(key)
            assert st_steps.tolist() == list(range(2 * steps))
            got = handle.read(rows)
            for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
                want = np.concatenate([_slot(r1, b)[name], _slot(r2, b)[name]])
                assert got[name].dtype == want.dtype and np.array_equal(got[name], want), (key, name)
            _, _, resets = handle.default.index_of(rows)
            done = got["terminated"] | got["truncated"]
            # a reset marks every step that follows an episode end, also across the two rollouts,
            # and a slot's very first step
            assert resets[0] and resets[1:].tolist() == done[:-1].tolist(), key
        _, _, resets0 = handle.default.index_of(handle.rows("env-0")[0])
        assert resets0[steps]  # slot 0's first rollout ended: its second one starts an episode
        _, _, resets1 = handle.default.index_of(handle.rows("env-1")[0])
        assert not resets1[steps] and resets1[3]
        assert handle.runs("env-2").tolist() == [[0, 2 * steps - 1]]


def test_rollout_default_streams_are_slot_numbers(backend: Backend) -> None:
    rng = np.random.default_rng(4)
    r = rollout_batch(rng, 4, 2)
    st = backend.open(ROLLOUT)
    with st.writer() as w:
        w.append(r)
        with pytest.raises(StreamKeyError):
            w.append(rollout_batch(rng, 4, 2), stream=["only-one"])
        with pytest.raises(StreamKeyError):
            w.append(rollout_batch(rng, 4, 2), stream=[0, 1, 2])
        for shared in ("env", 7, ["a", "a"]):  # one stream for two slots would splice their steps
            with pytest.raises(StreamKeyError):
                w.append(rollout_batch(rng, 4, 2), stream=shared)
        w.append(rollout_batch(rng, 4, 1), stream="solo")  # a single slot takes a scalar key
    assert sorted(st.streams(), key=repr) == ["solo", 0, 1]
    assert st.rows("solo")[1].tolist() == [0, 1, 2, 3]
    assert np.array_equal(st.read(st.rows(1)[0])["obs"], r.obs[:, 1])


def test_rollout_batch_with_bad_shapes_is_rejected(backend: Backend) -> None:
    rng = np.random.default_rng(5)
    st = backend.open(ROLLOUT)
    r = rollout_batch(rng, 4, 2)
    r.reward = r.reward[:3]
    with st.writer() as w:
        with pytest.raises(Exception) as info:
            w.append(r, stream=["a", "b"])
        assert getattr(info.value, "field", None) == "reward"
    assert len(st) == 0


# -- episodes ------------------------------------------------------------------------------------------
EPISODE = episode(4, actions=3)


def test_episode_appends_as_one_stream_with_its_final_observation(backend: Backend) -> None:
    rng = np.random.default_rng(6)
    e1 = episode_batch(rng, 5, terminated=True)
    e2 = episode_batch(rng, 3, terminated=False)
    e3 = episode_batch(rng, 1, terminated=True)
    st = backend.open(EPISODE)
    with st.writer() as w:
        assert w.append(e1, stream="game-1") == 5
        w.append(e2, stream="game-1")
        w.commit()
        w.append(e3, stream=42)
    for handle in (st, backend.open(mode="r")):
        rows, steps = handle.rows("game-1")
        assert steps.tolist() == list(range(8))
        got = handle.read(rows)
        assert np.array_equal(got["obs"], np.concatenate([e1.obs, e2.obs]))
        assert np.array_equal(got["next_obs"][:4], e1.obs[1:])
        assert np.array_equal(got["next_obs"][4], e1.final_obs)  # final observation kept
        assert np.array_equal(got["next_obs"][5:7], e2.obs[1:])
        assert np.array_equal(got["next_obs"][7], e2.final_obs)
        assert got["terminated"].tolist() == [False] * 4 + [True] + [False] * 3
        assert got["truncated"].tolist() == [False] * 7 + [True]
        assert np.array_equal(got["action"], np.concatenate([e1.action, e2.action]))
        assert got["reward"].dtype == np.float32
        _, _, resets = handle.default.index_of(rows)
        assert resets.tolist() == [True, False, False, False, False, True, False, False]
        single = handle.read(handle.rows(42)[0])
        assert np.array_equal(single["next_obs"][0], e3.final_obs) and single["terminated"].tolist() == [True]
        assert handle.default.index_of(handle.rows(42)[0])[2].tolist() == [True]


def test_bad_episodes_are_rejected(backend: Backend) -> None:
    rng = np.random.default_rng(7)
    st = backend.open(EPISODE)
    bad_final = episode_batch(rng, 3)
    bad_final.final_obs = bad_final.final_obs[:2]
    empty = episode_batch(rng, 1)
    empty.obs, empty.action, empty.reward = empty.obs[:0], empty.action[:0], empty.reward[:0]
    with st.writer() as w:
        for bad in (bad_final, empty):
            with pytest.raises(Exception) as info:
                w.append(bad, stream=1)
            assert getattr(info.value, "field", None) in {"final_obs", "obs"}
        w.append(episode_batch(rng, 2), stream=1)
    assert len(st) == 2 and st.rows(1)[1].tolist() == [0, 1]
