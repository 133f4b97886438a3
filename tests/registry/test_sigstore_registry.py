"""Sigstore through the registry: keyless push fails cleanly offline; bundles verify offline."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from support import Cli, make_checkpoint

from shardport.registry.session import Session
from shardport.registry.trust.signatures import attach_sigstore_bundle

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "sigstore"
DSSE_IDENTITY = "https://github.com/prefix-dev/sigstore-example/.github/workflows/action.yaml@refs/heads/main"
DSSE_ISSUER = "https://token.actions.githubusercontent.com"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path) -> Cli:
    return Cli(capsys, str(tmp_path / "store"))


def test_keyless_push_offline_fails_before_writing(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("SIGSTORE_ID_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_URL", "ACTIONS_ID_TOKEN_REQUEST_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    cli.ok("keygen")
    t = time.monotonic()
    code, out = cli("push", make_checkpoint(tmp_path / "c"), "acme/m:v1", "--sign", "sigstore")
    assert time.monotonic() - t < 60
    assert code == 6 and out["error"]["type"] == "SigstoreUnavailableError", out
    assert "registry keygen" in out["error"]["message"]
    assert Session.open(cli.store).store.walk("blobs") == []


def _policy(home: Path, identity: str) -> None:
    root = home / "production-trusted_root.json"
    shutil.copy(VECTORS / "production-trusted_root.json", root)
    doc = {
        "version": 1,
        "keys": [],
        "sigstore": [{"identity": identity, "issuer": DSSE_ISSUER, "trusted_root": root.name}],
    }
    (home / "trust.json").write_text(json.dumps(doc))


def test_sigstore_bundle_verified_offline_then_subject_checked(cli: Cli, tmp_path: Path, home: Path) -> None:
    digest = cli.ok("push", make_checkpoint(tmp_path / "c"), "acme/m:v1", "--allow-unsigned")["digest"]
    session = Session.open(cli.store)
    attach_sigstore_bundle(
        session, "acme/m", digest, (VECTORS / "dsse_v001_bundle.sigstore.json").read_bytes()
    )
    _policy(home, DSSE_IDENTITY)
    # The bundle verifies against the production trusted root (certificate, log entry, signature),
    # but it signs a conda package, not this manifest: refused for that reason.
    code, out = cli("pull", f"acme/m@{digest}", tmp_path / "d")
    assert code == 1 and out["error"]["type"] == "SignatureError", out
    assert f"does not sign manifest {digest}" in out["error"]["message"]
    _policy(home, "https://github.com/someone/else")
    code, out = cli("pull", f"acme/m@{digest}", tmp_path / "d")
    assert code == 1 and "does not verify" in out["error"]["message"], out
    assert not (tmp_path / "d").exists()
