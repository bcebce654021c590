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
    """``_prefetch(array, i)``: ask the CPU to bring the cache line of ``array[i]`` in (LLVM's
    ``llvm.prefetch``, a hint: no fault for any address, no effect on results)."""
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
        builder.call(fn, [builder.bitcast(ptr, byte_ptr), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.void(array, index), codegen


@numba.njit(cache=True, nogil=True, boundscheck=False)
def find(tree: np.ndarray, prefix: np.ndarray, top: int, quads: int, levels: int, targets: np.ndarray,
         out: np.ndarray) -> None:
    """``out[i]``: the leaf whose cumulative range holds ``targets[i]`` (see ``SumTree.find``)."""
    n = targets.shape[0]
    size = quads * 4
    node = np.empty(n, np.int64)
    t = targets.copy()
    # Branch-free steps (selects, not jumps): a descent goes left or right at random, and
    # mispredicted branches cost more than the loads (~30% of the kernel, measured).
    for i in range(n):  # the top level: how many of prefix[1:top] are <= t (a binary search)
        lo = 0
        m = top - 1
        x = t[i]
        while m > 0:
            half = m >> 1
            go = prefix[1 + lo + half] <= x
            lo = lo + half + 1 if go else lo
            m = m - half - 1 if go else half
        t[i] = x - prefix[lo]
        node[i] = lo + top
        _prefetch(tree, node[i] << 1)
    # Level by level over all targets, each target's next line prefetched as soon as its node is
    # known, so it is in cache a pass over the batch later (at 10M leaves the deep levels and
    # the leaves miss DRAM): its children at 2 * node, or below the last level (quad node
    # quads + q) its four leaves at size + 4q = 4 * node.
    for level in range(levels):
        shift = 1 if level < levels - 1 else 2
        for i in range(n):
            child = node[i] << 1
            left = tree[child]
            go = t[i] >= left
            t[i] -= left if go else 0.0  # t - 0.0 is t: the same values as numpy's masked subtract
            node[i] = child + go
            _prefetch(tree, node[i] << shift)
    for i in range(n):  # the quad's leaf: how many of its first three running sums are <= t
        first = (node[i] - quads) << 2
        x = t[i]
        run = tree[size + first]
        k = np.int64(x >= run)
        run += tree[size + first + 1]
        k += x >= run
        run += tree[size + first + 2]
        k += x >= run
        out[i] = first + k


@numba.njit(cache=True, nogil=True, boundscheck=False)
def set_sparse(tree: np.ndarray, size: int, quads: int, top: int, leaves: np.ndarray, values: np.ndarray) -> None:
    """Set leaves (the last write wins) and recompute their ancestors, then the top level whole."""
    n = leaves.shape[0]
    for i in range(n):
        if leaves[i] < 0 or leaves[i] >= size:
            raise IndexError("SumTree.set: leaf index out of range")
    for i in range(n):
        tree[size + leaves[i]] = values[i]
    nodes = np.empty(n, np.int64)
    for i in range(n):
        q = leaves[i] >> 2
        b = size + (q << 2)
        tree[quads + q] = (tree[b] + tree[b + 1]) + (tree[b + 2] + tree[b + 3])
        nodes[i] = quads + q
    lo = quads >> 1
    while lo > top:
        for i in range(n):
            parent = nodes[i] >> 1
            tree[parent] = tree[2 * parent] + tree[2 * parent + 1]
            nodes[i] = parent
        lo >>= 1
    for parent in range(top, 2 * top):
        tree[parent] = tree[2 * parent] + tree[2 * parent + 1]
