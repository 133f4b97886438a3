"""The tamper matrix: every attack is refused with exit 1, a specific error, and DEST untouched."""

from __future__ import annotations

import hashlib
import json
import time
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import rfc8785
from safetensors.numpy import save_file
from support import Cli, make_checkpoint

from shardport.provenance import dsse
from shardport.provenance.keys import SigningKey
from shardport.provenance.statement import PAYLOAD_TYPE, Statement
from shardport.registry.artifact.hashing import digest_bytes, hex_of
from shardport.registry.artifact.manifest import ContainerInfo, FileEntry, Manifest
from shardport.registry.session import Session
from shardport.registry.store.keys import blob_key, tag_key
from shardport.registry.trust.signatures import SIGNATURE_ARTIFACT, attach, referrers, sign_manifest
from shardport.registry.trust.tagging import move_tag
from shardport.registry.trust.tags import TagDocument

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
    from shardport.registry.trust.tags import TagDocument, _parse_entry

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
    # The intruder's own client trusts its key (and the victim's); the victim's policy does not.
    evil_policy = session.policy.with_key(intruder.verifying_key(), "intruder")
    evil = Session(store=session.store, policy=evil_policy, state=session.state, key=intruder)
    sign_manifest(evil, NAME, d["v1"])
    move_tag(evil, NAME, TAG, d["v1"])
    expect_refused(cli, tmp_path, "UntrustedSignerError", "does not list")


def test_signer_outside_scope(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli = Cli(capsys, str(tmp_path / "store"))
    cli.ok("keygen", "--scope", "other/*")
    code, out = cli("push", make_checkpoint(tmp_path / "c"), f"{NAME}:{TAG}")
    assert code == 1 and out["error"]["type"] == "UntrustedSignerError"
    assert f"does not allow for {NAME}:{TAG}; nothing was written" in out["error"]["message"]
    assert not (tmp_path / "store" / "repos").exists()  # refused before a tag document was written


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


def forge(session: Session, doc: dict[str, object], tag: str = TAG) -> str:
    """Store ``doc`` as a manifest (bypassing the model), sign it with the trusted key, tag it."""
    digest = session.store.put_blob(rfc8785.dumps(doc))
    sign_manifest(session, NAME, digest)
    move_tag(session, NAME, tag, digest)
    return digest


@pytest.fixture
def tensors_world(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[Cli, Session, dict[str, object]]:
    """A pushed float safetensors checkpoint (so the manifest has a tensor table) and its manifest."""
    src = tmp_path / "src"
    src.mkdir()
    save_file(
        {"w": np.ones((4, 8), np.float16), "b": np.zeros(8, np.float16)}, str(src / "modèle.safetensors")
    )
    cli = Cli(capsys, str(tmp_path / "store"))
    cli.ok("keygen")
    digest = cli.ok("push", src, f"{NAME}:{TAG}")["digest"]
    session = Session.open(cli.store)
    doc = json.loads(session.store.read_blob(digest))
    assert doc["tensors"] and doc["weights"]
    return cli, session, doc


def test_manifest_digest_outside_the_store(
    tensors_world: tuple[Cli, Session, dict[str, object]], tmp_path: Path
) -> None:
    """A signed manifest naming ``sha256:../../../secret``: refused by form; the file is never read."""
    cli, session, doc = tensors_world
    secret = tmp_path / "secret"
    secret.write_bytes(b"not for you" * 100)
    evil = "sha256:../../../secret"  # relative to <store>/blobs/sha256/
    doc["files"][0]["digest"] = evil  # type: ignore[index]
    digest = forge(session, doc)
    expect_refused(cli, tmp_path, "MalformedDigestError", "'files.0.digest'")
    for args in (
        ("verify", f"{NAME}:{TAG}"),
        ("inspect", f"{NAME}:{TAG}"),
        ("tag", f"{NAME}@{digest}", f"{NAME}:x"),
    ):
        code, out = cli(*args)
        assert code == 1, out
        text = json.dumps(out)
        assert "MalformedDigestError" in text and evil in text
        assert "1100 bytes" not in text and hashlib.sha256(secret.read_bytes()).hexdigest() not in text
    assert not session.store.exists(tag_key(NAME, "x", 1))


@pytest.mark.parametrize(
    ("variant", "why"),
    [
        ("other.safetensors", "'files' does not list"),
        ("MODÈLE.safetensors", "differs only in case"),
        (unicodedata.normalize("NFD", "modèle.safetensors"), "differs only in case or Unicode form"),
    ],
)
def test_tensor_table_names_a_file_not_listed(
    tensors_world: tuple[Cli, Session, dict[str, object]], tmp_path: Path, variant: str, why: str
) -> None:
    """Pull crashed in np.memmap and ``verify REF`` said ok; both now refuse it, naming the field."""
    cli, session, doc = tensors_world
    doc["tensors"][0]["file"] = variant  # type: ignore[index]
    digest = forge(session, doc)
    expect_refused(cli, tmp_path, "ManifestInconsistentError", f"manifest {digest}: field 'tensors.0.file'")
    code, out = cli("verify", f"{NAME}:{TAG}")
    assert code == 1 and out["findings"][0]["kind"] == "ManifestInconsistentError", out
    assert why in out["findings"][0]["message"] and repr(variant) in out["findings"][0]["message"]
    code, out = cli("tag", f"{NAME}@{digest}", f"{NAME}:other")
    assert code == 1 and out["error"]["type"] == "ManifestInconsistentError", out
    assert not session.store.exists(tag_key(NAME, "other", 1))


@pytest.mark.parametrize("bad_path", ["../escape.bin", "/etc/evil", "a\u202etxt.exe", "a\x1bb", "Á.bin"])
def test_tag_refuses_unsafe_manifest_paths(
    tensors_world: tuple[Cli, Session, dict[str, object]], tmp_path: Path, bad_path: str
) -> None:
    """``registry tag`` no longer publishes content nobody can pull."""
    cli, session, doc = tensors_world
    bad = unicodedata.normalize("NFD", bad_path)
    doc["files"].append({"path": bad, "size": 7, "digest": session.store.put_blob(b"payload")})  # type: ignore[attr-defined]
    digest = session.store.put_blob(rfc8785.dumps(doc))
    sign_manifest(session, NAME, digest)
    code, out = cli("tag", f"{NAME}@{digest}", f"{NAME}:published")
    assert code == 1 and out["error"]["type"] == "UnsafePathError", out
    assert repr(bad) in out["error"]["message"]
    assert not session.store.exists(tag_key(NAME, "published", 1))
    code, out = cli("verify", f"{NAME}@{digest}")
    assert code == 1 and out["findings"][0]["kind"] == "UnsafePathError", out


def test_forged_tag_document_target(world: tuple[Cli, Session, dict[str, str]], tmp_path: Path) -> None:
    cli, session, _ = world
    assert session.key is not None
    doc = TagDocument(
        repository=NAME,
        tag="t",
        version=1,
        target="sha256:" + "0" * 64,
        previous=None,
        issued_at="2020-01-01T00:00:00Z",
        expires="2999-01-01T00:00:00Z",
        signer=session.key.keyid,
    )
    st = doc.statement()
    forged = Statement(st.subjects, st.predicate_type, {**st.predicate, "target": "sha256:../../../x"})
    session.store.put(
        tag_key(NAME, "t", 1), dsse.sign(PAYLOAD_TYPE, forged.to_bytes(), [session.key]).to_bytes()
    )
    expect_refused(cli, tmp_path, "TagChainError", "field 'target' = 'sha256:../../../x'", ref=f"{NAME}:t")


def test_malformed_referrer_attaches_nothing(
    world: tuple[Cli, Session, dict[str, str]], tmp_path: Path
) -> None:
    cli, session, d = world
    (sig,) = referrers(session, NAME, d["v2"], SIGNATURE_ARTIFACT)
    session.store.put(
        f"repos/{NAME}/referrers/{hex_of(d['v2'])}/{hex_of(sig)}",
        json.dumps({"artifactType": SIGNATURE_ARTIFACT, "digest": "sha256:../" + hex_of(sig)}).encode(),
    )
    assert referrers(session, NAME, d["v2"]) == []
    expect_refused(cli, tmp_path, "UnsignedError", "no signature")


def test_verify_dir_checks_the_pulled_manifest(
    tensors_world: tuple[Cli, Session, dict[str, object]], tmp_path: Path
) -> None:
    """A pulled folder whose recorded manifest names a file it does not list: a finding, not a crash."""
    cli, _, doc = tensors_world
    dest = tmp_path / "pulled"
    cli.ok("pull", f"{NAME}:{TAG}", dest)
    doc["tensors"][0]["file"] = "gone.safetensors"  # type: ignore[index]
    raw = rfc8785.dumps(doc)
    (dest / ".shardport" / "manifest.json").write_bytes(raw)
    ref = json.loads((dest / ".shardport" / "ref.json").read_text())
    (dest / ".shardport" / "ref.json").write_text(json.dumps({**ref, "digest": digest_bytes(raw)}))
    code, out = cli("verify", dest)
    assert code == 1, out
    assert [f["kind"] for f in out["findings"]] == ["ManifestInconsistentError"], out
    assert "'gone.safetensors'" in out["findings"][0]["message"]
