"""mypy sees every module: ``.typecheck/replaystore/`` mirrors the package map of pyproject.toml.

mypy cannot read ``[tool.setuptools.package-dir]``, so ``.typecheck/replaystore/`` maps the
package folders to module names with symbolic links (see ``[tool.mypy]``). A package folder
or a core module without its link would silently go unchecked; these tests catch it.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIRROR = ROOT / ".typecheck" / "replaystore"


def _package_dir() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["tool"]["setuptools"]["package-dir"])


def _link_target(link: Path) -> Path:
    assert link.is_symlink(), f"{link.relative_to(ROOT)} is missing or not a symbolic link"
    return (link.parent / os.readlink(link)).resolve()


def test_every_mapped_package_folder_has_its_link() -> None:
    """Each ``replaystore.<name>`` of the package map is a link to its folder."""
    for module, folder in _package_dir().items():
        if module == "replaystore":
            continue
        name = module.removeprefix("replaystore.")
        assert "." not in name, f"{module}: only direct subpackages of replaystore are mapped here"
        link = MIRROR / name
        assert _link_target(link) == (ROOT / folder).resolve(), f"{link.relative_to(ROOT)} -> {folder}/ expected"


def test_every_core_module_has_its_file_link() -> None:
    """Each file of the top-level package's folder (core/) is linked, and nothing else is there."""
    core = ROOT / _package_dir()["replaystore"]
    files = {p.name for p in core.iterdir() if p.is_file() and (p.suffix == ".py" or p.name == "py.typed")}
    assert files, f"no modules found in {core}"
    for name in sorted(files):
        assert _link_target(MIRROR / name) == (core / name).resolve(), f"{name}: link to {core.name}/{name} expected"
    mapped = {m.removeprefix("replaystore.") for m in _package_dir() if m != "replaystore"}
    extra = {p.name for p in MIRROR.iterdir()} - files - mapped
    assert not extra, f"links in {MIRROR.relative_to(ROOT)} that the package map does not have: {sorted(extra)}"
