"""Sampler state slots: where each saved sampler stands, and a prioritized sampler's priorities.

A sampler's ``save()`` keeps its ``state_dict()`` in the state slot named after it (docs/GUIDE.md,
"Resume a run"): the JSON document holds ``kind``, ``seed``, ``batches_drawn`` and the
``hyperparameters``, the arrays its large parts. What the report shows of each kind:

- every sampler: its kind, the slot's version and size, minibatches drawn, the hyperparameters,
  and ``rate_limit_samples`` when it was rate limited;
- ``prioritized``: ``alpha``, ``beta``, ``eps``, ``max_priority``, the rows it tracks (leaves
  of ``tree_leaves`` above zero) and a histogram of their priorities (the leaves are
  ``priority ** alpha``; shown as priorities, ``leaf ** (1 / alpha)``);
- ``epoch``: the pass (``epoch``), the rows taken of the pass (``taken`` of ``pass_check[0]``),
  or, for a pass that departed from its seed, the rows left (``rest``);
- ``reservoir``: ``capacity``, the records offered (``seen``) and the members kept;
- ``sequence`` and ``uniform``: the base state only (their position is the RNG's).

A slot that holds no sampler's state (a model checkpoint saved with ``Store.save_state``) is
listed with its document's keys and its arrays' shapes.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from replaystore.report import plots
from replaystore.report.markup import esc, note, num, size
from replaystore.store import Store

MAX_SLOTS = 20
"""The sampler section shows at most this many state slots (in name order)."""
SAMPLER_KINDS = ("uniform", "prioritized", "epoch", "sequence", "reservoir")
"""The ``kind`` a saved sampler state names (``Sampler.kind``)."""


def _json(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return esc(text if len(text) <= limit else text[:limit] + "…")


def position(doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[tuple[str, str]]:
    """Where a saved sampler stands: its documented position fields, as (name, markup) pairs.

    Parameters
    ----------
    doc : dict
        The state document (``Store.load_state(slot)[0]``).
    arrays : dict of str to numpy.ndarray
        The state's arrays.

    Returns
    -------
    list of tuple of str
        Name and value, in the order shown.
    """
    kind = doc.get("kind")
    rows = [("kind", esc(kind)), ("seed", num(doc.get("seed"))), ("minibatches drawn", num(doc.get("batches_drawn")))]
    if kind == "prioritized":
        leaves = np.asarray(arrays.get("tree_leaves", np.zeros(0)))
        rows += [("alpha", num(doc.get("alpha"))), ("beta", num(doc.get("beta"))), ("eps", num(doc.get("eps"))),
                 ("max priority", num(doc.get("max_priority"))),
                 ("rows tracked", num(int(np.count_nonzero(leaves > 0))))]
    elif kind == "epoch":
        rows.append(("pass (epoch)", num(doc.get("epoch"))))
        if "pass_check" in doc or "pass_check" in arrays:
            total = int(np.asarray(doc.get("pass_check", arrays.get("pass_check")))[0])
            taken = int(doc.get("taken", 0))
            share = f" ({100 * taken / total:.1f}%)" if total else ""
            rows.append(("rows taken of this pass", f"{num(taken)} of {num(total)}{share}"))
        elif "rest" in arrays:
            rows.append(("rows left in this pass", num(len(arrays["rest"]))))
        else:
            rows.append(("rows taken of this pass", "no pass in progress"))
        rows.append(("drop_last", esc(doc.get("drop_last"))))
    elif kind == "reservoir":
        rows += [("capacity", num(doc.get("capacity"))), ("records offered", num(doc.get("seen"))),
                 ("members", num(len(arrays.get("members", np.zeros(0)))))]
    if "rate_limit_samples" in doc:
        rows.append(("samples counted by its rate limiter", num(doc["rate_limit_samples"])))
    if "her" in doc:
        rows.append(("hindsight relabelling state", _json(doc["her"])))
    rows.append(("hyperparameters", _json(doc.get("hyperparameters", {}))))
    return rows


def priorities(doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The priorities a prioritized sampler's state holds for the rows it tracks.

    Parameters
    ----------
    doc : dict
        The state document (its ``alpha``).
    arrays : dict of str to numpy.ndarray
        The state's arrays (``tree_leaves``: ``priority ** alpha``, zero for free slots).

    Returns
    -------
    numpy.ndarray
        float64 priorities (``leaf ** (1 / alpha)``; the leaves themselves for ``alpha = 0``).
    """
    leaves = np.asarray(arrays.get("tree_leaves", np.zeros(0)), np.float64)
    live = leaves[leaves > 0]
    alpha = float(doc.get("alpha") or 0.0)
    if alpha:
        with np.errstate(under="ignore", over="ignore"):
            return live ** (1.0 / alpha)
    return live


def samplers_html(store: Store, slots: dict[str, dict[str, Any]] | None = None) -> str:
    """The sampler-state section: one block per state slot.

    Parameters
    ----------
    store : Store
        The store.
    slots : dict, optional
        ``Store.state_slots()`` if already listed.

    Returns
    -------
    str
        Per slot (the first :data:`MAX_SLOTS` by name) a ``<div class="slot">`` with a table
        of where it stands, and for a
        prioritized sampler a ``<figure class="plot">`` with the priority histogram; a note
        when the store has no state slots.

    Notes
    -----
    Cost: one load of each slot's newest version (its document and arrays).
    """
    slots = store.state_slots() if slots is None else slots
    if not slots:
        return note("No state slots: no sampler saved its state in this store (sampler.save(), "
                    "docs/GUIDE.md \"Resume a run\").")
    out = []
    if len(slots) > MAX_SLOTS:
        out.append(note(f"{len(slots):,} state slots: the first {MAX_SLOTS} by name are shown."))
    for slot, meta in sorted(slots.items())[:MAX_SLOTS]:
        loaded = store.load_state(slot)
        head = (f'<h3 class="slot-name">{esc(slot)}</h3><p class="note">version {num(meta["versions"][-1])} of '
                f'{num(len(meta["versions"]))} kept, {esc(size(meta["bytes"]))}</p>')
        if loaded is None:
            out.append(f'<div class="slot" data-slot="{esc(slot)}">{head}'
                       f'{note("No intact version could be read.")}</div>')
            continue
        doc, arrays = loaded
        if doc.get("kind") in SAMPLER_KINDS:
            body = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in position(doc, arrays))
            body = f'<table class="position"><tbody>{body}</tbody></table>'
            if doc["kind"] == "prioritized":
                prios = priorities(doc, arrays)
                fig = plots.histogram(prios, f"priorities of {slot!r} ({len(prios):,} rows)", "priority", log=True)
                body += f'<figure class="plot" data-plot="priorities-{esc(slot)}">{fig}</figure>'
        else:
            keys = ", ".join(sorted(doc))
            arr = ", ".join(f"{k} {a.dtype.name}{list(a.shape)}" for k, a in sorted(arrays.items()))
            body = (f'<table class="position"><tbody><tr><th>document keys</th><td>{esc(keys) or "–"}</td></tr>'
                    f'<tr><th>arrays</th><td>{esc(arr) or "–"}</td></tr></tbody></table>')
        out.append(f'<div class="slot" data-slot="{esc(slot)}">{head}{body}</div>')
    return "".join(out)
