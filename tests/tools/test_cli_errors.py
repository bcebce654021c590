"""Operational errors of the ``replaystore`` command: one line on stderr, no traceback, and the
documented exit code of their class (``replaystore.tools.cli.EXIT_CODES``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

from replaystore.schemas import dqn
from replaystore.store import open_store
from replaystore.store.storage import StorageUnavailableError
from replaystore.tools.cli import (
    EXIT_BROKEN_PIPE,
    EXIT_CODES,
    EXIT_CORRUPT,
    EXIT_NOT_FOUND,
    EXIT_STORAGE,
    EXIT_USAGE,
    exit_code,
)
from support.batches import dqn_batch
from support.s3 import S3Server, moto_s3
from support.s3proxy import Faults, faulty_s3, options_via

NO_AWS = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SESSION_TOKEN": None,
          "AWS_PROFILE": None, "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
          "AWS_CONFIG_FILE": "/nonexistent/config", "AWS_EC2_METADATA_DISABLED": "true"}
"""An environment with no AWS credentials anywhere (and no instance-metadata lookup)."""


def run(*args: str, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for k, v in (env or {}).items():
        full.pop(k, None) if v is None else full.__setitem__(k, v)
    return subprocess.run([sys.executable, "-m", "replaystore.tools.cli", *args], capture_output=True,
                          text=True, timeout=120, env=full)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def store_url(tmp_path_factory) -> str:
    url = str(tmp_path_factory.mktemp("cli-errors") / "store")
    st = open_store(url, dqn(16, 2, actions=9))
    with st.writer() as w:
        for i in range(3):
            w.append(dqn_batch(np.random.default_rng(i), 2000, extra=0), stream=i)
            w.commit()
    return url


def one_line(r: subprocess.CompletedProcess[str], code: int, needle: str) -> None:
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert needle in r.stderr, r.stderr


def test_a_regular_file_is_not_a_store(tmp_path) -> None:
    path = tmp_path / "afile"
    path.write_text("hello")
    for cmd in ("info", "verify", "vacuum"):
        one_line(run(cmd, str(path)), EXIT_NOT_FOUND, "a file, not a store")
    one_line(run("query", str(path), "SELECT 1"), EXIT_NOT_FOUND, "a file, not a store")
    assert path.read_text() == "hello"


def test_no_store_is_not_found(tmp_path) -> None:
    one_line(run("info", str(tmp_path / "nothing")), EXIT_NOT_FOUND, "no replaystore store here")


@pytest.mark.parametrize("args, needle", [
    (("info", "foo://bucket/x"), "Protocol not known: foo"),
    (("info", "{url}", "--storage-options", "not json"), "--storage-options: expected a JSON object"),
    (("info", "{url}", "--storage-options", "[1, 2]"), "--storage-options: expected a JSON object, got list"),
    (("info", "s3://bucket/x", "--storage-options", '{"anon": true, "no_such_option": 1}'), "no_such_option"),
    (("query", "{url}", ""), "empty query"),
    (("query", "{url}", "SELECT * FROM read_csv('/etc/hostname')"), "disabled by configuration"),
    (("query", "{url}", "SELEC 1"), "syntax error"),
])
def test_usage_mistakes_exit_2(store_url, args, needle) -> None:
    one_line(run(*[a.replace("{url}", store_url) for a in args]), EXIT_USAGE, needle)


def test_missing_s3_credentials_is_a_storage_error() -> None:
    options = json.dumps({"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{closed_port()}"}})
    r = run("info", "s3://bucket/store", "--storage-options", options, env=NO_AWS)
    one_line(r, EXIT_STORAGE, "NoCredentialsError")


def test_unreachable_endpoint_is_a_storage_error() -> None:
    options = json.dumps({"key": "k", "secret": "s", "config_kwargs": {"retries": {"max_attempts": 1}},
                          "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{closed_port()}"}})
    one_line(run("info", "s3://bucket/store", "--storage-options", options), EXIT_STORAGE,
             "Could not connect to the endpoint")


@pytest.mark.parametrize("fmt", ["json", "csv", "parquet"])
def test_unwritable_output_is_a_storage_error(store_url, tmp_path, fmt) -> None:
    for target in (str(tmp_path / "no" / "such" / "dir" / "out"), "/proc/version"):
        r = run("query", store_url, "SELECT row FROM records", "--format", fmt, "-o", target)
        one_line(r, EXIT_STORAGE, "cannot write --output" if fmt == "json" else "")


def test_a_damaged_store_exits_4(tmp_path) -> None:
    url = tmp_path / "store"
    open_store(str(url), dqn(16, 2, actions=9))
    (url / "replaystore.json").write_text('{"body": {}, "crc32c": 1}')
    one_line(run("info", str(url)), EXIT_CORRUPT, "replaystore.json")


@pytest.mark.parametrize("args", [("info", "{url}"), ("query", "{url}", "SELECT * FROM records", "--format", "json")])
def test_a_closed_pipe_ends_quietly(store_url, args) -> None:
    """Output into a pipe whose reader has gone (``| head -1`` once head exits): exit 141, as a
    shell tool killed by SIGPIPE does, with nothing on stderr."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes anything
    try:
        argv = [a.replace("{url}", store_url) for a in args]
        r = subprocess.run([sys.executable, "-m", "replaystore.tools.cli", *argv],
                           stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert r.returncode == EXIT_BROKEN_PIPE, r.stderr
    assert r.stderr == ""


def test_exit_codes_of_plain_os_errors() -> None:
    assert exit_code(PermissionError(13, "Permission denied", "/x")) == EXIT_STORAGE
    assert exit_code(OSError(28, "No space left on device")) == EXIT_STORAGE
    assert exit_code(RuntimeError("a bug")) == 70
    assert set(EXIT_CODES) >= {0, 1, 2, 3, 4, 5, 70, 130, 141}


@pytest.fixture
def s3_server() -> Iterator[S3Server]:
    with moto_s3("replaystore-cli-errors") as server:
        yield server


def test_commit_during_an_s3_outage_raises_oserror(s3_server: S3Server) -> None:
    """The endpoint goes away between append and commit: commit raises an ``OSError`` (the
    documented type), and the store still holds exactly what was committed before."""
    faults = Faults()
    with faulty_s3(s3_server.endpoint_url, faults) as endpoint:
        options = options_via(s3_server.storage_options, endpoint)
        options["config_kwargs"] = {"retries": {"max_attempts": 1}}
        st = open_store(s3_server.url("outage"), dqn(16, 2, actions=9), storage_options=options)
        w = st.writer()
        w.append(dqn_batch(np.random.default_rng(0), 100, extra=0), stream=0)
        w.commit()
        w.append(dqn_batch(np.random.default_rng(1), 100, extra=0), stream=0)
        faults.down = True
        with pytest.raises(OSError) as info:
            w.commit()
        assert isinstance(info.value, StorageUnavailableError), type(info.value)
    back = open_store(s3_server.url("outage"), mode="r", storage_options=s3_server.storage_options)
    assert len(back.default) == 100
