"""replaystore: a persistent, on-disk dataset and replay store for reinforcement learning.

Create a store, append a batch and sample minibatches from it (here in memory; a local
path or an ``s3://`` URL gives a store that outlives the process):

>>> import numpy as np
>>> from replaystore.loaders import UniformSampler
>>> from replaystore.schemas import transitions
>>> from replaystore.store import open_store
>>> st = open_store("memory://quickstart", transitions(obs_shape=4), capacity=1_000)
>>> rng = np.random.default_rng(0)
>>> batch = {"obs": rng.random((100, 4), np.float32), "action": rng.integers(0, 2, 100),
...          "reward": rng.random(100, np.float32), "next_obs": rng.random((100, 4), np.float32),
...          "terminated": rng.random(100) < 0.1}
>>> with st.writer() as w:  # one writer per process; many processes may write at once
...     w.append(batch, stream="actor-0")  # steps 0..99 of stream "actor-0"
...     result = w.commit(metadata={"iteration": 1})  # durable and visible, atomically
100
>>> len(st), st.streams()
(100, ['actor-0'])
>>> sampler = UniformSampler(st, batch_size=32, seed=0, num_batches=2)
>>> for request in sampler:  # or make_loader(st, sampler): a torch DataLoader of tensors
...     minibatch = st.read(request.rows)
...     print(minibatch["obs"].shape, minibatch["reward"].dtype)
(32, 4) float32
(32, 4) float32
"""

__version__ = "0.1.0"
