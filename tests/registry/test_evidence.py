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
    EVIDENCE_PREDICATE,
    evidence_statement,
    read_attachment,
    read_evidence,
    show_evidence,
    store_attachment,
    store_evidence,
    values_digest,
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


ROW = {
    "level": "L4",
    "name": "logits max |Δ| vs float32 reference",
    "status": "pass",
    "passed": True,
    "value": 1e-6,
    "tolerance": 1e-3,
    "tolerance_source": "derived",
    "measured": 5,
    "detail": "",
}


def predicate(**extra: object) -> dict[str, object]:
    passed = extra.get("passed", True)
    row = {**ROW, "status": "pass" if passed else "fail", "passed": passed}
    return {
        "created": "2026-12-01T00:00:00Z",
        "topology": {"tp": 2},
        "passed": True,
        "parity": [row],
        **extra,
    }


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


def test_each_statement_says_whether_it_passed_and_the_newest_decides_the_exit(
    pushed: tuple[Cli, str, str],
) -> None:
    from shardport.cli.render import human

    cli, store, digest = pushed
    session = Session.open(store)
    failed = store_evidence(session, "acme/m", digest, predicate(passed=False))
    code, listed = cli("evidence", "acme/m:prod")
    assert code == 1 and listed["failures"] == []  # it verifies, but the newest bring-up failed
    assert [e["passed"] for e in listed["evidence"]] == [False]
    assert (listed["passed"], listed["failed"], listed["newest"]) == (
        0,
        1,
        {"digest": failed, "passed": False},
    )
    text = human("evidence", listed)
    assert "1 verified evidence statement(s) (0 passed, 1 failed; newest failed)" in text
    assert f"failed  {failed}" in text

    later = predicate(passed=True, created="2026-12-02T00:00:00Z")
    passed = store_evidence(session, "acme/m", digest, later)
    code, listed = cli("evidence", "acme/m:prod")
    assert code == 0 and [e["passed"] for e in listed["evidence"]] == [False, True]  # older failure: history
    assert listed["newest"] == {"digest": passed, "passed": True}
    assert "(1 passed, 1 failed; newest passed)" in human("evidence", listed)
    code, shown = cli("evidence", "acme/m:prod", "--show", failed)
    assert code == 1 and shown["predicate"]["passed"] is False
    assert cli("evidence", "acme/m:prod", "--show", passed)[0] == 0


def test_evidence_about_the_digest_in_another_repository_does_not_verify_here(
    pushed: tuple[Cli, str, str],
) -> None:
    from shardport.provenance.statement import Statement, Subject

    cli, store, digest = pushed
    session = Session.open(store)
    # the same manifest digest pushed as acme/other: its (trusted, valid) evidence linked under acme/m
    other = dsse.sign(
        PAYLOAD_TYPE, evidence_statement("acme/other", digest, predicate()).to_bytes(), [session.key]
    )
    elsewhere = session.store.put_blob(other.to_bytes())
    attach(session, "acme/m", digest, elsewhere, EVIDENCE_ARTIFACT)
    # the subject names acme/m, but the predicate says acme/other
    body = {**predicate(), "manifest": digest, "repository": "acme/other"}
    subject = (Subject(name=f"acme/m@{digest}", sha256=digest.removeprefix("sha256:")),)
    st = Statement(subjects=subject, predicate_type=EVIDENCE_PREDICATE, predicate=body)
    mixed = session.store.put_blob(dsse.sign(PAYLOAD_TYPE, st.to_bytes(), [session.key]).to_bytes())
    attach(session, "acme/m", digest, mixed, EVIDENCE_ARTIFACT)

    report = read_evidence(session, "acme/m", digest)
    assert report.verified == ()
    messages = {blob: message for blob, _, message in report.failures}
    assert f"its subject is 'acme/other@{digest}', expected acme/m@{digest}" in messages[elsewhere]
    assert "predicate names repository 'acme/other', expected 'acme/m'" in messages[mixed]
    assert cli("evidence", "acme/m:prod")[0] == 1


def test_an_extra_signature_on_a_stored_statement_is_not_a_second_statement(
    pushed: tuple[Cli, str, str],
) -> None:
    cli, store, digest = pushed
    session = Session.open(store)
    assert session.key is not None
    blob = store_evidence(session, "acme/m", digest, predicate())
    env = dsse.Envelope.from_bytes(session.store.read_blob(blob), source="test")
    extra = dsse.sign(env.payload_type, env.payload, [session.key, SigningKey.generate()])
    again = session.store.put_blob(extra.to_bytes())
    attach(session, "acme/m", digest, again, EVIDENCE_ARTIFACT)

    report = read_evidence(session, "acme/m", digest)
    assert len(report.verified) == 1 and report.failures == ()
    one = report.verified[0]
    assert {one.digest, *one.duplicates} == {blob, again} and one.signers == (session.key.keyid,)
    listed = cli.ok("evidence", "acme/m:prod")
    assert len(listed["evidence"]) == 1 and listed["evidence"][0]["duplicates"] == [max(blob, again)]
    assert cli.ok("verify", "acme/m:prod")["evidence_verified"] == 1


def test_verify_recomputes_each_statement_s_verdict_from_its_rows(pushed: tuple[Cli, str, str]) -> None:
    cli, store, digest = pushed
    session = Session.open(store)
    failing = {**ROW, "name": "top-1 agreement per position", "status": "fail", "passed": False, "value": 4,
               "tolerance": 5}  # fmt: skip
    lying = store_evidence(session, "acme/m", digest, predicate(parity=[ROW, failing]))  # passed: True
    over = {**ROW, "value": 2e-3}  # a pass above its tolerance
    inconsistent = store_evidence(
        session, "acme/m", digest, predicate(created="2026-12-02T00:00:00Z", parity=[over])
    )
    code, out = cli("verify", "acme/m:prod")
    assert code == 1 and out["evidence_verified"] == 2
    found = {f["object"]: f["message"] for f in out["findings"] if f["kind"] == "EvidenceVerdict"}
    assert (
        "passed is True, its rows say False (failing rows: L4 'top-1 agreement per position')"
        in (found[f"evidence {lying}"])
    )
    assert "passes with value 0.002 above its tolerance 0.001" in found[f"evidence {inconsistent}"]


def test_verify_checks_the_ladder_attachment_an_evidence_names(pushed: tuple[Cli, str, str]) -> None:
    cli, store, digest = pushed
    session = Session.open(store)
    values = [{"rank": 0, "weight": "w", "l1": {"mismatches": 0}}]
    blob = store_attachment(session, "acme/m", digest, values)
    named = {"sha256": values_digest(values), "operators": 1, "blob": blob}
    store_evidence(session, "acme/m", digest, predicate(ladder_values=named))
    assert cli.ok("verify", "acme/m:prod")["ok"] is True  # the attachment is not an evidence statement
    assert read_attachment(session, "acme/m", digest, blob, named["sha256"]) == values
    wrong = {**named, "sha256": values_digest([])}
    store_evidence(session, "acme/m", digest, predicate(created="2026-12-03T00:00:00Z", ladder_values=wrong))
    code, out = cli("verify", "acme/m:prod")
    assert code == 1 and any("its values hash to" in f["message"] for f in out["findings"])


def test_rows_written_before_status_existed_read_their_status_from_passed() -> None:
    from shardport.registry.artifact.evidence_rows import verdict_findings

    older = {k: v for k, v in ROW.items() if k not in ("status", "tolerance_source", "measured")}
    off = {"level": "L0", "name": "bytes", "passed": None, "value": None, "tolerance": None, "detail": ""}
    pred = {"manifest": "sha256:" + "0" * 64, "repository": "acme/m", "passed": True, "parity": [older, off]}
    assert verdict_findings(pred) == []
    assert verdict_findings({**pred, "passed": False}) == [
        "passed is False, its rows say True (all ran rows pass)"
    ]
