"""Reading a store's manifest, and watching whether the store it names was replaced.

:func:`read_manifest` is how ``open_store`` reads the manifest; :class:`ReplaceWatch` is the
part of a :class:`~replaystore.store.store.Store` handle that answers ``replaced`` and
``check_current`` (docs/FORMAT.md, "Replacing a store").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from replaystore.errors import StoreNotFoundError, StoreReplacedError
from replaystore.store.format import bodies, layout, records
from replaystore.store.format.generations import claim_name, store_generation
from replaystore.store.storage import Storage


def read_manifest(storage: Storage) -> tuple[dict[str, Any], bytes] | None:
    """The manifest's checked body and its bytes as stored; None if there is none."""
    try:
        data = records.read(storage, layout.MANIFEST)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise StoreNotFoundError(f"{storage.url}: a file, not a store directory") from None
    # format and version first (FormatVersionError), then every field (CorruptObjectError)
    return bodies.manifest(storage.url, layout.MANIFEST, records.decode(layout.MANIFEST, data)), data


class ReplaceWatch:
    """Whether the store one handle opened is still the one at its location.

    Parameters
    ----------
    storage : Storage
        The store's storage.
    manifest_bytes : bytes
        The manifest as the handle read it: it names the store's replace claim.
    generation : str
        The store's generation.
    """

    def __init__(self, storage: Storage, manifest_bytes: bytes, generation: str) -> None:
        self.storage = storage
        self.generation = generation
        self.manifest_bytes = manifest_bytes
        self.claim = claim_name(manifest_bytes)  # created by whoever replaces this store
        self.manifest_stat: tuple[int, ...] | None = None  # (local: the manifest file last found current)
        self.manifest_file = storage.local_path(layout.MANIFEST)

    def replaced(self) -> bool:
        """Whether the store this handle opened was replaced (``mode="w+"``), or is being replaced.

        True when the location's manifest is gone or is another store's (another generation),
        or when the store's replace claim exists (an opener is deleting it).

        Returns
        -------
        bool
            True once replaced, or once its replace began.

        Raises
        ------
        CorruptObjectError
            The manifest now there is damaged.
        FormatVersionError
            The manifest now there is not one this replaystore reads.

        Notes
        -----
        Cost: one read of the manifest (parsed only when its bytes differ from the handle's) and
        one of the replace claim, concurrent on object storage; on local disk two ``stat`` calls
        once the manifest file was found current (a new manifest is a new file).
        """
        local = self.manifest_file
        key = None
        if local is not None:
            try:
                st = os.stat(local)
            except (FileNotFoundError, NotADirectoryError):
                return True
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            claimed = os.path.lexists(os.path.join(os.path.dirname(local), self.claim))
            if key == self.manifest_stat or claimed:
                return claimed
        try:
            data, claim = self.storage.read_many([layout.MANIFEST, self.claim])
        except (FileNotFoundError, NotADirectoryError):
            return True
        if data is None or claim is not None:
            return True
        if data == self.manifest_bytes:
            self.manifest_stat = key  # (taken before the read: the file read is that one)
            return False
        body = bodies.manifest(self.storage.url, layout.MANIFEST, records.decode(layout.MANIFEST, data))
        return store_generation(body) != self.generation

    def may_delete(self) -> bool:
        """Whether the handle's writers may delete storage: the store is not replaced (nor unknown)."""
        try:
            return not self.replaced()
        except Exception:  # noqa: BLE001 - (a damaged manifest now: delete nothing; vacuum's)
            return False

    @contextlib.contextmanager
    def as_replaced(self) -> Iterator[None]:
        """Raise :class:`StoreReplacedError` for a failure a replace caused.

        Any error inside, once the store is found replaced: a replace deleted the writer's
        storage under it.
        """
        try:
            yield
        except StoreReplacedError:
            raise
        except Exception as exc:
            try:
                replaced = self.replaced()
            except Exception:  # noqa: BLE001 - (the original error is the one to report)
                replaced = False
            if replaced:
                raise StoreReplacedError(f"{self.storage.url}: the store was replaced (mode 'w+') while this handle "
                                         f"wrote ({exc}); open it again") from exc
            raise

    def check_current(self) -> None:
        """Raise :class:`StoreReplacedError` if the store this handle opened was replaced.

        Writers call it before each commit writes anything, and before they delete
        storage: a replaced store's writer writes nothing more into the new store.

        Raises
        ------
        StoreReplacedError
            The store was replaced (``mode="w+"``) since this handle opened it, or is being
            replaced.
        CorruptObjectError
            The manifest now there is damaged.

        Notes
        -----
        Cost: one read of the manifest (see :meth:`replaced`).
        """
        if self.replaced():
            raise StoreReplacedError(f"{self.storage.url}: the store was replaced (mode 'w+') since this handle "
                                     "opened it; open it again")
