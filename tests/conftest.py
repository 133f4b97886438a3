"""Shared fixtures: an isolated SHARDPORT_HOME, S3 servers on 127.0.0.1, stores on every backend."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from servers import S3Server, start_moto, start_seaweedfs
from support import make_checkpoint


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh $SHARDPORT_HOME for one test."""
    h = tmp_path / "home"
    monkeypatch.setenv("SHARDPORT_HOME", str(h))
    monkeypatch.delenv("SHARDPORT_STORE", raising=False)
    return h


@pytest.fixture(scope="session")
def moto_server() -> Iterator[S3Server]:
    server = start_moto()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def seaweed_server() -> Iterator[S3Server]:
    server = start_seaweedfs()
    yield server
    server.stop()


def _use_s3(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    return f"s3://{server.new_bucket()}/registry"


@pytest.fixture(
    params=[
        "local",
        pytest.param("moto", marks=pytest.mark.s3),
        pytest.param("seaweedfs", marks=[pytest.mark.s3, pytest.mark.slow]),
    ]
)
def store_url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh, empty store on every backend: a local folder, moto, SeaweedFS."""
    if request.param == "local":
        return str(tmp_path / "store")
    server = request.getfixturevalue(f"{'moto' if request.param == 'moto' else 'seaweed'}_server")
    return _use_s3(server, monkeypatch)


@pytest.fixture
def fast_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A local store, for tests whose logic does not depend on the backend."""
    return str(tmp_path / "store")


@pytest.fixture
def moto_store_url(moto_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    return _use_s3(moto_server, monkeypatch)


@pytest.fixture
def seaweed_store_url(seaweed_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    return _use_s3(seaweed_server, monkeypatch)


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return make_checkpoint(tmp_path / "ckpt")


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
