"""A real S3-API server (moto's ``moto_server``) on loopback, for the S3 backend tests.

``moto_s3()`` starts the server as a subprocess on a free port of 127.0.0.1, polls
it (bounded) until it answers, creates a bucket and yields the fsspec
``storage_options`` that reach it. The server is terminated when the context exits.
"""

from __future__ import annotations

import contextlib
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
KEY = "testing"
SECRET = "testing"
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    bucket: str
    storage_options: dict[str, Any]

    def url(self, prefix: str) -> str:
        """A URL under the shared bucket."""
        return f"s3://{self.bucket}/{prefix}"

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name=REGION,
                            aws_access_key_id=KEY, aws_secret_access_key=SECRET)

    def delete_prefix(self, bucket: str, prefix: str = "") -> None:
        """Delete every object under ``prefix`` of ``bucket``."""
        client = self.client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys})


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _command(port: int) -> list[str]:
    exe = shutil.which("moto_server")
    if exe is not None:
        return [exe, "-H", "127.0.0.1", "-p", str(port)]
    return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]


def _wait_until_up(proc: subprocess.Popen[bytes], endpoint: str, timeout_s: float, log_path: str) -> None:
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        if proc.poll() is not None:
            with open(log_path, errors="replace") as f:
                out = f.read()[-4000:]
            raise RuntimeError(f"moto_server exited with {proc.returncode} before answering:\n{out}")
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1.0):
                return
        except urllib.error.HTTPError:
            return  # it answered, even if with an error status
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"moto_server at {endpoint} did not answer within {timeout_s} s")
        time.sleep(delay)  # polling back-off, not synchronisation: the loop checks readiness
        delay = min(delay * 2, 0.25)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def moto_s3(bucket: str = "replaystore-tests", attempts: int = 3) -> Iterator[S3Server]:
    """Run a moto S3 server on loopback for the duration of the context.

    The port is picked free just before the server binds it; should another process take it
    in between, the server exits and the next attempt uses a new port.
    """
    import boto3

    # The server logs every request: to a file, never to an unread pipe (which would fill up
    # and stall the server mid-test).
    with tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log") as log:
        for attempt in range(attempts):
            port = free_port()
            endpoint = f"http://127.0.0.1:{port}"
            proc = subprocess.Popen(_command(port), stdout=log, stderr=subprocess.STDOUT)
            try:
                _wait_until_up(proc, endpoint, START_TIMEOUT_S, log.name)
                break
            except RuntimeError:
                _stop(proc)
                if attempt == attempts - 1:
                    raise
        try:
            client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION,
                                  aws_access_key_id=KEY, aws_secret_access_key=SECRET)
            client.create_bucket(Bucket=bucket)
            options = {"key": KEY, "secret": SECRET,
                       "client_kwargs": {"endpoint_url": endpoint, "region_name": REGION}}
            yield S3Server(endpoint, bucket, options)
        finally:
            _stop(proc)
