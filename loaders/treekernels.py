"""Compiled (numba) versions of :class:`~replaystore.loaders.sumtree.SumTree`'s sparse ``set`` and ``find``.

Imported only when numba loads (a dependency, but a Python or numpy it does not support can
stop it) and is not turned off with ``REPLAYSTORE_NUMBA=0``;
:func:`replaystore.loaders.sumtree.compiled_kernels` decides.
Each kernel does the same floating-point operations in the same order as the numpy code
it replaces, so trees, draws and saved states are bit-identical either way (tested); only
the cost differs: one call per operation instead of a few numpy calls per tree level
(docs/PERFORMANCE.md, "A compiled sum tree"). Machine code is cached on disk by numba
(``cache=True``), so only the first process on a machine compiles.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def _prefetch(typingctx: Any, array: Any, index: Any) -> Any:
    """Ask the CPU to bring the cache line of ``array[i]`` in: ``_prefetch(array, i)``.

    LLVM's ``llvm.prefetch``, a hint: no fault for any address, no effect on results.
    """
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        array_type = signature.args[0]
        arr = context.make_array(array_type)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, array_type, arr, [args[1]], wraparound=False,
                                       boundscheck=False)
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]),
                                            "llvm.prefetch.p0i8")
        # read, keep in all cache levels, data cache
        builder.call(fn, [builder.bitcast(ptr, byte_ptr), ir.Constant(i32, 0), ir.Constant(i32, 3),
                          ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.void(array, index), codegen


@numba.njit(cache=True, nogil=True, boundscheck=False)
def find(tree: np.ndarray, starts: np.ndarray, depth: int, prefix: np.ndarray, targets: np.ndarray,
         out: np.ndarray) -> None:
    """``out[i]``: the leaf whose cumulative range holds ``targets[i]`` (see ``SumTree.find``).

    Parameters
    ----------
    tree : numpy.ndarray
        The tree's float64 array (every level).
    starts : numpy.ndarray
        Where each level starts in ``tree``; the last entry is its length.
    depth : int
        The leaves' level.
    prefix : numpy.ndarray
        Running sums of level 0, ``[0, p_1, ..., p_top]``.
    targets : numpy.ndarray
        float64 prefix sums, ``0 <= t < total``.
    out : numpy.ndarray
        int64, ``len(targets)``: receives the leaves.
    """
    n = targets.shape[0]
    top = prefix.shape[0] - 1
    node = out  # each target's node, level by level: its leaf at the end
    t = targets.copy()
    # Branch-free steps (selects, not jumps): a descent goes its own way at random, and
    # mispredicted branches cost more than the loads.
    for i in range(n):  # level 0: how many of prefix[1:top] are <= t (a binary search)
        lo = 0
        m = top - 1
        x = t[i]
        while m > 0:
            half = m >> 1
            go = prefix[1 + lo + half] <= x
            lo = lo + half + 1 if go else lo
            m = m - half - 1 if go else half
        t[i] = x - prefix[lo]
        node[i] = lo
        # numba's stubs type an intrinsic's __call__ with the typing context as its first argument
        _prefetch(tree, starts[1] + (lo << 3))  # type: ignore[call-arg]
    # Level by level over all targets, each target's next line (its node's 8 children)
    # prefetched as soon as the node is known, so it is in cache a pass over the batch later
    # (at 10M leaves the lowest levels and the leaves miss DRAM).
    for j in range(1, depth + 1):
        base = starts[j]
        below = starts[j + 1] if j < depth else base
        for i in range(n):
            # the child: three binary steps over the 8 children, by the same pairwise sums a
            # node's value is made of (a half, then a pair, then one child)
            first = base + (node[i] << 3)
            x = t[i]
            s01 = tree[first] + tree[first + 1]
            s23 = tree[first + 2] + tree[first + 3]
            s45 = tree[first + 4] + tree[first + 5]
            half = s01 + s23
            go = x >= half
            x -= half if go else 0.0  # x - 0.0 is x: the same values as numpy's masked subtract
            k = np.int64(go) << 2
            pair = s45 if go else s01
            go = x >= pair
            x -= pair if go else 0.0
            k += np.int64(go) << 1
            one = tree[first + k]
            go = x >= one
            x -= one if go else 0.0
            k += go
            t[i] = x
            node[i] = (node[i] << 3) + k
            if j < depth:
                # numba's stubs type an intrinsic's __call__ with the typing context as its first argument
                _prefetch(tree, below + (node[i] << 3))  # type: ignore[call-arg]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def set_sparse(tree: np.ndarray, starts: np.ndarray, depth: int, size: int, leaves: np.ndarray,
               values: np.ndarray) -> None:
    """Set leaves (the last write wins) and recompute their ancestors, level by level.

    Parameters
    ----------
    tree : numpy.ndarray
        The tree's float64 array (every level).
    starts : numpy.ndarray
        Where each level starts in ``tree``; the last entry is its length.
    depth : int
        The leaves' level.
    size : int
        The number of leaves.
    leaves : numpy.ndarray
        int64 leaf indices.
    values : numpy.ndarray
        float64 value per leaf.

    Raises
    ------
    IndexError
        A leaf index outside ``[0, size)``; nothing was written.
    """
    n = leaves.shape[0]
    for i in range(n):
        if leaves[i] < 0 or leaves[i] >= size:
            raise IndexError("SumTree.set: leaf index out of range")
    base = starts[depth]
    for i in range(n):
        tree[base + leaves[i]] = values[i]
    nodes = leaves.copy()
    for j in range(depth - 1, -1, -1):
        children = starts[j + 1]
        base = starts[j]
        for i in range(n):
            parent = nodes[i] >> 3
            b = children + (parent << 3)
            tree[base + parent] = (((tree[b] + tree[b + 1]) + (tree[b + 2] + tree[b + 3]))
                                   + ((tree[b + 4] + tree[b + 5]) + (tree[b + 6] + tree[b + 7])))
            nodes[i] = parent
