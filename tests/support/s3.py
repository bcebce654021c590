"""A real S3-API server (moto's ``moto_server``) on loopback, for the S3 backend tests.

``moto_s3()`` runs the one loopback starter of the package, ``replaystore.tools.s3local``
(``moto_server`` as a subprocess on a free port of 127.0.0.1, a bounded readiness poll, a
bucket, the server's request log in a file), and yields the fsspec ``storage_options``
that reach it plus helpers for the tests. The server is stopped when the context exits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from replaystore.tools.s3local import REGION, loopback_s3

KEY = "testing"
SECRET = "testing"


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


@contextlib.contextmanager
def moto_s3(bucket: str = "replaystore-tests") -> Iterator[S3Server]:
    """Run a moto S3 server on loopback for the duration of the context."""
    with loopback_s3(bucket) as s3:
        yield S3Server(s3.endpoint_url, s3.bucket, s3.storage_options)
