"""Progress bars of the long commands: drawn on a terminal, silent in a pipe and with ``--quiet``.

The real console script runs in a subprocess whose stderr is the slave end of a pseudo-terminal
(``pty.openpty()``) or a pipe; copy, vacuum, export, import, verify, stats and report each draw
their bar on the terminal only, and ``--quiet`` (after the command, or before it) turns it off
there too. The Python functions' ``progress=True`` stays silent where stderr is not a terminal.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replaystore.schemas import dqn
from replaystore.store import open_store
from replaystore.store.format import layout
from replaystore.store.maintenance import vacuum as vacuum_module
from replaystore.store.maintenance.compaction import COMPACT_FANIN
from replaystore.tools.copy import copy_store
from replaystore.tools.export import export_store
from support.batches import dqn_batch
from support.storecheck import Backend
from support.tty import run_cli


def _garbage_store(url: str) -> int:
    """A store whose writer compacted its fragments (the originals are garbage) and a crashed
    commit's fragment; returns the garbage units."""
    b = Backend(url)
    st = b.open_fragments(dqn(16, 2, actions=9))
    rng = np.random.default_rng(1)
    with st.writer() as w:
        for i in range(COMPACT_FANIN):
            w.append(dqn_batch(rng, 4, extra=0), stream=i % 2)
            w.commit()
    storage = b.storage()
    src = layout.fragment_dir(0, "records", layout.fragment_name(0))
    orphan = layout.fragment_dir(0, "records", layout.fragment_name(50))
    for o in storage.walk(src):
        storage.write(orphan + o.path[len(src):], storage.read(o.path))
    removed = {n for c in st.commits() if c["kind"] == "compact" for change in c["tables"].values()
               for n in change["remove"]}
    return len(removed) + 1


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = str(tmp_path / "store")
    assert _garbage_store(url) > 2
    return url


# command -> (its arguments given the store and a fresh path, the bar's label, what stdout's last line starts with)
COMMANDS = {
    "verify": (lambda url, fresh: ["verify", url], "verify", "ok:"),
    "copy": (lambda url, fresh: ["copy", url, fresh], "copy", "copied "),
    "vacuum": (lambda url, fresh: ["vacuum", url, "--older-than", "0"], "vacuum", "deleted "),
    "export": (lambda url, fresh: ["export", url, fresh, "--to", "parquet"], "export parquet", "exported "),
    "export-d4rl": (lambda url, fresh: ["export", url, fresh + ".h5", "--to", "d4rl"], "export d4rl", "exported "),
    "import": (lambda url, fresh: ["import", url + "-parquet", fresh, "--from", "parquet"], "import parquet",
               "imported "),
    "stats": (lambda url, fresh: ["stats", url], "stats", "}"),  # (the JSON document on stdout)
    "report": (lambda url, fresh: ["report", url, "-o", fresh + ".html"], "report", "wrote "),
}


def _prepare(command: str, url: str) -> None:
    if command == "import":  # an export to import
        export_store(open_store(url, mode="r"), url + "-parquet", "parquet")


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_bar_on_a_terminal(command: str, store: str, tmp_path: Path) -> None:
    args, label, last = COMMANDS[command]
    _prepare(command, store)
    r = run_cli(*args(store, str(tmp_path / "fresh")), tty=True)
    assert r.returncode == 0, r.stderr
    assert f"{label}: " in r.stderr, r.stderr  # tqdm's "label:  40%|####  | 2/5 ..." on the terminal
    assert "\r" in r.stderr  # redrawn in place
    assert r.stdout.splitlines()[-1].startswith(last), r.stdout
    assert f"{label}: " not in r.stdout and "%|" not in r.stdout  # the bar never goes to stdout


@pytest.mark.parametrize("command", list(COMMANDS))
def test_nothing_in_a_pipe(command: str, store: str, tmp_path: Path) -> None:
    args, _, last = COMMANDS[command]
    _prepare(command, store)
    r = run_cli(*args(store, str(tmp_path / "fresh")), tty=False)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout.splitlines()[-1].startswith(last), r.stdout


@pytest.mark.parametrize("where", ["after", "before"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_quiet_silences_the_bar_on_a_terminal(command: str, where: str, store: str, tmp_path: Path) -> None:
    args, label, last = COMMANDS[command]
    _prepare(command, store)
    argv = args(store, str(tmp_path / "fresh"))
    argv = [*argv, "--quiet"] if where == "after" else ["--quiet", *argv]
    r = run_cli(*argv, tty=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr
    assert r.stdout.splitlines()[-1].startswith(last), r.stdout


def test_vacuum_reports_progress_per_batch_of_units(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deletes go in requests of whole units, at most DELETE_BATCH objects each; progress counts the units
    deleted after each request, up to all of them."""
    url = str(tmp_path / "store")
    units = _garbage_store(url)
    st = open_store(url, mode="a")
    sizes = {len(u.objects) for u in vacuum_module.find_garbage(st, 0, 2).deleted}
    assert len(sizes) == 1  # every unit the same size here: n objects
    (n,) = sizes
    monkeypatch.setattr(vacuum_module, "DELETE_BATCH", 2 * n + 1)  # two units a request
    requests: list[int] = []
    delete_objects = st.storage.delete_objects
    monkeypatch.setattr(st.storage, "delete_objects", lambda paths: (requests.append(len(paths)),
                                                                     delete_objects(paths))[1])
    calls: list[tuple[int, int]] = []
    report = vacuum_module.vacuum(st, 0, progress=lambda done, total: calls.append((done, total)))
    assert len(report.deleted) == units
    assert requests == [2 * n] * (units // 2) + [n] * (units % 2)
    assert calls == [(0, units)] + [(min(units, 2 * i), units) for i in range(1, len(requests) + 1)]
    assert not any(st.storage.walk(u.path) for u in report.deleted)
    assert vacuum_module.vacuum(st, 0).deleted == []


def test_the_python_functions_are_silent_off_a_terminal(store: str, tmp_path: Path,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    copy_store(store, str(tmp_path / "copy"), progress=True)
    open_store(store, mode="a").vacuum(older_than_s=0, progress=True)
    export_store(open_store(store, mode="r"), str(tmp_path / "pq"), "parquet", progress=True)
    assert capfd.readouterr().err == ""
