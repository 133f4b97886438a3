"""The tamper matrix: every attack is refused with exit 1, a specific error, and DEST untouched."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support import Cli, make_checkpoint

from shardport.provenance import dsse
from shardport.provenance.keys import SigningKey
from shardport.provenance.statement import PAYLOAD_TYPE
from shardport.registry.hashing import digest_bytes, hex_of
from shardport.registry.manifest import ContainerInfo, FileEntry, Manifest
from shardport.registry.session import Session
from shardport.registry.signatures import SIGNATURE_ARTIFACT, attach, referrers, sign_manifest
from shardport.registry.store import blob_key, tag_key
from shardport.registry.tagging import move_tag

NAME, TAG = "acme/model", "prod"


@pytest.fixture(params=["local", pytest.param("moto", marks=pytest.mark.s3)])
def world(
    request: pytest.FixtureRequest, tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[Cli, Session, dict[str, str]]:
    store = str(tmp_path / "store") if request.param == "local" else request.getfixturevalue("moto_store_url")
    cli = Cli(capsys, store)
    cli.ok("keygen")
    v1 = cli.ok("push", make_checkpoint(tmp_path / "v1", seed=1), f"{NAME}:{TAG}")
    v2 = cli.ok("push", make_checkpoint(tmp_path / "v2", seed=2), f"{NAME}:{TAG}")
    return cli, Session.open(store), {"v1": v1["digest"], "v2": v2["digest"]}


def flip(data: bytes, at: int | None = None) -> bytes:
    i = len(data) // 2 if at is None else at
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]


def expect_refused(cli: Cli, tmp_path: Path, error: str, text: str, ref: str = f"{NAME}:{TAG}") -> None:
    dest = tmp_path / "dest"
    dest.mkdir(exist_ok=True)
    (dest / "sentinel").write_text("old contents")
    code, out = cli("pull", ref, dest, "--force")  # even a pull allowed to replace DEST leaves it as it was
    assert code == 1, out
    assert out["error"]["type"] == error, out
    assert text in out["error"]["message"], out
    assert [p.name for p in dest.iterdir()] == ["sentinel"]
    assert (dest / "sentinel").read_text() == "old contents"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dest")] == []


def _file_blob(session: Session, digest: str) -> str:
    m = Manifest.from_bytes(session.store.read_blob(digest))
    return max(m.files, key=lambda f: f.size).digest


def test_flipped_file_blob(world: tuple[Cli, Session, dict[str, str]], tmp_path: Path) -> None:
    cli, session, d = world
    key = blob_key(_file_blob(session, d["v2"]))
    session.store.put(key, flip(session.store.read(key)))
    expect_refused(cli, tmp_path, "DigestMismatchError", "model-")
    code, out = cli("verify", f"{NAME}:{TAG}")
    assert code == 1 and out["findings"][0]["kind"] == "DigestMismatch"
    assert cli.ok("pull", f"{NAME}@{d['v1']}", tmp_path / "old")["digest"] == d["v1"]  # other content intact


def test_flipped_manifest(world: tuple[Cli, Session, dict[str, str]], tmp_path: Path) -> None:
    cli, session, d = world
    key = blob_key(d["v2"])
    session.store.put(key, flip(session.store.read(key)))
    expect_refused(cli, tmp_path, "DigestMismatchError", d["v2"])


def test_flipped_signature_blob(world: tuple[Cli, Session, dict[str, str]], tmp_path: Path) -> None:
    cli, session, d = world
    (sig,) = referrers(session, NAME, d["v2"], SIGNATURE_ARTIFACT)
    session.store.put(blob_key(sig), flip(session.store.read(blob_key(sig))))
    expect_refused(cli, tmp_path, "DigestMismatchError", sig)


def test_altered_signature_rehosted(world: tuple[Cli, Session, dict[str, str]], tmp_path: Path) -> None:
    """The attacker stores a corrupted signature under its own digest and re-points the referrer."""
    cli, session, d = world
    (sig,) = referrers(session, NAME, d["v2"], SIGNATURE_ARTIFACT)
    env = dsse.Envelope.from_bytes(session.store.read_blob(sig))
    bad = dsse.Envelope(
        env.payload_type, env.payload, (dsse.Signature(env.signatures[0].keyid, flip(env.signatures[0].sig)),)
    )
    new = session.store.put_blob(bad.to_bytes())
    session.store.delete(f"repos/{NAME}/referrers/{hex_of(d['v2'])}/{hex_of(sig)}")
    attach(session, NAME, d["v2"], new, SIGNATURE_ARTIFACT)
    expect_refused(cli, tmp_path, "SignatureError", "does not verify")


def test_flipped_tag_document(world: tuple[Cli, Session, dict[str, str]], tmp_path: Path) -> None:
    cli, session, _ = world
    key = tag_key(NAME, TAG, 2)
    raw = session.store.read(key)
    i = raw.index(b'"payload":"') + 40  # inside the base64 payload
    session.store.put(key, raw[:i] + (b"A" if raw[i : i + 1] != b"A" else b"B") + raw[i + 1 :])
    dest = tmp_path / "dest"
    code, out = cli("pull", f"{NAME}:{TAG}", dest)
    assert code == 1 and out["error"]["type"] in ("SignatureError", "TagChainError"), out
    assert "version 2" in out["error"]["message"]
    assert not dest.exists()


def test_replayed_older_document(world: tuple[Cli, Session, dict[str, str]], tmp_path: Path) -> None:
    cli, session, _ = world
    cli.ok("pull", f"{NAME}:{TAG}", tmp_path / "seen")  # this client has now seen version 2
    session.store.delete(tag_key(NAME, TAG, 2))  # the store replays version 1 as the newest
    expect_refused(cli, tmp_path, "RollbackAttackError", "already saw version 2")


def test_replayed_document_at_new_version(world: tuple[Cli, Session, dict[str, str]], tmp_path: Path) -> None:
    cli, session, _ = world
    session.store.create_only(tag_key(NAME, TAG, 3), session.store.read(tag_key(NAME, TAG, 1)))
    expect_refused(cli, tmp_path, "TagChainError", "version 3")


def test_equivocation(world: tuple[Cli, Session, dict[str, str]], tmp_path: Path) -> None:
    cli, session, d = world
    cli.ok("pull", f"{NAME}:{TAG}", tmp_path / "seen")
    # A different, validly signed version 2 (same trusted key, other target).
    entries_raw = session.store.read(tag_key(NAME, TAG, 1))
    from shardport.registry.tags import TagDocument, _parse_entry

    _, doc1 = _parse_entry(entries_raw, "v1")
    evil = TagDocument(
        repository=NAME,
        tag=TAG,
        version=2,
        target=d["v1"],
        previous=digest_bytes(entries_raw),
        issued_at=doc1.issued_at,
        expires=doc1.expires,
        signer=session.key.keyid if session.key else None,
    )
    assert session.key is not None
    raw = dsse.sign(PAYLOAD_TYPE, evil.statement().to_bytes(), [session.key]).to_bytes()
    session.store.put(tag_key(NAME, TAG, 2), raw)
    expect_refused(cli, tmp_path, "EquivocationError", "equivocation")


def test_expired_head(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli = Cli(capsys, str(tmp_path / "store"))
    cli.ok("keygen")
    cli.ok("push", make_checkpoint(tmp_path / "c"), f"{NAME}:{TAG}", "--expires-days", "0.00002")  # ~1.7 s
    time.sleep(2.2)
    expect_refused(cli, tmp_path, "TagExpiredError", "expired")


def test_untrusted_signer(world: tuple[Cli, Session, dict[str, str]], tmp_path: Path) -> None:
    cli, session, d = world
    intruder = SigningKey.generate()
    evil = Session(store=session.store, policy=session.policy, state=session.state, key=intruder)
    sign_manifest(evil, NAME, d["v1"])
    # The intruder's session trusts nothing new, but can still write a document signed by its key.
    evil.allow_unsigned = True
    move_tag(evil, NAME, TAG, d["v1"])
    expect_refused(cli, tmp_path, "UntrustedSignerError", "does not list")


def test_signer_outside_scope(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli = Cli(capsys, str(tmp_path / "store"))
    cli.ok("keygen", "--scope", "other/*")
    code, out = cli("push", make_checkpoint(tmp_path / "c"), f"{NAME}:{TAG}")
    assert code == 1 and out["error"]["type"] == "UntrustedSignerError"
    assert f"does not allow for {NAME}" in out["error"]["message"]


@pytest.mark.parametrize(
    "bad_path", ["../escape.bin", "/etc/evil", "a/../../b", "a//b", ".shardport/x", "a\\b"]
)
def test_unsafe_manifest_paths(
    world: tuple[Cli, Session, dict[str, str]], tmp_path: Path, bad_path: str
) -> None:
    cli, session, _ = world
    blob = session.store.put_blob(b"payload")
    manifest = Manifest(
        container=ContainerInfo(kind="other"), files=[FileEntry(path=bad_path, size=7, digest=blob)]
    )
    digest = session.store.put_blob(manifest.to_bytes())
    sign_manifest(session, NAME, digest)
    move_tag(session, NAME, TAG, digest)
    expect_refused(cli, tmp_path, "UnsafePathError", repr(bad_path))
    assert not (tmp_path / "escape.bin").exists()


def test_tamper_cases_leave_other_tags_usable(
    world: tuple[Cli, Session, dict[str, str]], tmp_path: Path
) -> None:
    cli, session, d = world
    cli.ok("tag", f"{NAME}@{d['v1']}", f"{NAME}:stable")
    session.store.delete(tag_key(NAME, TAG, 2))
    assert cli.ok("pull", f"{NAME}:stable", tmp_path / "s")["digest"] == d["v1"]
