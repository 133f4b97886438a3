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
type and single subject name this manifest, and the predicate's ``manifest`` agrees.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardport.provenance import dsse
from shardport.provenance.dsse import Envelope
from shardport.provenance.errors import EnvelopeFormatError
from shardport.provenance.statement import PAYLOAD_TYPE, Statement, Subject
from shardport.registry.artifact.hashing import hex_of
from shardport.registry.errors import NotFoundError, SignatureError, UsageError, VerificationError
from shardport.registry.session import Session
from shardport.registry.trust.signatures import attach, referrers

EVIDENCE_PREDICATE = "https://shardport.dev/evidence/v1"
EVIDENCE_ARTIFACT = "application/vnd.shardport.evidence.v1+json"


@dataclass(frozen=True)
class Evidence:
    """One stored evidence statement: its blob digest, trusted signers and predicate."""

    digest: str
    signers: tuple[str, ...]
    predicate: Mapping[str, Any]

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


def check_evidence(session: Session, raw: bytes, name: str, manifest: str, source: str) -> Evidence:
    """Verify one evidence envelope about ``manifest``: signer trusted, subject and predicate agree."""
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
    predicate = st.predicate if isinstance(st.predicate, Mapping) else {}
    if predicate.get("manifest") != manifest:
        raise SignatureError(
            f"{source}: predicate names manifest {predicate.get('manifest')!r}, expected {manifest}"
        )
    signers = session.policy.check(env, what=f"evidence about {manifest} ({source})", repository=name)
    return Evidence(digest="", signers=tuple(signers), predicate=predicate)


@dataclass(frozen=True)
class EvidenceReport:
    """Every evidence blob attached to a manifest: the verified ones and a finding for each other."""

    verified: tuple[Evidence, ...]
    failures: tuple[tuple[str, str, str], ...]  # (blob digest, error type, message)


def read_evidence(session: Session, name: str, manifest: str) -> EvidenceReport:
    """Read and verify every evidence statement attached to ``manifest`` (newest last by ``created``)."""
    verified: list[Evidence] = []
    failures: list[tuple[str, str, str]] = []
    for blob in referrers(session, name, manifest, EVIDENCE_ARTIFACT):
        try:
            raw = session.store.read_blob(blob)
            found = check_evidence(session, raw, name, manifest, f"evidence {blob}")
            verified.append(Evidence(digest=blob, signers=found.signers, predicate=found.predicate))
        except NotFoundError:
            failures.append((blob, "MissingBlob", f"evidence {blob} is attached but missing from the store"))
        except VerificationError as exc:
            failures.append((blob, type(exc).__name__, str(exc)))
    verified.sort(key=lambda e: (str(e.predicate.get("created", "")), e.digest))
    return EvidenceReport(verified=tuple(verified), failures=tuple(failures))


def show_evidence(session: Session, name: str, manifest: str, digest: str) -> Evidence:
    """One verified evidence statement by its blob digest (a unique prefix of its hex is enough)."""
    report = read_evidence(session, name, manifest)
    want = digest.removeprefix("sha256:")
    hits = [e for e in report.verified if hex_of(e.digest).startswith(want)]
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
    return {
        "evidence": [e.summary() for e in report.verified],
        "failures": [{"digest": d, "type": t, "message": m} for d, t, m in report.failures],
    }


def dumps(evidence: Evidence) -> str:
    """One evidence statement's predicate, for ``registry evidence REF --show DIGEST``."""
    return json.dumps(
        {"digest": evidence.digest, "signers": list(evidence.signers), "predicate": evidence.predicate},
        indent=2,
        sort_keys=True,
    )
