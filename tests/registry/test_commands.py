"""Every command against every backend (local folder, moto, SeaweedFS), through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import Cli, make_checkpoint


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], store_url: str, home: Path) -> Cli:
    return Cli(capsys, store_url)


def tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ".shardport" not in p.relative_to(folder).parts
    }


def test_full_cycle(cli: Cli, tmp_path: Path) -> None:
    keys = cli.ok("keygen")
    assert keys["keyid"].startswith("ed25519:")
    v1 = make_checkpoint(tmp_path / "v1", seed=1)
    first = cli.ok("push", v1, "acme/llama-q4:prod")
    assert first["uploaded_bytes"] == sum(len(b) for b in tree(v1).values())
    assert first["reused_bytes"] == 0 and first["version"] == 1

    # An unchanged re-push moves zero blob bytes.
    again = cli.ok("push", v1, "acme/llama-q4:prod")
    assert again["uploaded_bytes"] == 0 and again["reused_bytes"] == first["uploaded_bytes"]
    assert again["unchanged"] and again["version"] == 1 and again["digest"] == first["digest"]

    # One shard changed: only that shard moves.
    v2 = make_checkpoint(tmp_path / "v2", seed=1)
    (v2 / "model-00001.bin").write_bytes(b"changed" * 1000)
    second = cli.ok("push", v2, "acme/llama-q4:prod")
    assert second["uploaded_bytes"] == 7000 and second["uploaded_files"] == 1

    pulled = cli.ok("pull", "acme/llama-q4:prod", tmp_path / "dest")
    assert pulled["digest"] == second["digest"] and pulled["files"] == 5
    assert tree(tmp_path / "dest") == tree(v2)

    by_digest = cli.ok("pull", f"acme/llama-q4@{first['digest']}", tmp_path / "dest1")
    assert by_digest["digest"] == first["digest"]
    assert tree(tmp_path / "dest1") == tree(v1)

    assert cli.ok("verify", "acme/llama-q4:prod")["ok"] is True
    assert cli.ok("verify", tmp_path / "dest")["ok"] is True

    tagged = cli.ok("tag", f"acme/llama-q4@{first['digest']}", "acme/llama-q4:stable")
    assert tagged["version"] == 1 and tagged["digest"] == first["digest"]

    rolled = cli.ok("rollback", "acme/llama-q4:prod", "--to", first["digest"], "--reason", "regression")
    assert rolled["digest"] == first["digest"]

    log = cli.ok("log", "acme/llama-q4:prod")
    assert [e["version"] for e in log] == [1, 2, 3]
    assert [e["target"] for e in log] == [first["digest"], second["digest"], first["digest"]]
    assert log[-1]["rollback_of"] == {"version": 2, "reason": "regression"}
    assert all(e["signer"] == keys["keyid"] for e in log)

    listing = cli.ok("ls")
    assert listing == [
        {
            "name": "acme/llama-q4",
            "tags": [
                {"tag": "prod", "target": first["digest"], "version": 3},
                {"tag": "stable", "target": first["digest"], "version": 1},
            ],
        }
    ]
    info = cli.ok("inspect", "acme/llama-q4:prod")
    assert info["digest"] == first["digest"]
    assert info["manifest"]["model"]["architecture"] == "LlamaForCausalLM"
    assert {f["path"] for f in info["manifest"]["files"]} == set(tree(v1))
    assert len(info["versions"]) == 3

    fsck = cli.ok("fsck")
    assert fsck["ok"] and fsck["tags"] == 2
    dry = cli.ok("gc", "--dry-run", "--grace-seconds", "0")
    assert dry["removed_blobs"] == []  # every version's target is retained


def test_gc_removes_only_unreferenced(cli: Cli, tmp_path: Path) -> None:
    cli.ok("keygen")
    ck = make_checkpoint(tmp_path / "c", seed=3)
    cli.ok("push", ck, "team/m:a")
    # A blob nobody references (a crashed push of another checkpoint, long ago).
    from shardport.registry.session import Session

    session = Session.open(cli.store)
    orphan = session.store.put_blob(b"orphan bytes")
    dry = cli.ok("gc", "--dry-run", "--grace-seconds", "0")
    assert dry["removed_blobs"] == [orphan]
    assert session.store.has_blob(orphan)
    kept = cli.ok("gc", "--grace-seconds", "3600")
    assert kept["removed_blobs"] == []  # still inside the grace window
    done = cli.ok("gc", "--grace-seconds", "0")
    assert done["removed_blobs"] == [orphan]
    assert not session.store.has_blob(orphan)
    assert cli.ok("verify", "team/m:a")["ok"]
    assert cli.ok("fsck")["ok"]


def test_unsigned_push_needs_flag_and_pull_refuses(cli: Cli, tmp_path: Path) -> None:
    ck = make_checkpoint(tmp_path / "c", seed=4)
    code, out = cli("push", ck, "x/y:t")
    assert code == 1 and out["error"]["type"] == "UnsignedError"
    cli.ok("push", ck, "x/y:t", "--allow-unsigned")
    code, out = cli("pull", "x/y:t", tmp_path / "d")
    assert code == 1 and out["error"]["type"] == "UnsignedError"
    assert "--allow-unsigned" in out["error"]["message"]
    assert not (tmp_path / "d").exists()
    cli.ok("pull", "x/y:t", tmp_path / "d", "--allow-unsigned")


def test_not_found_and_usage_codes(cli: Cli, tmp_path: Path) -> None:
    cli.ok("keygen")
    code, out = cli("pull", "nope/x:t", tmp_path / "d")
    assert code == 3, out
    code, out = cli("pull", "Bad Name:t", tmp_path / "d")
    assert code == 2 and "repository name" in out["error"]["message"]
    code, out = cli("pull", f"nope/x@sha256:{'0' * 64}", tmp_path / "d")
    assert code == 3 and "not found" in out["error"]["message"]


def test_json_is_one_document(cli: Cli, tmp_path: Path) -> None:
    cli.ok("keygen")
    out = cli.ok("push", make_checkpoint(tmp_path / "c", seed=5), "a/b:c")
    assert set(out) >= {"digest", "uploaded_bytes", "reused_bytes"}
    json.dumps(out)


def test_trust_flag_with_a_public_key(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = cli.ok("keygen")
    cli.ok("push", make_checkpoint(tmp_path / "c", seed=6), "t/m:v")
    monkeypatch.setenv("SHARDPORT_HOME", str(tmp_path / "fresh-home"))  # trusts nothing
    code, out = cli("pull", "t/m:v", tmp_path / "d0")
    assert code == 1 and out["error"]["type"] == "UntrustedSignerError"
    assert cli.ok("pull", "t/m:v", tmp_path / "d1", "--trust", keys["public_key"])["files"] == 5
    from shardport.provenance.keys import SigningKey

    other = SigningKey.generate()
    (tmp_path / "other.pub").write_bytes(other.verifying_key().to_pem())
    code, out = cli("pull", "t/m:v", tmp_path / "d2", "--trust", tmp_path / "other.pub")
    assert code == 1 and out["error"]["type"] == "UntrustedSignerError"


def test_tag_into_another_repository(cli: Cli, tmp_path: Path) -> None:
    cli.ok("keygen")
    digest = cli.ok("push", make_checkpoint(tmp_path / "c", seed=8), "team/dev:v1")["digest"]
    assert cli.ok("tag", f"team/dev@{digest}", "team/release:stable")["digest"] == digest
    assert cli.ok("pull", "team/release:stable", tmp_path / "r")["digest"] == digest
    assert cli.ok("verify", "team/release:stable")["ok"]
