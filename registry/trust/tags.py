"""Tag documents and the pure verification of a tag's history.

A tag is a hash-chained sequence of documents, version 1, 2, 3, …; each is an in-toto statement
(subject: the target manifest) in a DSSE envelope, stored create-only. A document's digest is the
sha256 of its stored envelope bytes; each names its predecessor's digest in ``previous``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from shardport.provenance.dsse import Envelope
from shardport.provenance.errors import EnvelopeFormatError
from shardport.provenance.statement import PAYLOAD_TYPE, Statement, Subject
from shardport.registry.artifact.hashing import DIGEST_FORM, digest_bytes, hex_of, is_digest
from shardport.registry.errors import (
    EquivocationError,
    RollbackAttackError,
    SignatureError,
    TagChainError,
    TagExpiredError,
    VerificationError,
)
from shardport.registry.trust.policy import TrustPolicy

if TYPE_CHECKING:
    from shardport.registry.artifact.digests import Digest

TAG_PREDICATE = "https://shardport.dev/tag/v1"
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_time(t: datetime) -> str:
    """RFC 3339 UTC, whole seconds."""
    return t.astimezone(timezone.utc).strftime(TIME_FORMAT)


def parse_time(text: str) -> datetime:
    """Inverse of :func:`format_time`."""
    return datetime.strptime(text, TIME_FORMAT).replace(tzinfo=timezone.utc)


@dataclass(frozen=True, slots=True)
class RollbackOf:
    """Marks an intentional rollback: the head version it undid and why."""

    version: int
    reason: str


@dataclass(frozen=True, slots=True)
class TagDocument:
    """One version of a tag."""

    repository: str
    tag: str
    version: int
    target: str
    previous: str | None
    issued_at: str
    expires: str
    signer: str | None = None
    rollback_of: RollbackOf | None = None

    def statement(self) -> Statement:
        """The in-toto statement this document is signed as."""
        predicate: dict[str, Any] = {
            "repository": self.repository,
            "tag": self.tag,
            "version": self.version,
            "target": self.target,
            "previous": self.previous,
            "issued_at": self.issued_at,
            "expires": self.expires,
            "signer": self.signer,
            "rollback_of": (
                {"version": self.rollback_of.version, "reason": self.rollback_of.reason}
                if self.rollback_of
                else None
            ),
        }
        return Statement(
            subjects=(Subject(name=f"{self.repository}@{self.target}", sha256=hex_of(self.target)),),
            predicate_type=TAG_PREDICATE,
            predicate=predicate,
        )

    @classmethod
    def from_statement(cls, st: Statement, *, source: str) -> TagDocument:
        """Read a document back from its statement; errors name ``source``."""
        if st.predicate_type != TAG_PREDICATE:
            raise TagChainError(f"{source}: predicateType {st.predicate_type!r}, expected {TAG_PREDICATE!r}")
        p = st.predicate
        try:
            rb = p.get("rollback_of")
            doc = cls(
                repository=str(p["repository"]),
                tag=str(p["tag"]),
                version=int(p["version"]),
                target=str(p["target"]),
                previous=None if p.get("previous") is None else str(p["previous"]),
                issued_at=str(p["issued_at"]),
                expires=str(p["expires"]),
                signer=None if p.get("signer") is None else str(p["signer"]),
                rollback_of=RollbackOf(version=int(rb["version"]), reason=str(rb["reason"])) if rb else None,
            )
            parse_time(doc.issued_at)
            parse_time(doc.expires)
        except (KeyError, TypeError, ValueError) as exc:
            raise TagChainError(f"{source}: malformed tag document ({exc})") from exc
        for field, value in (("target", doc.target), ("previous", doc.previous)):
            if value is not None and not is_digest(value):
                raise TagChainError(f"{source}: field {field!r} = {value!r}: expected {DIGEST_FORM}")
        if [s.sha256 for s in st.subjects] != [hex_of(doc.target)]:
            raise TagChainError(f"{source}: statement subject does not match target {doc.target}")
        return doc


@dataclass(frozen=True, slots=True)
class TagEntry:
    """A stored tag document with its envelope, digest and the trusted keys that signed it."""

    doc: TagDocument
    raw: bytes
    digest: Digest
    signers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SeenTag:
    """What a client last trusted for a tag."""

    version: int
    digest: Digest


def _parse_entry(raw: bytes, source: str) -> tuple[Envelope, TagDocument]:
    try:
        env = Envelope.from_bytes(raw, source=source)
    except EnvelopeFormatError as exc:
        raise TagChainError(str(exc)) from exc
    if env.payload_type != PAYLOAD_TYPE:
        raise TagChainError(f"{source}: payloadType {env.payload_type!r}, expected {PAYLOAD_TYPE!r}")
    try:
        st = Statement.from_bytes(env.payload)
    except ValueError as exc:
        raise TagChainError(f"{source}: {exc}") from exc
    return env, TagDocument.from_statement(st, source=source)


def verify_history(
    raws: Mapping[int, bytes],
    *,
    repository: str,
    tag: str,
    policy: TrustPolicy,
    seen: SeenTag | None,
    now: datetime,
    allow_unsigned: bool = False,
) -> list[TagEntry]:
    """Verify every document of a tag and return them in version order.

    ``raws`` maps the version in each document's key to its stored bytes. Refuses a gap or a broken
    chain, a document whose content disagrees with its key, a lower version than ``seen`` (rollback or
    replay), a different document at ``seen``'s version (equivocation), an expired newest document
    (freeze), and — unless ``allow_unsigned`` — documents newer than ``seen`` that no trusted, in-scope
    key signed.
    """
    label = f"tag {repository}:{tag}"
    versions = sorted(raws)
    if versions != list(range(1, len(versions) + 1)):
        raise TagChainError(f"{label}: versions {versions} are not contiguous from 1 (deleted documents?)")
    if seen and seen.version > len(versions):
        raise RollbackAttackError(
            f"{label}: the store offers version {len(versions)} but this client already saw version "
            f"{seen.version} ({seen.digest}); refusing a replayed or rolled-back tag"
        )
    entries: list[TagEntry] = []
    previous: str | None = None
    for v in versions:
        raw = raws[v]
        source = f"{label} version {v}"
        env, doc = _parse_entry(raw, source)
        digest = digest_bytes(raw)
        if (doc.repository, doc.tag, doc.version) != (repository, tag, v):
            raise TagChainError(
                f"{source}: document says {doc.repository}:{doc.tag} version {doc.version} "
                "(a replayed or misplaced document)"
            )
        if doc.previous != previous:
            raise TagChainError(f"{source}: previous is {doc.previous}, expected {previous} (broken chain)")
        if seen and v == seen.version and digest != seen.digest:
            raise EquivocationError(
                f"{source}: the store offers document {digest}, but this client already trusted "
                f"{seen.digest} for this version (equivocation)"
            )
        signers: tuple[str, ...] = ()
        must_trust = seen is None or v > seen.version or v == versions[-1]
        if must_trust and not allow_unsigned:
            signers = tuple(policy.check(env, what=source, repository=repository, tag=tag))
        elif env.signatures:
            try:
                signers = tuple(policy.check(env, what=source, repository=repository, tag=tag))
            except SignatureError:
                signers = ()
        entries.append(TagEntry(doc=doc, raw=raw, digest=digest, signers=signers))
        previous = digest
    if entries:
        head = entries[-1].doc
        if parse_time(head.expires) <= now:
            raise TagExpiredError(
                f"{label} version {head.version} expired at {head.expires}; the tag must be re-signed "
                "(registry tag) — an expired head may be a freeze attack"
            )
    return entries


def next_document(
    entries: list[TagEntry],
    *,
    repository: str,
    tag: str,
    target: str,
    signer: str | None,
    now: datetime,
    valid_for: timedelta,
    rollback_of: RollbackOf | None = None,
) -> TagDocument:
    """The document that moves a tag (whose history is ``entries``) to ``target``."""
    if valid_for <= timedelta(0):
        raise VerificationError("tag validity must be positive")
    return TagDocument(
        repository=repository,
        tag=tag,
        version=len(entries) + 1,
        target=target,
        previous=entries[-1].digest if entries else None,
        issued_at=format_time(now),
        expires=format_time(now + valid_for),
        signer=signer,
        rollback_of=rollback_of,
    )
