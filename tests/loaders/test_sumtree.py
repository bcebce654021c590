"""SumTree against a plain numpy reference: cumulative sums and searchsorted over the leaves."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hs

from replaystore.loaders.sumtree import SEARCH_TOP, SumTree


def _check(tree: SumTree, ref: np.ndarray, rng: np.random.Generator) -> None:
    """Leaves, total and ``find`` agree with the reference; ``find`` never returns a zero leaf."""
    np.testing.assert_array_equal(tree.leaves()[:len(ref)], ref)
    assert not tree.leaves()[len(ref):].any()
    total = ref.sum()
    assert np.isclose(tree.total, total, rtol=1e-12, atol=0)
    if total <= 0:
        return
    cum = np.cumsum(ref)
    # random targets plus the edges: 0, each leaf boundary, and the largest value below the total
    targets = np.concatenate([rng.random(64) * total, [0.0, np.nextafter(tree.total, 0)], cum[:-1]])
    targets = np.minimum(targets, np.nextafter(tree.total, 0))
    got = tree.find(targets)
    assert (ref[got] > 0).all()
    want = np.minimum(np.searchsorted(cum, targets, side="right"), len(ref) - 1)
    # the tree sums in another order than cumsum: a target within rounding of a boundary may
    # land on either neighbouring positive leaf; everywhere else the leaf must be the same
    lo = cum[got] - ref[got]
    near = np.isclose(targets, lo, rtol=1e-9, atol=0) | np.isclose(targets, cum[got], rtol=1e-9, atol=0)
    ok = (got == want) | near | (ref[want] <= 0)
    assert ok.all(), (targets[~ok], got[~ok], want[~ok])


@settings(max_examples=60, deadline=None)
@given(n=hs.integers(1, 3 * SEARCH_TOP), zeros=hs.floats(0, 1), seed=hs.integers(0, 2**32 - 1),
       batches=hs.lists(hs.integers(1, 300), max_size=6), grow=hs.integers(0, 4 * SEARCH_TOP))
def test_sumtree_matches_cumsum_reference(n: int, zeros: float, seed: int, batches: list[int], grow: int) -> None:
    rng = np.random.default_rng(seed)
    ref = np.where(rng.random(n) < zeros, 0.0, rng.random(n))
    tree = SumTree(n)
    tree.set(np.arange(n), ref)
    _check(tree, ref, rng)
    for b in batches:  # sparse sets with duplicate leaves: the last write wins
        leaves = rng.integers(0, n, b)
        vals = np.where(rng.random(b) < zeros, 0.0, rng.random(b) * 10)
        tree.set(leaves, vals)
        ref[leaves] = vals
        _check(tree, ref, rng)
        if tree.total > 0:  # the cached prefix sums must follow the next set
            tree.find(np.array([0.0]))
    tree.grow(n + grow)
    ref = np.concatenate([ref, np.zeros(grow)])
    _check(tree, ref, rng)
    new = rng.integers(0, n + grow, 50)
    tree.set(new, np.ones(50))
    ref[new] = 1.0
    _check(tree, ref, rng)


def test_sumtree_values_do_not_depend_on_batching() -> None:
    rng = np.random.default_rng(0)
    n = 20_000
    vals = rng.random(n)
    whole = SumTree(n)
    whole.set(np.arange(n), vals)
    pieces = SumTree(n)
    for chunk in np.array_split(rng.permutation(n), 97):
        pieces.set(chunk, vals[chunk])
    np.testing.assert_array_equal(pieces.tree, whole.tree)
    targets = rng.random(1000) * whole.total
    np.testing.assert_array_equal(pieces.find(targets), whole.find(targets))


def test_sumtree_far_right_slack_never_returns_a_zero_leaf() -> None:
    tree = SumTree(5000)  # leaves 5000.. stay zero: slack past the last positive leaf must step back
    vals = np.full(5000, 0.1)
    tree.set(np.arange(5000), vals)
    got = tree.find(np.array([np.nextafter(tree.total, 0), tree.total * (1 + 1e-15)]))
    assert (got < 5000).all() and (tree.leaves()[got] > 0).all()
