"""The loopback moto S3 server of the system tests (``support.s3``, one per test that asks)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.s3 import S3Server, moto_s3


@pytest.fixture
def s3_server() -> Iterator[S3Server]:
    with moto_s3("replaystore-system") as server:
        yield server
