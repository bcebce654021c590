"""The hostile-store corpus (tests/support/hostile_corpus.py): every object kind of a store under
every damage that applies to it, each operation a user runs (open, read, scan, a sampler draw,
load_state, verify, ``replaystore info``/``verify``/``copy``) under an alarm and an address-space
limit in a worker process. Only typed errors: no raw exception, no hang, no allocation sized by a
claim, no result that differs from the honest store's, no damage that ``verify`` passes.

``python tests/support/hostile_corpus.py --matrix`` prints the same figures standalone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support import hostile_corpus as corpus


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with corpus.base_store() as root:
        yield root


def test_the_corpus_covers_every_kind_and_damage() -> None:
    ids = [c.id for c in corpus.cases()]
    assert len(ids) == len(set(ids))
    assert {c.kind for c in corpus.cases()} == set(corpus.KINDS)
    damages = {c.damage for c in corpus.cases()}
    assert {"truncated", "fifo", "directory", "symlink outside", "claimed size", "wrong type",
            "overlapping ranges"} <= damages


def test_a_hostile_store_gives_only_typed_errors(base: str, capsys: pytest.CaptureFixture[str]) -> None:
    results = corpus.run(base, workers=2)
    with capsys.disabled():
        print("\n" + corpus.summary(results))
    ran = {(r["case"], r["op"]) for r in results}
    assert len(results) == len(ran)
    cases = {c.id for c in corpus.cases()}
    # every case ran every operation, except where a hang ended the case early
    hung = {r["case"] for r in results if r["outcome"] == "hang"}
    assert {(c, op) for c in cases - hung for op in corpus.OPS} <= ran
    bad = corpus.bad(results)
    assert not bad, "\n".join(f"{r['outcome']}: {r['case']}: {r['op']}: {r['detail']}" for r in bad)
    # the honest operations still work: a damage refused by every operation is no damage at all
    assert sum(r["outcome"] == "ok" for r in results) > len(results) // 3
