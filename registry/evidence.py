"""Bring-up evidence: signed in-toto statements about a manifest, stored as its referrers.

A bring-up (``registry up``) proves what it ran: topology, the tag version and digest it resolved,
runtime and kernel versions, the dispatch trace, parity results, timeline and ledgers. This module
stores and reads that proof; it does not know what the predicate holds beyond a few required fields.

Statement: subject = the manifest (``name@sha256:…``, its sha256), predicate type
:data:`EVIDENCE_PREDICATE`, predicate = a JSON object with at least ``manifest`` (the digest, equal to
the subject) and ``repository``. Envelope: DSSE signed by the session key (evidence is never stored
unsigned). Stored as a blob, attached with artifact type :data:`EVIDENCE_ARTIFACT` under
``repos/<name>/referrers/<manifest-hex>/<blob-hex>``. Reading checks, per blob: the envelope parses,
its signer is trusted for the repository (policy scopes as for manifests), the statement's predicate
type and single subject name this manifest in this repository (``name@sha256:…`` and its sha256: a
statement about the same digest in another repository does not verify here), and the predicate's
``manifest`` and ``repository`` agree. Envelopes carrying the same statement (one re-signed, or with an
extra signature added) are one statement: listed once, under the first blob digest, with the union of
their trusted signers and the other blobs as ``duplicates``.

Each statement says whether its bring-up passed (``passed``); :func:`exit_code` makes a listing exit 1
when a blob does not verify or the newest statement records a failed bring-up (older failures are
history: listed as failed, exit 0 once a newer bring-up passed).

Large per-operator detail (the L0-L3 values of every weight and rank) travels as a second signed
statement, an *attachment* (predicate type :data:`LADDER_PREDICATE`, artifact type
:data:`LADDER_ARTIFACT`, same subject): :func:`store_attachment` signs and attaches it before the
evidence, which names it by blob digest and by the sha256 of its values' canonical JSON
(:func:`values_digest`); :func:`read_attachment` verifies one (``registry verify`` checks every
evidence statement's attachment: present, trusted, about this manifest, values matching the digest).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from shardport.provenance import dsse
from shardport.provenance.canonical import canonical_bytes
from shardport.provenance.dsse import Envelope
from shardport.provenance.errors import EnvelopeFormatError
from shardport.provenance.statement import PAYLOAD_TYPE, Statement, Subject
from shardport.registry.artifact.hashing import hex_of
from shardport.registry.errors import NotFoundError, SignatureError, UsageError, VerificationError
from shardport.registry.session import Session
from shardport.registry.trust.signatures import attach, referrers

EVIDENCE_PREDICATE = "https://shardport.dev/evidence/v1"
EVIDENCE_ARTIFACT = "application/vnd.shardport.evidence.v1+json"
LADDER_PREDICATE = "https://shardport.dev/evidence-ladders/v1"
LADDER_ARTIFACT = "application/vnd.shardport.evidence-ladders.v1+json"


@dataclass(frozen=True)
class Evidence:
    """One stored evidence statement: its blob digest, trusted signers and predicate."""

    digest: str
    signers: tuple[str, ...]
    predicate: Mapping[str, Any]
    duplicates: tuple[str, ...] = ()
    """Other blobs carrying the same statement (another envelope of the same payload)."""

    @property
    def passed(self) -> bool:
        """Whether the bring-up this statement records passed (only ``passed: true`` counts)."""
        return self.predicate.get("passed") is True

    def summary(self) -> dict[str, Any]:
        """The listing line: digest, signers and the predicate's headline fields."""
        p = self.predicate
        return {
            "digest": self.digest,
            "signers": list(self.signers),
            "created": p.get("created"),
            "topology": p.get("topology"),
            "tag": p.get("tag"),
            "passed": p.get("passed"),
            "duplicates": list(self.duplicates),
        }


def evidence_statement(name: str, manifest: str, predicate: Mapping[str, Any]) -> Statement:
    """The statement one bring-up's evidence signs; the predicate must name this manifest."""
    if predicate.get("manifest", manifest) != manifest:
        named = predicate.get("manifest")
        raise UsageError(f"evidence predicate names manifest {named!r}, but it is attached to {manifest}")
    body = {**predicate, "manifest": manifest, "repository": name}
    return Statement(
        subjects=(Subject(name=f"{name}@{manifest}", sha256=hex_of(manifest)),),
        predicate_type=EVIDENCE_PREDICATE,
        predicate=body,
    )


def store_evidence(session: Session, name: str, manifest: str, predicate: Mapping[str, Any]) -> str:
    """Sign ``predicate`` as evidence about ``manifest``, store and attach it; return the blob digest."""
    if session.key is None:
        raise UsageError("storing bring-up evidence needs a signing key: pass --key or run `registry keygen`")
    statement = evidence_statement(name, manifest, predicate)
    env = dsse.sign(PAYLOAD_TYPE, statement.to_bytes(), [session.key])
    blob = session.store.put_blob(env.to_bytes())
    attach(session, name, manifest, blob, EVIDENCE_ARTIFACT)
    return blob


def values_digest(values: Any) -> str:
    """``sha256:<hex>`` of ``values``' canonical JSON (RFC 8785): how the evidence names an attachment."""
    return "sha256:" + hashlib.sha256(canonical_bytes(values)).hexdigest()


def store_attachment(session: Session, name: str, manifest: str, values: Any) -> str:
    """Sign ``values`` as the ladder attachment of evidence about ``manifest``; attach it, return its blob.

    The statement's predicate: ``manifest``, ``repository``, ``sha256`` (:func:`values_digest`), ``values``.
    """
    if session.key is None:
        raise UsageError("storing bring-up evidence needs a signing key: pass --key or run `registry keygen`")
    body = {"manifest": manifest, "repository": name, "sha256": values_digest(values), "values": values}
    statement = Statement(
        subjects=(Subject(name=f"{name}@{manifest}", sha256=hex_of(manifest)),),
        predicate_type=LADDER_PREDICATE,
        predicate=body,
    )
    env = dsse.sign(PAYLOAD_TYPE, statement.to_bytes(), [session.key])
    blob = session.store.put_blob(env.to_bytes())
    attach(session, name, manifest, blob, LADDER_ARTIFACT)
    return blob


def read_attachment(session: Session, name: str, manifest: str, blob: str, sha256: str) -> Any:
    """The values of a ladder attachment, verified: envelope, trusted signer, subject, digest of the values.

    Raises :class:`SignatureError` (or :class:`NotFoundError` for a missing blob) naming what differs.
    """
    source = f"evidence attachment {blob}"
    try:
        env = Envelope.from_bytes(session.store.read_blob(blob), source=source)
        st = Statement.from_bytes(env.payload)
    except (EnvelopeFormatError, ValueError) as exc:
        raise SignatureError(f"{source}: {exc}") from exc
    if st.predicate_type != LADDER_PREDICATE or [s.name for s in st.subjects] != [f"{name}@{manifest}"]:
        raise SignatureError(
            f"{source}: a {st.predicate_type!r} statement about {[s.name for s in st.subjects]}, expected "
            f"{LADDER_PREDICATE!r} about {name}@{manifest}"
        )
    session.policy.check(env, what=f"{source} about {manifest}", repository=name)
    body = st.predicate if isinstance(st.predicate, Mapping) else {}
    values = body.get("values")
    got = values_digest(values)
    if got != sha256 or body.get("sha256") != sha256:
        raise SignatureError(f"{source}: its values hash to {got}, the evidence names {sha256}")
    return values


def _checked(session: Session, raw: bytes, name: str, manifest: str, source: str) -> tuple[Evidence, str]:
    """:func:`check_evidence`, and the sha256 of the statement (the envelope's payload)."""
    try:
        env = Envelope.from_bytes(raw, source=source)
        st = Statement.from_bytes(env.payload)
    except (EnvelopeFormatError, ValueError) as exc:
        raise SignatureError(f"{source}: {exc}") from exc
    if st.predicate_type != EVIDENCE_PREDICATE:
        raise SignatureError(
            f"{source}: predicate type {st.predicate_type!r}, expected {EVIDENCE_PREDICATE!r}"
        )
    if [s.sha256 for s in st.subjects] != [hex_of(manifest)]:
        raise SignatureError(f"{source}: its subject is not manifest {manifest}")
    if st.subjects[0].name != f"{name}@{manifest}":
        raise SignatureError(
            f"{source}: its subject is {st.subjects[0].name!r}, expected {name}@{manifest} (evidence about "
            "the same digest in another repository does not count here)"
        )
    predicate = st.predicate if isinstance(st.predicate, Mapping) else {}
    if predicate.get("manifest") != manifest:
        raise SignatureError(
            f"{source}: predicate names manifest {predicate.get('manifest')!r}, expected {manifest}"
        )
    if predicate.get("repository") != name:
        raise SignatureError(
            f"{source}: predicate names repository {predicate.get('repository')!r}, expected {name!r}"
        )
    signers = session.policy.check(env, what=f"evidence about {manifest} ({source})", repository=name)
    payload = hashlib.sha256(env.payload).hexdigest()
    return Evidence(digest="", signers=tuple(signers), predicate=predicate), payload


def check_evidence(session: Session, raw: bytes, name: str, manifest: str, source: str) -> Evidence:
    """Verify one evidence envelope about ``manifest`` in repository ``name``.

    Signer trusted, subject (name and digest) and predicate (manifest and repository) agree.
    """
    return _checked(session, raw, name, manifest, source)[0]


@dataclass(frozen=True)
class EvidenceReport:
    """Every evidence blob attached to a manifest: the verified ones and a finding for each other."""

    verified: tuple[Evidence, ...]
    failures: tuple[tuple[str, str, str], ...]  # (blob digest, error type, message)


def read_evidence(session: Session, name: str, manifest: str) -> EvidenceReport:
    """Read and verify every evidence statement attached to ``manifest`` (newest last by ``created``)."""
    by_payload: dict[str, Evidence] = {}  # one statement, however many envelopes carry it
    failures: list[tuple[str, str, str]] = []
    for blob in sorted(referrers(session, name, manifest, EVIDENCE_ARTIFACT)):
        try:
            raw = session.store.read_blob(blob)
            found, payload = _checked(session, raw, name, manifest, f"evidence {blob}")
        except NotFoundError:
            failures.append((blob, "MissingBlob", f"evidence {blob} is attached but missing from the store"))
            continue
        except VerificationError as exc:
            failures.append((blob, type(exc).__name__, str(exc)))
            continue
        first = by_payload.get(payload)
        if first is None:
            by_payload[payload] = Evidence(digest=blob, signers=found.signers, predicate=found.predicate)
        else:
            signers = tuple(dict.fromkeys((*first.signers, *found.signers)))
            by_payload[payload] = replace(first, signers=signers, duplicates=(*first.duplicates, blob))
    verified = sorted(by_payload.values(), key=lambda e: (str(e.predicate.get("created", "")), e.digest))
    return EvidenceReport(verified=tuple(verified), failures=tuple(failures))


def exit_code(report: EvidenceReport) -> int:
    """``registry evidence REF``'s exit code.

    1 when a blob does not verify or the newest statement records a failed bring-up (``passed`` not
    true); 0 otherwise (none attached, or the newest passed).
    """
    if report.failures or (report.verified and not report.verified[-1].passed):
        return 1
    return 0


def show_evidence(session: Session, name: str, manifest: str, digest: str) -> Evidence:
    """One verified evidence statement by its blob digest (a unique prefix of its hex is enough)."""
    report = read_evidence(session, name, manifest)
    want = digest.removeprefix("sha256:")
    hits = [e for e in report.verified if any(hex_of(d).startswith(want) for d in (e.digest, *e.duplicates))]
    if len(hits) == 1:
        return hits[0]
    failed = [f for f in report.failures if hex_of(f[0]).startswith(want)]
    if failed:
        blob, kind, message = failed[0]
        raise SignatureError(f"evidence {blob} does not verify ({kind}): {message}")
    if not hits:
        raise NotFoundError(f"no evidence {digest!r} attached to {name}@{manifest}")
    raise UsageError(f"evidence prefix {digest!r} is ambiguous: {', '.join(e.digest for e in hits)}")


def to_json(report: EvidenceReport) -> dict[str, Any]:
    """The ``registry evidence REF --json`` document."""
    newest = report.verified[-1] if report.verified else None
    return {
        "evidence": [e.summary() for e in report.verified],
        "passed": sum(e.passed for e in report.verified),
        "failed": sum(not e.passed for e in report.verified),
        "newest": None if newest is None else {"digest": newest.digest, "passed": newest.passed},
        "failures": [{"digest": d, "type": t, "message": m} for d, t, m in report.failures],
    }


def dumps(evidence: Evidence) -> str:
    """One evidence statement's predicate, for ``registry evidence REF --show DIGEST``."""
    return json.dumps(
        {"digest": evidence.digest, "signers": list(evidence.signers), "predicate": evidence.predicate},
        indent=2,
        sort_keys=True,
    )
