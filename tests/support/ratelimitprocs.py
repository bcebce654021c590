"""Child processes of the rate-limiter tests (tests/loaders/test_ratelimit.py).

Run as ``python -m support.ratelimitprocs <role> <json args>`` from tests/; each prints
JSON lines on stdout, flushed at once. Roles:

- ``collector``: commits ``commits`` batches of ``records`` transitions from its own writer,
  pausing ``pace`` seconds between commits (a slow environment, not a synchronisation), then
  prints ``{"committed": n}``. With ``throttle``, each commit first waits on the limiter's
  ``admit_insert`` and it prints the counts it saw at each admission.
- ``forger``: saves state slot ``slot`` of the store's default table holding ``samples`` (any JSON
  value: a forged or damaged sample count), then prints ``{"forged": slot}``.
- ``learner``: builds a sampler with a :class:`~replaystore.loaders.RateLimiter`, prints
  ``{"ready": own count}``, then draws minibatches until the limiter times out (or
  ``max_batches``), checking the rule after each draw, and prints a summary. With
  ``until_inserts``, a timeout met while fewer records are committed is not the end: the
  collector is still on its way (slow to start or stalled on a loaded machine), so it prints
  ``{"early_timeout": counts}`` and draws on. The limiter's timeout then only detects the
  end, once all inserts are in, and never races the collector's start-up.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.schemas import Schema, transitions

TESTS_DIR = Path(__file__).resolve().parents[1]


def schema() -> Schema:
    """The tests' table schema."""
    return transitions(obs_shape=2)


def batch(n: int, seed: int) -> dict[str, np.ndarray]:
    """``n`` transitions."""
    rng = np.random.default_rng(seed)
    return {"obs": rng.random((n, 2), np.float32), "action": rng.integers(0, 2, n),
            "reward": rng.random(n, np.float32), "next_obs": rng.random((n, 2), np.float32),
            "terminated": np.zeros(n, bool)}


def _say(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def collector(url: str, records: int, commits: int, pace: float, seed: int = 0,
              limiter: dict[str, Any] | None = None) -> None:
    from replaystore.store import open_store

    st = open_store(url, mode="a")
    w = st.writer(**({} if limiter is None else {"rate_limiter": _limiter(limiter)}))
    total = 0
    for i in range(commits):
        w.append(batch(records, seed * 100_000 + i), stream=f"c{seed}")
        w.commit()
        total += records
        if limiter is not None:  # the counts after the commit: samples read after it only grew
            from replaystore.loaders.ratelimit import published_samples

            name = limiter.get("name") or st.default.name
            _say({"inserts": st.default.total_committed(), "samples": published_samples(st, name, st.default.name)})
        if pace:
            time.sleep(pace)  # the pace of a slow environment
    w.close()
    _say({"committed": total})


def forger(url: str, slot: str, samples: Any) -> None:
    from replaystore.store import open_store

    st = open_store(url, mode="a")
    st.save_state(slot, {"limiter": slot.split(".")[1], "table": st.default.name, "sampler": "forged",
                         "samples": samples}, keep_last=1)
    _say({"forged": slot})


def _limiter(args: dict[str, Any]) -> Any:
    from replaystore.loaders import RateLimiter

    return RateLimiter(args["spi"], args["min_size"], args["error_buffer"], timeout=args.get("timeout"),
                       name=args.get("name"), sync_every_s=args.get("sync_every_s", 0.1))


def learner(url: str, limiter: dict[str, Any], batch_size: int, name: str, resume: bool = False,
            max_batches: int | None = None, kind: str = "uniform", until_inserts: int | None = None) -> None:
    from replaystore.errors import RateLimitTimeout
    from replaystore.loaders import PrioritizedSampler, UniformSampler
    from replaystore.store import open_store

    st = open_store(url, mode="a")
    lim = _limiter(limiter)
    cls = {"uniform": UniformSampler, "prioritized": PrioritizedSampler}[kind]
    sampler = cls(st, batch_size, seed=len(name), name=name, rate_limiter=lim, resume=resume)
    gate = sampler.rate_limit
    assert gate is not None
    _say({"ready": gate.own, "batches_drawn": sampler.batches_drawn})
    batches, worst, first, timed_out, early = 0, -float("inf"), None, None, 0
    while max_batches is None or batches < max_batches:
        try:
            request = sampler.sample()
        except RateLimitTimeout as exc:
            counts = {"inserts": exc.inserts, "samples": exc.samples, "size": exc.size,
                      "waited_for": exc.waited_for}
            if until_inserts is not None and exc.inserts < until_inserts:
                early += 1  # a timeout counts nothing: the next draw waits again
                _say({"early_timeout": counts})
                continue
            timed_out = counts
            break
        inserts, samples, size = gate.counts()
        assert len(request.rows) == batch_size
        if first is None:
            first = {"inserts": inserts, "size": size}
        # how far the samples (as this learner knows them) ran past the rule's bound
        worst = max(worst, samples - (inserts * lim.samples_per_insert - lim.min_diff))
        batches += 1
    sampler.save()
    _say({"batches": batches, "own": gate.own, "worst": worst, "first": first, "timed_out": timed_out,
          "batches_drawn": sampler.batches_drawn, "early_timeouts": early})


class Child:
    """One child process; its stdout read line-wise from the raw pipe with deadlines (never sleeps)."""

    def __init__(self, role: str, **args: Any) -> None:
        path = os.environ.get("PYTHONPATH", "")
        env = {**os.environ, "PYTHONPATH": str(TESTS_DIR) + (os.pathsep + path if path else "")}
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "support.ratelimitprocs", role, json.dumps(args)],
                                     cwd=TESTS_DIR, env=env, stdout=subprocess.PIPE, stderr=self.err)
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()
        self.buf = b""

    def line(self, timeout: float) -> dict[str, Any]:
        """The next JSON line (the child flushes each), within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            with selectors.DefaultSelector() as sel:
                sel.register(self.fd, selectors.EVENT_READ)
                assert left > 0 and sel.select(left), f"no line within {timeout} s; stderr: {self.stderr()}"
            chunk = os.read(self.fd, 65536)
            assert chunk, f"child exited (status {self.proc.wait()}); stderr: {self.stderr()}"
            self.buf += chunk
        text, self.buf = self.buf.split(b"\n", 1)
        return json.loads(text)

    def lines_until(self, key: str, timeout: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The lines before the first with ``key``, and that line; each within ``timeout`` seconds."""
        before = []
        while key not in (doc := self.line(timeout)):
            before.append(doc)
        return before, doc

    def summary(self, timeout: float) -> dict[str, Any]:
        """A learner's summary line (after any ``early_timeout`` lines), then its exit (status 0)."""
        before, doc = self.lines_until("batches", timeout)
        assert all("early_timeout" in d for d in before), before
        assert self.proc.wait(timeout) == 0, f"exit {self.proc.returncode}; stderr: {self.stderr()}"
        return doc

    def result(self, timeout: float) -> dict[str, Any]:
        """The next JSON line, then the child's exit (status 0), within ``timeout`` seconds."""
        doc = self.line(timeout)
        assert self.proc.wait(timeout) == 0, f"exit {self.proc.returncode}; stderr: {self.stderr()}"
        return doc

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def kill(self) -> None:
        """Kill the child if it still runs; close its pipe and stderr file."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.err.close()


ROLES = {"collector": collector, "forger": forger, "learner": learner}

if __name__ == "__main__":
    ROLES[sys.argv[1]](**json.loads(sys.argv[2]))
