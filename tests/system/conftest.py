"""A moto S3 server on loopback for the system tests.

The server's request log goes to a file: the system tests make thousands of requests,
and a log written into a pipe nobody drains fills it (64 KiB) and blocks the server,
which then stops answering mid-test.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REGION = "us-east-1"
CREDENTIALS = {"key": "testing", "secret": "testing"}
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class S3:
    endpoint_url: str
    bucket: str
    storage_options: dict[str, Any]

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True  # it answered, if with an error status
    except OSError:
        return False


@pytest.fixture
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    import boto3

    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    exe = shutil.which("moto_server")
    cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
    log_path = Path(tmp_path_factory.mktemp("moto")) / "moto.log"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": CREDENTIALS["key"], "AWS_SECRET_ACCESS_KEY": CREDENTIALS["secret"],
           "AWS_DEFAULT_REGION": REGION}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT,
                                env=env)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        delay = 0.02
        while not _answers(endpoint):  # bounded readiness poll
            assert proc.poll() is None, f"moto_server exited ({proc.returncode}):\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"moto_server did not answer within {START_TIMEOUT_S} s"
            time.sleep(delay)
            delay = min(2 * delay, 0.25)
        bucket = "replaystore-system"
        boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=CREDENTIALS["key"],
                     aws_secret_access_key=CREDENTIALS["secret"]).create_bucket(Bucket=bucket)
        options = {**CREDENTIALS, "client_kwargs": {"endpoint_url": endpoint, "region_name": REGION}}
        yield S3(endpoint, bucket, options)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
