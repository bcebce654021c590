"""Backends for the generic store suite: every test taking ``backend`` runs on a local
directory, on ``memory://`` and on S3 (a real moto server on loopback)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import fsspec
import pytest

from support.s3 import S3Server, moto_s3
from support.storecheck import Backend

BACKENDS = ("local", "memory", "s3")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One moto S3 server for the whole session; each test uses its own prefix."""
    with moto_s3() as server:
        yield server


def make_backend(kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Backend:
    tag = uuid.uuid4().hex
    if kind == "local":
        return Backend(str(tmp_path_factory.mktemp("store") / "st"))
    if kind == "memory":
        return Backend(f"memory://rs-{tag}")  # memory:// is process-global: a unique root per test
    server: S3Server = request.getfixturevalue("s3_server")
    return Backend(server.url(f"t-{tag}"), server.storage_options)


def _cleanup(b: Backend, request: pytest.FixtureRequest) -> None:
    if b.kind == "s3":  # keep the shared server's bucket small
        server: S3Server = request.getfixturevalue("s3_server")
        server.delete_prefix(server.bucket, b.url[len(f"s3://{server.bucket}/"):])
    if b.kind == "memory":
        fs = fsspec.filesystem("memory")
        root = b.url[len("memory://"):]
        for path in [p for p in list(fs.store) if p.lstrip("/").startswith(root)]:
            fs.store.pop(path, None)
        for path in [p for p in list(fs.pseudo_dirs) if p.lstrip("/").startswith(root)]:
            fs.pseudo_dirs.remove(path)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    b = make_backend(request.param, request, tmp_path_factory)
    yield b
    _cleanup(b, request)  # siblings (``url-<tag>``) share the prefix and go too


@pytest.fixture(params=("local", "memory"))
def fast_backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """The backends without network round trips, for tests that need hundreds of commits."""
    b = make_backend(request.param, request, tmp_path_factory)
    yield b
    _cleanup(b, request)
