"""Journey: a store recorded from CartPole becomes an SB3 replay, trains offline then online, and moves.

One user's path: record a vector env with ``RecordVectorEpisodes`` (unbounded), open the recording
with ``ReplayStoreBuffer`` through SB3's public ``replay_buffer_class``/``replay_buffer_kwargs``,
pre-train DQN offline (``train_offline``), fine-tune online on the same store, save the run, move
its directory, load it and continue. Checked against SB3's own ``ReplayBuffer`` fed the same records.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3 import DQN
from stable_baselines3.common.buffers import ReplayBuffer

from replaystore.errors import StoreNotFoundError
from replaystore.gym import RecordVectorEpisodes
from replaystore.integrations.sb3 import ReplayStoreBuffer, train_offline
from replaystore.store import open_store


def record_cartpole(url: Path, steps: int = 60, n_envs: int = 4) -> int:
    """Record ``steps`` vector steps of ``n_envs`` CartPoles (random actions); the records written."""
    env = RecordVectorEpisodes(gym.make_vec("CartPole-v1", num_envs=n_envs), str(url))
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(steps):
        env.step(env.action_space.sample())
    env.close()
    with open_store(str(url), mode="r") as st:
        assert st.default.capacity is None  # the recorder's default: unbounded
        return len(st.default)


def stored_rows(url: Path) -> np.ndarray:
    """Every record of the store as one row ``obs | action | reward | next_obs`` (store order)."""
    with open_store(str(url), mode="r") as st:
        view = st.default.view()
        c = view.read(view.rows_at(np.arange(len(view))), ["obs", "action", "reward", "next_obs"])
    return np.column_stack([c["obs"], c["action"], c["reward"], c["next_obs"]]).astype(np.float32)


def sample_rows(buf: ReplayStoreBuffer | ReplayBuffer, n: int) -> np.ndarray:
    s = buf.sample(n)
    return th.cat([s.observations, s.actions.float(), s.rewards, s.next_observations], dim=1).numpy()


def dqn(env: gym.Env, url: str, **kw: object) -> DQN:
    return DQN("MlpPolicy", env, buffer_size=100_000, learning_starts=0, batch_size=32, train_freq=4,
               target_update_interval=50, policy_kwargs={"net_arch": [32]}, seed=0, device="cpu",
               replay_buffer_class=ReplayStoreBuffer, replay_buffer_kwargs={"url": url}, **kw)


@pytest.mark.parametrize("buffer_size", [64, 10_000])
def test_a_recorded_store_samples_what_sb3s_own_buffer_would_hold(tmp_path: Path, buffer_size: int) -> None:
    """An unbounded recording opens for any buffer_size; the buffer holds its newest buffer_size records."""
    url = tmp_path / "replay"
    n = record_cartpole(url)
    rows = stored_rows(url)
    space = gym.make("CartPole-v1")
    buf = ReplayStoreBuffer(buffer_size, space.observation_space, space.action_space, device="cpu", url=url)
    ref = ReplayBuffer(buffer_size, space.observation_space, space.action_space, device="cpu")
    for r in rows:  # SB3's own buffer fed the same records, one env step each
        ref.add(r[None, :4], r[None, 6:], r[None, 4:5].astype(np.int64), r[None, 5], np.zeros(1), [{}])
    assert buf.size() == ref.size() == min(buffer_size, n)
    assert buf.full == ref.full
    np.random.seed(0)
    ours = {r.tobytes() for r in sample_rows(buf, 4096)}
    k = ref.size()
    held = {r.tobytes() for r in np.column_stack([ref.observations[:k, 0], ref.actions[:k, 0], ref.rewards[:k],
                                                   ref.next_observations[:k, 0]]).astype(np.float32)}
    assert ours == held  # the same transitions, every one drawn (4096 seeded draws over at most ~240)
    if buffer_size < n:  # the newest buffer_size records of the store, as SB3 keeps its last buffer_size steps
        assert held == {r.tobytes() for r in rows[n - buffer_size:]}
    buf.close()
    with open_store(str(url), mode="r") as st:
        assert st.default.capacity is None and len(st.default) == n  # opening changed nothing


def test_pretrain_offline_finetune_online_move_the_run_and_continue(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(run)
    recorded = record_cartpole(run / "replay")
    model = dqn(gym.make("CartPole-v1"), "replay")  # a url relative to the run directory
    assert model.replay_buffer.stored_at_open == recorded
    before = [p.detach().clone() for p in model.q_net.parameters()]
    target_before = [p.detach().clone() for p in model.q_net_target.parameters()]
    assert train_offline(model, 120) == 120  # offline: no env step taken, the store unchanged
    assert model.num_timesteps == 0
    assert any(not th.equal(a, b) for a, b in zip(before, model.q_net.parameters(), strict=True))
    # the target network follows every target_update_interval (50) gradient steps, as learn() would
    assert any(not th.equal(a, b) for a, b in zip(target_before, model.q_net_target.parameters(), strict=True))
    with open_store("replay", mode="r") as st:
        assert len(st.default) == recorded
    model.learn(200)  # online fine-tuning appends to the same store
    model.save(run / "model")
    model.replay_buffer.close()
    with open_store("replay", mode="r") as st:
        after = len(st.default)
    assert after == recorded + 200
    rows = stored_rows(run / "replay")

    moved = tmp_path / "elsewhere" / "run-moved"
    moved.parent.mkdir()
    shutil.move(run, moved)
    monkeypatch.chdir(tmp_path)  # neither the old run directory nor the new one
    loaded = DQN.load(moved / "model.zip", env=gym.make("CartPole-v1"), device="cpu")
    buf = loaded.replay_buffer
    assert isinstance(buf, ReplayStoreBuffer) and buf.stored_at_open == after
    np.testing.assert_array_equal(stored_rows(moved / "replay"), rows)  # the same records
    assert not (tmp_path / "replay").exists() and not run.exists()  # nothing created elsewhere
    loaded.learn(100, reset_num_timesteps=False)
    buf.close()
    with open_store(str(moved / "replay"), mode="r") as st:
        assert len(st.default) == after + 100


def test_a_moved_run_with_an_absolute_url_is_an_error_naming_the_path(tmp_path: Path) -> None:
    run = tmp_path / "run"
    record_cartpole(run / "replay", steps=20)
    model = dqn(gym.make("CartPole-v1"), str(run / "replay"))
    model.learn(50)
    model.save(run / "model")
    model.replay_buffer.close()
    moved = tmp_path / "moved"
    shutil.move(run, moved)
    with pytest.raises(StoreNotFoundError) as err:
        DQN.load(moved / "model.zip", device="cpu")
    msg = str(err.value)
    assert str(run / "replay") in msg and "replay_buffer_kwargs" in msg and str(moved / "replay") in msg
    assert not run.exists()  # no new, empty store at the old path
    loaded = DQN.load(moved / "model.zip", device="cpu", replay_buffer_kwargs={"url": str(moved / "replay")})
    with open_store(str(moved / "replay"), mode="r") as st:
        assert loaded.replay_buffer.stored_at_open == len(st.default) > 0
    loaded.replay_buffer.close()


def test_a_pickled_buffer_whose_store_is_gone_is_an_error(tmp_path: Path) -> None:
    url = tmp_path / "replay"
    record_cartpole(url, steps=10)
    model = dqn(gym.make("CartPole-v1"), str(url))
    model.save_replay_buffer(tmp_path / "buffer.pkl")
    model.replay_buffer.close()
    shutil.rmtree(url)
    with pytest.raises(StoreNotFoundError, match="replay_buffer_kwargs"):
        model.load_replay_buffer(tmp_path / "buffer.pkl")
    assert not os.path.exists(url)


def test_the_same_recording_feeds_torchrls_storage_from_a_home_path(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The recording (at ``~/replay``) is also a TorchRL replay: every sampled transition is a recorded one."""
    torchrl_data = pytest.importorskip("torchrl.data")
    from replaystore.integrations.torchrl import ReplayStoreStorage

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    n = record_cartpole(Path("~/replay").expanduser(), steps=20)
    rows = {r.tobytes() for r in stored_rows(tmp_path / "replay")}
    storage = ReplayStoreStorage("~/replay")
    assert len(storage) == n
    rb = torchrl_data.ReplayBuffer(storage=storage, batch_size=64)
    batch = rb.sample()
    got = th.cat([batch["observation"], batch["action"].reshape(64, 1).float(),
                  batch["next", "reward"].reshape(64, 1).float(), batch["next", "observation"]], dim=1).numpy()
    assert {r.tobytes() for r in got} <= rows
    assert list((tmp_path / "cwd").iterdir()) == []
