"""Bring-up evidence: signed statements about a manifest, stored as its referrers, listed and verified."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from support import Cli, make_checkpoint

from shardport.provenance import dsse
from shardport.provenance.keys import SigningKey
from shardport.provenance.statement import PAYLOAD_TYPE
from shardport.registry.errors import NotFoundError, SignatureError, UsageError
from shardport.registry.evidence import (
    EVIDENCE_ARTIFACT,
    evidence_statement,
    read_evidence,
    show_evidence,
    store_evidence,
)
from shardport.registry.session import Session
from shardport.registry.trust.signatures import attach


@pytest.fixture
def pushed(capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path) -> tuple[Cli, str, str]:
    store = str(tmp_path / "store")
    cli = Cli(capsys, store)
    cli.ok("keygen")
    digest = cli.ok("push", make_checkpoint(tmp_path / "ckpt", files=1), "acme/m:prod")["digest"]
    return cli, store, digest


def predicate(**extra: object) -> dict[str, object]:
    return {"created": "2026-12-01T00:00:00Z", "topology": {"tp": 2}, "passed": True, **extra}


def test_store_list_show_and_verify(pushed: tuple[Cli, str, str]) -> None:
    cli, store, digest = pushed
    session = Session.open(store)
    blob = store_evidence(session, "acme/m", digest, predicate(tag={"version": 1}))
    report = read_evidence(session, "acme/m", digest)
    assert [e.digest for e in report.verified] == [blob] and report.failures == ()
    assert report.verified[0].predicate["manifest"] == digest
    assert report.verified[0].predicate["repository"] == "acme/m"

    listed = cli.ok("evidence", "acme/m:prod")
    assert listed["manifest"] == digest
    assert [e["digest"] for e in listed["evidence"]] == [blob]
    assert listed["evidence"][0]["topology"] == {"tp": 2} and listed["evidence"][0]["signers"]
    shown = cli.ok("evidence", "acme/m:prod", "--show", blob.removeprefix("sha256:")[:12])
    assert shown["predicate"]["tag"] == {"version": 1}

    verified = cli.ok("verify", "acme/m:prod")
    assert verified["ok"] is True and verified["evidence_verified"] == 1


def test_untrusted_and_misdirected_evidence_are_findings(pushed: tuple[Cli, str, str]) -> None:
    cli, store, digest = pushed
    session = Session.open(store)
    stranger = SigningKey.generate()
    env = dsse.sign(PAYLOAD_TYPE, evidence_statement("acme/m", digest, predicate()).to_bytes(), [stranger])
    untrusted = session.store.put_blob(env.to_bytes())
    attach(session, "acme/m", digest, untrusted, EVIDENCE_ARTIFACT)
    # Signed by the trusted key, but about another manifest: attached here, it must not count.
    other = "sha256:" + "ab" * 32
    env = dsse.sign(PAYLOAD_TYPE, evidence_statement("acme/m", other, predicate()).to_bytes(), [session.key])
    misdirected = session.store.put_blob(env.to_bytes())
    attach(session, "acme/m", digest, misdirected, EVIDENCE_ARTIFACT)

    report = read_evidence(session, "acme/m", digest)
    assert report.verified == ()
    kinds = {blob: kind for blob, kind, _ in report.failures}
    assert kinds == {untrusted: "UntrustedSignerError", misdirected: "SignatureError"}

    code, out = cli("verify", "acme/m:prod")
    assert code == 1 and out["evidence_verified"] == 0
    assert {f["object"] for f in out["findings"]} == {f"evidence {untrusted}", f"evidence {misdirected}"}
    code, _ = cli("evidence", "acme/m:prod")
    assert code == 1
    with pytest.raises(SignatureError, match="subject is not manifest"):
        show_evidence(session, "acme/m", digest, misdirected)


def test_refusals(pushed: tuple[Cli, str, str], tmp_path: Path) -> None:
    _, store, digest = pushed
    session = Session.open(store)
    with pytest.raises(UsageError, match="names manifest"):
        store_evidence(session, "acme/m", digest, predicate(manifest="sha256:" + "00" * 32))
    with pytest.raises(NotFoundError, match="no evidence"):
        show_evidence(session, "acme/m", digest, "deadbeef")
    unsigned = dataclasses.replace(session, key=None)
    with pytest.raises(UsageError, match="signing key"):
        store_evidence(unsigned, "acme/m", digest, predicate())
