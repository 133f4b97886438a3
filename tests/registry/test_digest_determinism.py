"""A digest names the content: the same files give the same manifest digest on any store, repository,
tag, folder or time; one changed byte gives another. Push time lives in the tag document."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from llama_artifacts import sharded_float as checkpoint
from support import Cli

from shardport.registry.errors import UsageError


@pytest.fixture
def local(capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path) -> Cli:
    c = Cli(capsys, str(tmp_path / "store"))
    c.ok("keygen")
    return c


@pytest.mark.s3
def test_same_files_same_digest_on_two_stores_and_repositories(
    local: Cli, moto_store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = Cli(local.capsys, moto_store_url)
    first = checkpoint(tmp_path / "a")
    copy = tmp_path / "elsewhere" / "b"
    shutil.copytree(first, copy)  # another folder on the same host: same files

    staging = local.ok("push", first, "acme/m:staging")
    assert staging["notes"]  # the total_size note is part of the content, not of the place
    prod = local.ok("push", copy, "acme/prod:v1")
    retag = local.ok("push", first, "acme/m:other")
    mirrored = s3.ok("push", copy, "mirror/m:prod")
    digests = {staging["digest"], prod["digest"], retag["digest"], mirrored["digest"]}
    assert len(digests) == 1, digests
    assert s3.ok("inspect", "mirror/m:prod")["manifest"] == local.ok("inspect", "acme/m:staging")["manifest"]

    # push time lives in the signed tag document, not in the manifest
    info = local.ok("inspect", "acme/m:staging")
    assert info["manifest"]["provenance"]["created_at"] is None
    assert info["versions"][-1]["issued_at"]

    # tiled conversions of the same source are the same artifact too, on both stores
    converted = {
        local.ok("convert", "acme/m:staging", "acme/m-tiled:v1")["digest"],
        local.ok("convert", "acme/prod:v1", "acme/prod-tiled:v1")["digest"],
        s3.ok("convert", "mirror/m:prod", "mirror/m-tiled:v1")["digest"],
    }
    assert len(converted) == 1 and converted.isdisjoint(digests), converted

    # one byte changed: another digest
    changed = tmp_path / "c"
    shutil.copytree(first, changed)
    shard = changed / "model-00002-of-00002.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0x01
    shard.write_bytes(bytes(raw))
    other = s3.ok("push", changed, "mirror/m:prod")
    assert other["digest"] not in digests and other["version"] == 2


def test_source_date_epoch_is_recorded_and_deterministic(
    local: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = checkpoint(tmp_path / "a")
    plain = local.ok("push", folder, "acme/m:plain")["digest"]
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    dated = local.ok("push", folder, "acme/m:dated")
    again = local.ok("push", folder, "acme/other:dated")
    assert dated["digest"] == again["digest"] != plain
    manifest = local.ok("inspect", "acme/m:dated")["manifest"]
    assert manifest["provenance"]["created_at"] == "2023-11-14T22:13:20Z"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000001")
    assert local.ok("push", folder, "acme/m:later")["digest"] not in (plain, dated["digest"])


@pytest.mark.parametrize("value", ["yesterday", "-1", "1.5", "99999999999999", "١٢"])
def test_bad_source_date_epoch_is_a_usage_error_before_anything_is_written(
    local: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    folder = checkpoint(tmp_path / "a")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    code, out = local("push", folder, "acme/m:v1")
    assert code == UsageError.exit_code and out["error"]["type"] == "UsageError", out
    assert "SOURCE_DATE_EPOCH" in out["error"]["message"]
    assert not (tmp_path / "store" / "blobs").exists()


def test_unchanged_repush_is_still_a_no_op(local: Cli, tmp_path: Path) -> None:
    folder = checkpoint(tmp_path / "a")
    first = local.ok("push", folder, "acme/m:v1")
    again = local.ok("push", folder, "acme/m:v1")
    assert again["unchanged"] and again["version"] == 1 and again["digest"] == first["digest"]
    assert again["uploaded_bytes"] == 0


def test_push_time_changes_the_tag_document_not_the_manifest(local: Cli, tmp_path: Path) -> None:
    """Two pushes a year apart (a session clock, not the wall clock) give one manifest digest."""
    from datetime import datetime, timezone

    from shardport.registry.push import push
    from shardport.registry.session import Session
    from shardport.registry.trust.tagging import history

    folder = checkpoint(tmp_path / "a")
    digests, issued = [], []
    for year, name in [(2025, "acme/a"), (2026, "acme/b")]:
        session = Session.open(local.store)
        session.clock = lambda year=year: datetime(year, 6, 1, tzinfo=timezone.utc)  # type: ignore[misc]
        digests.append(push(session, folder, name, "v1").digest)
        issued.append(history(session, name, "v1")[-1].doc.issued_at)
    assert digests[0] == digests[1]
    assert issued == ["2025-06-01T00:00:00Z", "2026-06-01T00:00:00Z"]
