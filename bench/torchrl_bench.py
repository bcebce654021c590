"""TorchRL ``TensorDictReplayBuffer.sample()`` of 256: ``ReplayStoreStorage`` against ``LazyMemmapStorage``.

Only the storage differs: the same buffer class, ``RandomSampler`` and batch size, the same transitions
extended in chunks of 1,000 (ours: one commit per chunk, local disk). Shapes: CartPole-like (observation 4
float32) and Atari-like (observation 4x84x84 uint8, its next observation stored too, as TorchRL stores it).
Best of interleaved windows (benchkit). Information row: ``SliceSampler`` over the same two storages.

    python bench/torchrl_bench.py            # 100k CartPole-like, 10k Atari-like transitions
    python bench/torchrl_bench.py --quick    # 20k and 2k (< 1 minute)
"""

from __future__ import annotations

from typing import Any

import benchkit

BATCH, CHUNK = 256, 1000
SIZES = ({"cartpole": 100_000, "atari": 10_000, "warm_s": 1.0, "rep_s": 2.0, "reps": 3},
         {"cartpole": 20_000, "atari": 2_000, "warm_s": 0.3, "rep_s": 0.5, "reps": 2})


def chunk(start: int, n: int, obs_shape: tuple[int, ...], dtype: Any) -> Any:
    """``n`` transitions in TorchRL's layout, deterministic in ``start``."""
    import torch
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(start)
    if dtype == torch.uint8:
        obs = torch.randint(0, 256, (n, *obs_shape), generator=g, dtype=torch.uint8)
        nxt = torch.randint(0, 256, (n, *obs_shape), generator=g, dtype=torch.uint8)
    else:
        obs, nxt = torch.randn((n, *obs_shape), generator=g), torch.randn((n, *obs_shape), generator=g)
    done = torch.rand((n, 1), generator=g) < 0.02
    return TensorDict({"observation": obs, "action": torch.randint(0, 2, (n,), generator=g),
                       "next": {"observation": nxt, "reward": torch.ones(n, 1), "done": done,
                                "terminated": done.clone(), "truncated": torch.zeros(n, 1, dtype=torch.bool)}},
                      batch_size=[n])


def compare(tmp: str, name: str, n: int, obs_shape: tuple[int, ...], dtype: Any, cfg: dict[str, Any],
            out: benchkit.Table) -> None:
    """Fill both buffers with the same ``n`` transitions, then time ``sample()``."""
    from torchrl.data import LazyMemmapStorage, RandomSampler, SliceSampler, TensorDictReplayBuffer

    from replaystore.integrations.torchrl import ReplayStoreStorage

    ours = TensorDictReplayBuffer(storage=ReplayStoreStorage(f"{tmp}/{name}"), sampler=RandomSampler(),
                                  batch_size=BATCH)
    peer = TensorDictReplayBuffer(storage=LazyMemmapStorage(n, scratch_dir=f"{tmp}/{name}-memmap"),
                                  sampler=RandomSampler(), batch_size=BATCH)
    for start in range(0, n, CHUNK):
        td = chunk(start, min(CHUNK, n - start), obs_shape, dtype)
        ours.extend(td.clone())
        peer.extend(td)
    assert len(ours) == len(peer) == n
    rates = benchkit.interleaved({"ours": (ours.sample, 1), "peer": (peer.sample, 1)}, cfg)
    out.add(f"sample() of {BATCH}, {n:,} {name}-like transitions (obs {'x'.join(map(str, obs_shape))} "
            f"{str(dtype).split('.')[-1]})", rates["ours"], rates["peer"], "batches/s", 1.0)
    if name == "cartpole":  # information: SliceSampler over the same two storages (it reads storage[:])
        slices = {k: TensorDictReplayBuffer(storage=rb.storage, batch_size=BATCH,
                                            sampler=SliceSampler(end_key=("next", "done"), slice_len=16))
                  for k, rb in (("ours", ours), ("peer", peer))}
        rates = benchkit.interleaved({k: (rb.sample, 1) for k, rb in slices.items()}, cfg)
        out.add(f"SliceSampler(slice_len=16) sample() of {BATCH}, same {n:,} transitions", rates["ours"],
                rates["peer"], "batches/s", note="information")
    ours.storage.close()


def body(tmp: str, cfg: dict[str, Any], out: benchkit.Table) -> None:
    """Both shapes."""
    import torch

    compare(tmp, "cartpole", cfg["cartpole"], (4,), torch.float32, cfg, out)
    compare(tmp, "atari", cfg["atari"], (4, 84, 84), torch.uint8, cfg, out)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; see the module docstring."""
    return benchkit.main("torchrl", __doc__ or "", argv, SIZES, benchkit.Table("LazyMemmapStorage", "memmap"), body)


if __name__ == "__main__":
    raise SystemExit(main())
