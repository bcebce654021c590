"""A loopback S3 endpoint for examples and benchmarks: moto's S3 server on 127.0.0.1.

``with loopback_s3() as s3: open_store(s3.url("replay"), schema, storage_options=s3.storage_options)``
starts ``moto_server`` as a subprocess on a free port of 127.0.0.1 (never another
interface), waits (bounded) until it answers, creates the bucket and stops the server on
exit. It needs ``pip install 'moto[server]'`` (part of the ``test`` extra). Against a real
endpoint, :func:`s3_options` builds the same ``storage_options`` for s3fs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

REGION = "us-east-1"
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 30.0


def s3_options(endpoint_url: str | None = None, key: str | None = None, secret: str | None = None,
               region: str = REGION) -> dict[str, Any]:
    """s3fs ``storage_options`` for an endpoint (credentials default to s3fs's usual lookup).

    Parameters
    ----------
    endpoint_url : str, optional
        The S3 endpoint (default: AWS).
    key : str, optional
        Access key id.
    secret : str, optional
        Secret access key.
    region : str, optional
        Region name.

    Returns
    -------
    dict of str to Any
        The options.
    """
    options: dict[str, Any] = {"client_kwargs": {"region_name": region}}
    if endpoint_url:
        options["client_kwargs"]["endpoint_url"] = endpoint_url
    if key is not None:
        options["key"] = key
    if secret is not None:
        options["secret"] = secret
    return options


@dataclass(frozen=True)
class LoopbackS3:
    """A running loopback S3 server, as :func:`loopback_s3` yields it.

    Attributes
    ----------
    endpoint_url : str
        ``http://127.0.0.1:<port>``.
    bucket : str
        A bucket created on it.
    storage_options : dict of str to Any
        s3fs options for the endpoint, with its test credentials.
    pid : int, optional
        The server process (for CPU accounting in benchmarks).
    """

    endpoint_url: str
    bucket: str
    storage_options: dict[str, Any]
    pid: int | None = None  # the server process (for CPU accounting in benchmarks)

    def url(self, prefix: str) -> str:
        """The ``s3://`` URL of ``prefix`` in the bucket.

        Parameters
        ----------
        prefix : str
            A key prefix (a store's location).

        Returns
        -------
        str
            ``s3://<bucket>/<prefix>``.
        """
        return f"s3://{self.bucket}/{prefix}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True  # it answered, if with an error status
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def loopback_s3(bucket: str = "replaystore", attempts: int = 3) -> Iterator[LoopbackS3]:
    """Run a moto S3 server on 127.0.0.1 for the duration of the context (see the module docstring).

    Starting it costs a few seconds (a subprocess, polled until it answers).

    Parameters
    ----------
    bucket : str, optional
        The bucket to create.
    attempts : int, optional
        Ports to try (one may be taken between choosing and binding it).

    Yields
    ------
    LoopbackS3
        The server; stopped when the context exits.

    Raises
    ------
    ImportError
        moto is not installed.
    RuntimeError
        The server did not start.
    """
    try:
        import boto3
    except ImportError as exc:  # pragma: no cover - moto[server] pulls boto3 in
        raise ImportError("a loopback S3 server needs moto: pip install 'moto[server]'") from exc
    exe = shutil.which("moto_server")
    cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": REGION}
    # the server logs every request: into a file, never into a pipe nobody drains (it would block)
    with tempfile.TemporaryFile(prefix="moto-") as log:
        proc = None
        for attempt in range(attempts):
            port = _free_port()
            endpoint = f"http://{LOOPBACK}:{port}"
            proc = subprocess.Popen([*cmd, "-H", LOOPBACK, "-p", str(port)], stdout=log, stderr=subprocess.STDOUT,
                                    env=env)
            deadline = time.monotonic() + START_TIMEOUT_S
            delay = 0.02
            while not _answers(endpoint) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(delay)  # bounded readiness poll
                delay = min(2 * delay, 0.25)
            if proc.poll() is None and _answers(endpoint):
                break
            _stop(proc)  # the port was taken in between, or it failed: try another port
            if attempt == attempts - 1:
                log.seek(0)
                raise RuntimeError(f"moto_server did not start on {endpoint}:\n"
                                   f"{log.read()[-4000:].decode(errors='replace')}")
        assert proc is not None
        try:
            options = s3_options(endpoint, key="testing", secret="testing")
            boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing",
                         aws_secret_access_key="testing").create_bucket(Bucket=bucket)
            yield LoopbackS3(endpoint, bucket, options, proc.pid)
        finally:
            _stop(proc)
