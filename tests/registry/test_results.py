"""The ``--json`` forms of the command results keep their keys (they are built from the dataclass fields)."""

from __future__ import annotations

from shardport.registry.housekeeping import FsckReport, GcReport
from shardport.registry.push import PushResult
from shardport.registry.verify import Report


def test_json_forms_keep_their_keys() -> None:
    fsck = FsckReport(blobs=2, corrupt=["x"]).to_json()
    assert set(fsck) == {
        "ok", "blobs", "tags", "referrers", "corrupt", "dangling", "broken_tags", "bad_referrers", "unsigned",
        "stale_uploads",
    }  # fmt: skip
    assert fsck["ok"] is False and fsck["blobs"] == 2 and fsck["corrupt"] == ["x"]
    gc = GcReport(dry_run=True).to_json()
    assert set(gc) == {
        "dry_run", "kept_blobs", "removed_blobs", "removed_bytes", "removed_uploads", "removed_referrers",
    }  # fmt: skip
    report = Report(subject="a/b:c", parse_error=True)
    report.add("K", "o", "m")
    doc = report.to_json()
    assert set(doc) == {
        "subject", "digest", "ok", "checked_files", "checked_bytes", "checked_tiles", "signers",
        "weights_checked", "evidence_verified", "notes", "findings",
    }  # fmt: skip
    assert doc["ok"] is False and doc["findings"] == [{"kind": "K", "object": "o", "message": "m"}]
    push = PushResult("a/b", "c", "sha256:" + "0" * 64, 1, 2, 3, 4, 5, None, notes=("n",)).to_json()
    assert push["notes"] == ["n"] and push["unchanged"] is False and len(push) == 11
