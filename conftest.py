"""Repository-wide pytest setup: the ``slow`` marker's default deselection (tests/support/slow_selection.py)."""

pytest_plugins = ["support.slow_selection"]
