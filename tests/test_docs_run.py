"""The user documents' Python examples run as written (tests/support/docsrun.py runs them).

Each document in ``DOCS`` has its ```python blocks run in order, in one fresh interpreter, as a
script in a temporary working directory (``TMPDIR`` and ``HOME`` there too): what the blocks
write lands there, never in the repository. A failure names the document and the line of the
block that failed, with the end of the program's output (the traceback shows document lines).

What runs and what does not (the markers docsrun.py understands):

- a fence whose info string starts with ``python`` (or ``py``, ``python3``) runs; ```bash,
  ```text, ```sql, ```json and bare fences never do (commands, output, other languages);
- ``<!-- docs-run: skip -->`` (an HTML comment, invisible when rendered; a reason may follow
  ``skip``) on the line right before a ```python fence keeps that block from running. Use it
  only for what cannot run (a sketch with ``...`` bodies); every other block runs in CI;
- ``<!-- docs-run: slow -->`` there runs the block only with the slow tests (``CI=true``,
  ``--run-slow``, ``-m``): for a long training that would push a document past a minute or so.
  Later blocks must not need what it defines.

Blocks that start ``spawn``/``forkserver`` processes: the children import the script again and
run only the block that started them (outside ``if __name__ == "__main__":``), so such a block
must define what its workers need itself, as it would in a file of its own.

S3: where a runnable block names ``s3://BUCKET/...``, the test starts the loopback moto server
(tests/support/s3.py), creates each bucket named, and gives the program botocore's standard
variables: ``AWS_ENDPOINT_URL`` (the server), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``. The blocks read the endpoint as a user's code does
(``os.environ.get("AWS_ENDPOINT_URL", ...)``, or botocore by itself).

Every document listed runs in the default selection (about a minute for all of them on a loaded
2-core machine, most of it GUIDE.md); ``python tests/support/docsrun.py docs/GUIDE.md`` runs one
by hand and prints its output and the slowest blocks.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from support import docsrun
from support.slow_selection import runs_slow

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/GUIDE.md", "docs/SCHEMAS.md", "docs/EXPORT.md")
"""The documents whose ```python blocks run, each in one interpreter."""
SHARED = {"docs/GUIDE.md": ("root", "custom", "grid_batch", "st", "replay")}
"""Names a document's later sections rely on: one block binds each, no later block binds it again
(a section that rebinds ``st`` made the SQL examples query its store instead of the guide's)."""
TIMEOUT_S = 1200.0
"""Per document: far above what the slowest takes on a loaded 2-core machine."""


def _user_documents() -> list[Path]:
    return sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


def _untracked() -> set[str]:
    """The repository's untracked files that git does not ignore."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                         text=True, check=False).stdout
    return {line[3:] for line in out.splitlines() if line.startswith("??")}


def _failure(doc: str, result: docsrun.Result) -> str:
    block = result.failed_block
    where = f"the block at {doc}:{block}" if block is not None else f"{doc}, after its last block"
    tail = "\n".join(result.output.splitlines()[-60:])
    return (f"{where} failed (exit {result.returncode}, {result.seconds:.0f} s; "
            f"run it by hand: python tests/support/docsrun.py {doc}):\n{tail}")


@pytest.mark.parametrize("doc", DOCS)
def test_document_examples_run_in_order_in_one_interpreter(doc: str, tmp_path: Path,
                                                           request: pytest.FixtureRequest) -> None:
    path = ROOT / doc
    slow = runs_slow(request.config)
    runnable = docsrun.runnable(path.read_text(encoding="utf-8"), slow=slow)
    assert runnable, f"{doc} has no ```python block to run"
    before = _untracked()
    with docsrun.s3_for([b.source for b in runnable]) as env:
        result = docsrun.run(path, ROOT, tmp_path, env=env, timeout=TIMEOUT_S, slow=slow)
    assert result.returncode == 0, _failure(doc, result)
    assert not (result.cwd / "~").exists(), f"{doc}'s examples made a directory named '~' (not the home directory)"
    assert result.started == [b.line for b in runnable], (
        f"{doc}: blocks started {result.started}, expected {[b.line for b in runnable]}")
    assert _untracked() == before, f"{doc}'s examples wrote into the repository: {_untracked() - before}"


def _module_level_bindings(source: str) -> set[str]:
    """The names a block binds at module level (also under ``if``/``with``/``for``/``try``), not inside defs."""
    bound: set[str] = set()

    def targets(node: ast.AST) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                bound.add(sub.id)

    def visit(statements: list[ast.stmt]) -> None:
        for stmt in statements:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(stmt.name)
                continue  # what a def binds inside is its own
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in stmt.names)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                    targets(target)
            elif isinstance(stmt, (ast.For, ast.AsyncFor)):
                targets(stmt.target)
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                for item in stmt.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
            for field in ("body", "orelse", "finalbody"):
                visit(getattr(stmt, field, []))
            for handler in getattr(stmt, "handlers", []):
                visit(handler.body)

    visit(ast.parse(source).body)
    return bound


@pytest.mark.parametrize("doc", sorted(SHARED))
def test_shared_names_are_bound_by_one_block(doc: str) -> None:
    binders = {name: [b.line for b in docsrun.runnable((ROOT / doc).read_text(encoding="utf-8"))
                      if name in _module_level_bindings(b.source)] for name in SHARED[doc]}
    rebound = {name: lines for name, lines in binders.items() if len(lines) != 1}
    assert not rebound, (f"{doc}: later sections use these names as the guide's first sections bind them; "
                         f"give other stores (values) names of their own (name: lines of the blocks binding it): "
                         f"{rebound}")


def test_every_user_document_with_runnable_python_is_run() -> None:
    """A document not in DOCS holds no ```python block unless it is marked ``docs-run: skip``."""
    unrun = {p.relative_to(ROOT).as_posix(): [b.line for b in docsrun.runnable(p.read_text(encoding="utf-8"))]
             for p in _user_documents() if p.relative_to(ROOT).as_posix() not in DOCS}
    assert not {doc: lines for doc, lines in unrun.items() if lines}, (
        "these ```python blocks are never run: add the document to DOCS in tests/test_docs_run.py, fence the "
        "block as ```text, or mark it <!-- docs-run: skip -->")


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


RUNNER_DOC = [
    "# A document",
    "```python",
    "x = 1",
    "```",
    "```bash",
    "exit 3",
    "```",
    "<!-- docs-run: skip (a sketch) -->",
    "```python",
    "raise SystemExit('skipped blocks never run')",
    "```",
    "- a list item",
    "  ```python",
    "  assert x == 1",
    "  y = x + 1",
    "  ```",
    "<!-- docs-run: slow -->",
    "```python",
    "open('slow.txt', 'w').write('ran')",
    "```",
    "```python",
    "assert y == 2",
    "1 / 0",
    "```",
]


@pytest.mark.parametrize("slow", [True, False])
def test_the_runner_names_the_failing_block_and_shares_one_interpreter(tmp_path: Path, slow: bool) -> None:
    """The runner itself: blocks share globals, a failure names its line, other fences and skipped blocks never
    run, slow blocks run only when asked, and relative paths land in the program's working directory."""
    doc = _write(tmp_path / "doc.md", RUNNER_DOC)
    found = docsrun.blocks(doc.read_text(encoding="utf-8"))
    assert [(b.line, b.language, b.runs, b.slow) for b in found] == [
        (2, "python", True, False), (5, "bash", False, False), (9, "python", False, False),
        (13, "python", True, False), (18, "python", True, True), (21, "python", True, False)]
    work = tmp_path / "work"
    work.mkdir()
    result = docsrun.run(doc, tmp_path, work, timeout=120, slow=slow)
    assert result.returncode == 1
    assert result.started == ([2, 13, 18, 21] if slow else [2, 13, 21]) and result.failed_block == 21
    assert (result.cwd / "slow.txt").exists() == slow
    assert 'File "doc.md", line 23' in result.output and "1 / 0" in result.output, result.output
    assert "ZeroDivisionError" in result.output
    assert "skipped blocks never run" not in result.output


def test_a_program_past_its_time_is_killed_and_says_so(tmp_path: Path) -> None:
    doc = _write(tmp_path / "doc.md", ["```python", "import time", "time.sleep(600)", "```"])
    work = tmp_path / "work"
    work.mkdir()
    result = docsrun.run(doc, tmp_path, work, timeout=3)
    assert result.returncode != 0 and "docs-run: killed after 3 s" in result.output
    assert result.seconds < 60


def test_a_block_that_spawns_runs_alone_in_its_children(tmp_path: Path) -> None:
    """A ``spawn`` child imports the program again and runs only the block that started it."""
    doc = _write(tmp_path / "doc.md", [
        "```python",
        "import os",
        "print('first block in', os.getpid())",
        "```",
        "```python",
        "import multiprocessing as mp",
        "",
        "def square(x):",
        "    return x * x",
        "",
        "if __name__ == '__main__':",
        "    with mp.get_context('spawn').Pool(1) as pool:",
        "        assert pool.map(square, [1, 2, 3]) == [1, 4, 9]",
        "```",
    ])
    work = tmp_path / "work"
    work.mkdir()
    result = docsrun.run(doc, tmp_path, work, timeout=120)
    assert result.returncode == 0, result.output
    assert result.output.count("first block in") == 1, result.output
