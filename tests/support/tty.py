"""Run the real ``replaystore`` command with its stderr on a pseudo-terminal (or a pipe) and collect both.

A progress bar is drawn only where stderr is a terminal: ``run_cli(..., tty=True)`` gives the
child the slave end of ``pty.openpty()`` as its stderr (a terminal 100 columns wide) and reads
the master end in a thread while it runs, so a child that writes more than the terminal's
buffer holds never blocks.
"""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import termios
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Run:
    """A finished command: its exit code, stdout and stderr (what the terminal received, when on one)."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, tty: bool, timeout: float = 300) -> Run:
    """Run ``replaystore ARGS`` with stderr on a pseudo-terminal (``tty=True``) or a pipe."""
    if not tty:
        r = subprocess.run(["replaystore", *args], capture_output=True, text=True, timeout=timeout, check=False)
        return Run(r.returncode, r.stdout, r.stderr)
    main, sub = pty.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: every slave end is closed (the child exited)
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc = subprocess.run(["replaystore", *args], stdout=subprocess.PIPE, stderr=sub, timeout=timeout,
                              check=False)
    finally:
        os.close(sub)
    reader.join(timeout=30)
    os.close(main)
    return Run(proc.returncode, proc.stdout.decode(), b"".join(chunks).decode(errors="replace"))
