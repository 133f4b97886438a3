"""Reading a tag's verified history from the store, and moving a tag (create-only, optional retry)."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from shardport.provenance import dsse
from shardport.provenance.statement import PAYLOAD_TYPE
from shardport.registry import _failpoints
from shardport.registry.errors import TagMovedError, UnsignedError, UntrustedSignerError, UsageError
from shardport.registry.session import Session
from shardport.registry.store.keys import tag_dir, tag_key
from shardport.registry.store.protocol import AlreadyExists
from shardport.registry.trust.tags import RollbackOf, SeenTag, TagEntry, next_document, verify_history

_DOC_NAME = re.compile(r"([0-9]{12})\.json")
DEFAULT_VALIDITY = timedelta(days=365)
MIN_VALIDITY = timedelta(seconds=1)  # documents carry whole seconds: less would publish an expired head
MAX_VALIDITY_DAYS = 36525.0  # 100 years


def validity(days: float, *, option: str = "--expires-days") -> timedelta:
    """``days`` as a tag document's validity, or :class:`UsageError` (checked before anything is written).

    Refused: NaN, infinities, anything under one second (the head would be expired when published,
    since document times have whole seconds) and anything over 100 years.
    """
    if not math.isfinite(days) or days * 86400.0 < MIN_VALIDITY.total_seconds():
        raise UsageError(
            f"{option} {days!r}: expected a finite number of days of at least "
            f"{MIN_VALIDITY.total_seconds() / 86400:.6f} (one second) and at most {MAX_VALIDITY_DAYS:g}"
        )
    if days > MAX_VALIDITY_DAYS:
        raise UsageError(f"{option} {days!r}: at most {MAX_VALIDITY_DAYS:g} days (100 years)")
    return timedelta(days=days)


def require_signing_scope(session: Session, name: str, tag: str) -> None:
    """Refuse, before anything is written, a signing key whose documents this client would refuse.

    A tag document for ``name:tag`` is read back through the trust policy right after it is written;
    a key the policy does not list, or whose scopes do not allow ``name:tag``, would leave a version
    in the store that no client accepts.
    """
    key = session.key
    if key is None:
        return
    listed = [k for k in session.policy.keys if k.key.keyid == key.keyid]
    if not listed:
        raise UntrustedSignerError(
            f"tag {name}:{tag}: the signing key {key.keyid} is not in the trust policy, so the tag "
            "document it signs would be refused; add its public key with --trust FILE|PUBKEY or to "
            "$SHARDPORT_HOME/trust.json (`registry keygen` does this for keys it makes)"
        )
    if not any(k.allows(name, tag) for k in listed):
        scopes = ", ".join(s for k in listed for s in k.scopes)
        raise UntrustedSignerError(
            f"tag {name}:{tag}: the signing key {key.keyid} ({listed[0].name}) has scopes [{scopes}], "
            f"which the trust policy does not allow for {name}:{tag}; nothing was written"
        )


def read_raw_history(session: Session, name: str, tag: str) -> dict[int, bytes]:
    """Every stored document of a tag, by the version in its key."""
    versions = [
        int(m.group(1)) for n in session.store.listdir(tag_dir(name, tag)) if (m := _DOC_NAME.fullmatch(n))
    ]
    raws = session.store.read_many([tag_key(name, tag, v) for v in versions])  # S3: overlapped GETs
    return dict(zip(versions, raws, strict=True))


def history(session: Session, name: str, tag: str, *, remember: bool = True) -> list[TagEntry]:
    """The tag's documents, verified against the trust policy and this client's trusted state.

    With ``remember``, the state advances to the newest verified document.
    """
    # Read the trusted state before listing: the state only ever names documents that were already
    # stored, so a listing taken afterwards contains them (a concurrent writer may add more).
    seen = session.state.get(name, tag)
    entries = verify_history(
        read_raw_history(session, name, tag),
        repository=name,
        tag=tag,
        policy=session.policy,
        seen=seen,
        now=session.clock(),
        allow_unsigned=session.allow_unsigned,
    )
    if entries and remember and (seen is None or seen.version < entries[-1].doc.version):
        session.state.advance(name, tag, SeenTag(version=entries[-1].doc.version, digest=entries[-1].digest))
    return entries


def repositories(session: Session) -> list[str]:
    """Every repository name in the store (names may contain ``/``)."""
    found = set()
    for obj in session.store.walk("repos"):
        parts = obj.key.split("/")
        for marker in ("tags", "referrers"):
            if marker in parts[2:]:
                idx = parts.index(marker, 2)
                found.add("/".join(parts[1:idx]))
    return sorted(found)


def list_tags(session: Session, name: str) -> list[str]:
    """Tags of a repository."""
    return session.store.listdir(f"repos/{name}/tags")


def move_tag(
    session: Session,
    name: str,
    tag: str,
    target: str,
    *,
    rollback_of: RollbackOf | None = None,
    retries: int = 0,
    valid_for: timedelta = DEFAULT_VALIDITY,
) -> TagEntry:
    """Write the next version of ``name:tag`` pointing at ``target``.

    Exactly one concurrent writer wins each version; a loser re-reads and tries again up to
    ``retries`` times, then raises :class:`TagMovedError`.
    """
    if session.key is None and not session.allow_unsigned:
        raise UnsignedError(
            f"moving tag {name}:{tag} needs a signing key: run `registry keygen`, pass --key FILE, "
            "or --allow-unsigned"
        )
    require_signing_scope(session, name, tag)
    if valid_for < MIN_VALIDITY:
        raise UsageError(f"tag {name}:{tag}: validity {valid_for} is under {MIN_VALIDITY}")
    attempt = 0
    while True:
        entries = history(session, name, tag)
        doc = next_document(
            entries,
            repository=name,
            tag=tag,
            target=target,
            signer=session.key.keyid if session.key else None,
            now=session.clock(),
            valid_for=valid_for,
            rollback_of=rollback_of,
        )
        keys = [session.key] if session.key else []
        raw = dsse.sign(PAYLOAD_TYPE, doc.statement().to_bytes(), keys).to_bytes()
        session.store.put_blob(raw)
        _failpoints.hit("tagdoc-blob-written")
        try:
            session.store.create_only(tag_key(name, tag, doc.version), raw)
        except AlreadyExists as exc:
            attempt += 1
            if attempt > retries:
                raise TagMovedError(
                    f"tag {name}:{tag} moved: another writer created version {doc.version} first; "
                    "re-run the command (or pass --retry N)"
                ) from exc
            continue
        entries = history(session, name, tag)
        return entries[doc.version - 1]
