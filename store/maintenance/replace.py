"""Replacing a store (``open_store(mode="w+")``): the claim protocol of docs/FORMAT.md, "Replacing a store".

Of several openers replacing the same store at once, exactly one deletes it: the one whose
create-if-absent of the replace claim for the current manifest succeeds; the others raise
:class:`StoreReplacedError` having deleted nothing. A location holding objects but no
replaystore manifest is refused with :class:`NotAStoreError`, never deleted.
"""

from __future__ import annotations

import os
import time

from replaystore.errors import CorruptObjectError, NotAStoreError, StoreReplacedError
from replaystore.store.format import layout, records
from replaystore.store.format.generations import claim_name, is_claim
from replaystore.store.storage import Storage


def clear_for_create(storage: Storage) -> None:
    """Make the location ready for a new manifest: delete the store there, if any.

    Absent or empty (or holding only replace claims): nothing to do. A
    replaystore store: claim it (create-if-absent of :func:`claim_name` of its
    manifest), then delete every object under the root but the claim, the
    manifest last. Local filesystems: a symbolic link inside the store is
    removed, never followed; a store root that is a link is replaced in the
    directory it points to (the link and that directory stay). Cost: one read,
    one create, then one listing and the deletes (S3: one request per 1000
    objects per top-level name).

    Parameters
    ----------
    storage : Storage
        The location's storage.

    Raises
    ------
    NotAStoreError
        Objects are there but no replaystore manifest (nothing deleted).
    StoreReplacedError
        Another opener holds the claim: it is replacing this store, or replaced
        it since this call read the manifest (nothing deleted).
    StorageError
        The storage lacks create-if-absent (nothing deleted).
    """
    storage.check_create()  # refuse before deleting anything, not after
    try:
        old = storage.read(layout.MANIFEST)
    except (FileNotFoundError, IsADirectoryError):
        old = None
    if old is None:
        others = [n for n in storage.list("") if not is_claim(n)]
        if others:
            raise NotAStoreError(f"{storage.url}: mode 'w+' replaces only a replaystore store, and this location "
                                 f"holds {len(others)} other entries (e.g. {others[0]!r}) but no "
                                 f"{layout.MANIFEST}; nothing was deleted")
        return
    try:
        body = records.decode(layout.MANIFEST, old)
    except CorruptObjectError as exc:
        raise NotAStoreError(f"{storage.url}: mode 'w+' replaces only a replaystore store; {layout.MANIFEST} "
                             f"does not read as one ({exc}); nothing was deleted") from None
    if body.get("format") != layout.FORMAT_NAME:
        raise NotAStoreError(f"{storage.url}: mode 'w+' replaces only a replaystore store; {layout.MANIFEST} "
                             f"has format {body.get('format')!r}; nothing was deleted")
    claim = claim_name(old)
    doc = {"replacing": claim, "host": os.uname().nodename, "pid": os.getpid(), "time_ns": time.time_ns()}
    if not storage.create(claim, records.encode(doc)):
        raise StoreReplacedError(f"{storage.url}: another opener is replacing this store (mode 'w+'), or "
                                 "replaced it since it was read; nothing was deleted")
    for name in storage.list(""):
        if name not in (claim, layout.MANIFEST):
            storage.delete(name)
    storage.delete(layout.MANIFEST)  # last: until now the location still reads as the old store
