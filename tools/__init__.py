"""The ``replaystore`` command line and the tools behind it."""
