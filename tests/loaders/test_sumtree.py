"""SumTree against a plain numpy reference: cumulative sums and searchsorted over the leaves.

Every test runs on both implementations of the sparse ``set`` and ``find``: numpy, and the
numba kernels (loaders/treekernels.py; numba comes with the ``test`` extra), which must give
bit-identical trees and draws.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from replaystore.loaders.sumtree import SEARCH_TOP, SumTree, compiled_kernels


@contextmanager
def backend(name: str) -> Iterator[None]:
    """Trees made (or grown) inside use the numba kernels or plain numpy."""
    with mock.patch.dict(os.environ, {"REPLAYSTORE_NUMBA": "1" if name == "numba" else "0"}):
        yield


@pytest.fixture(params=["numba", "numpy"])
def each_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    with backend(request.param):
        assert (compiled_kernels() is not None) == (request.param == "numba"), "the test extra installs numba"
        yield request.param


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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=hs.integers(1, 12 * SEARCH_TOP), zeros=hs.floats(0, 1), seed=hs.integers(0, 2**32 - 1),
       batches=hs.lists(hs.integers(1, 300), max_size=6), grow=hs.integers(0, 80 * SEARCH_TOP))
def test_sumtree_matches_cumsum_reference(each_backend: str, n: int, zeros: float, seed: int, batches: list[int],
                                          grow: int) -> None:
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


def test_sumtree_values_do_not_depend_on_batching(each_backend: str) -> None:
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


def test_sumtree_far_right_slack_never_returns_a_zero_leaf(each_backend: str) -> None:
    tree = SumTree(5000)  # leaves 5000.. stay zero: slack past the last positive leaf must step back
    vals = np.full(5000, 0.1)
    tree.set(np.arange(5000), vals)
    got = tree.find(np.array([np.nextafter(tree.total, 0), tree.total * (1 + 1e-15)]))
    assert (got < 5000).all() and (tree.leaves()[got] > 0).all()


@settings(max_examples=60, deadline=None)
@given(n=hs.integers(1, 12 * SEARCH_TOP), zeros=hs.floats(0, 1), seed=hs.integers(0, 2**32 - 1),
       batches=hs.lists(hs.integers(1, 600), min_size=1, max_size=8), grow=hs.integers(0, 80 * SEARCH_TOP),
       integral=hs.booleans())
def test_numba_kernels_are_bit_identical_to_numpy(n: int, zeros: float, seed: int, batches: list[int],
                                                   grow: int, integral: bool) -> None:
    """``integral``: whole-number leaves, so every sum is exact and whole-number targets tie with
    running sums exactly (a tie goes right: the leaf whose range starts there)."""
    rng = np.random.default_rng(seed)
    trees = {}
    for name in ("numba", "numpy"):
        with backend(name):
            trees[name] = SumTree(n)
    uses = trees["numba"]._kernels is not None  # trees of up to SEARCH_TOP leaves have no levels to descend
    assert uses == (trees["numba"].depth > 0) and trees["numpy"]._kernels is None

    def same() -> None:
        np.testing.assert_array_equal(trees["numba"].tree, trees["numpy"].tree)
        total = trees["numpy"].total
        assert trees["numba"].total == total
        if total > 0:
            targets = rng.random(300) * total
            if integral:
                targets = np.floor(targets)
            targets = np.sort(np.concatenate([targets, trees["numpy"]._prefixes()[:-1]]))
            targets[-1] = min(targets[-1], np.nextafter(total, 0))
            np.testing.assert_array_equal(trees["numba"].find(targets), trees["numpy"].find(targets))

    for b in batches:
        leaves = rng.integers(0, n, b)
        vals = np.where(rng.random(b) < zeros, 0.0, rng.exponential(1.0, b))
        if integral:
            vals = np.ceil(vals * 4)
        for t in trees.values():
            t.set(leaves, vals)
        same()
    for name, t in trees.items():
        with backend(name):
            t.grow(n + grow)
    same()


@pytest.mark.parametrize("bad", [-1, "size"])
def test_set_rejects_a_leaf_out_of_range(each_backend: str, bad: int | str) -> None:
    tree = SumTree(100_000)
    tree.set(np.arange(10), np.ones(10))
    before = tree.tree.copy()
    with pytest.raises(IndexError):
        tree.set(np.array([3, tree.size if bad == "size" else bad]), np.ones(2))
    np.testing.assert_array_equal(tree.tree, before)  # checked before anything is written


@pytest.mark.parametrize("n", [1, 7, SEARCH_TOP, SEARCH_TOP + 1, 8 * SEARCH_TOP + 1, 64 * SEARCH_TOP + 1, 1_000_003])
def test_every_depth_matches_the_reference_and_both_backends_agree(n: int) -> None:
    """Sizes on either side of each added level (``depth`` 0 to 3 and beyond): leaves, totals and
    draws match the cumsum reference, and the numba and numpy trees are bit-identical."""
    rng = np.random.default_rng(n)
    ref = np.where(rng.random(n) < 0.3, 0.0, rng.exponential(1.0, n))
    sparse = rng.integers(0, n, 97)
    trees = {}
    for name in ("numba", "numpy"):
        with backend(name):
            trees[name] = tree = SumTree(n)
        assert tree.size >= n and tree.top <= SEARCH_TOP and tree.size == tree.top * 8 ** tree.depth
        tree.set(np.arange(n), ref)
        tree.set(sparse, np.full(97, 2.5))
    ref[sparse] = 2.5
    for tree in trees.values():
        _check(tree, ref, np.random.default_rng(1))
    np.testing.assert_array_equal(trees["numba"].tree, trees["numpy"].tree)
    targets = np.sort(rng.random(500)) * trees["numpy"].total
    np.testing.assert_array_equal(trees["numba"].find(targets), trees["numpy"].find(targets))


def test_each_node_is_the_sum_of_its_eight_children_on_one_cache_line() -> None:
    tree = SumTree(300_000)
    tree.set(np.arange(300_000), np.random.default_rng(2).random(300_000))
    assert tree.depth == 3 and tree.tree.ctypes.data % 64 == 0 and (tree.starts % 8 == 0).all()
    for j in range(tree.depth):
        kids = tree.level(j + 1).reshape(-1, 8)
        np.testing.assert_array_equal(tree.level(j), ((kids[:, 0] + kids[:, 1]) + (kids[:, 2] + kids[:, 3]))
                                      + ((kids[:, 4] + kids[:, 5]) + (kids[:, 6] + kids[:, 7])))


def test_a_tree_following_a_growing_table_is_rebuilt_a_logarithmic_number_of_times() -> None:
    """The prioritized sampler grows its tree to the slots it tracks after each commit; a tree
    sized exactly would be rebuilt (O(n)) at every commit."""
    tree = SumTree(1024)
    tree.set(np.arange(1024), np.ones(1024))
    sizes = {tree.size}
    for slots in range(1024 + 1000, 200_000, 1000):  # a commit of 1,000 records at a time
        tree.grow(slots)
        sizes.add(tree.size)
        assert tree.size >= slots
    assert len(sizes) <= 9  # 1,024 -> 2,048 -> ... -> 262,144: doubling each time
    assert tree.total == 1024.0
