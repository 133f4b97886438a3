"""Reading a tag's verified history from the store, and moving a tag (create-only, optional retry)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from shardport.provenance import dsse
from shardport.provenance.statement import PAYLOAD_TYPE
from shardport.registry import _failpoints
from shardport.registry.errors import TagMovedError, UnsignedError
from shardport.registry.session import Session
from shardport.registry.store import AlreadyExists, tag_dir, tag_key
from shardport.registry.tags import RollbackOf, SeenTag, TagEntry, next_document, verify_history

_DOC_NAME = re.compile(r"^(\d{12})\.json$")
DEFAULT_VALIDITY = timedelta(days=365)


def read_raw_history(session: Session, name: str, tag: str) -> dict[int, bytes]:
    """Every stored document of a tag, by the version in its key."""
    versions = [
        int(m.group(1)) for n in session.store.listdir(tag_dir(name, tag)) if (m := _DOC_NAME.match(n))
    ]
    if session.store.is_local or len(versions) < 2:  # a pool pays off for object-store round trips only
        return {v: session.store.read(tag_key(name, tag, v)) for v in versions}
    with ThreadPoolExecutor(max_workers=8) as pool:
        raws = pool.map(lambda v: session.store.read(tag_key(name, tag, v)), versions)
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
