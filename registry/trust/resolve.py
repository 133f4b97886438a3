"""Resolve a reference to a verified manifest: tag history, manifest digest, signatures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardport.registry.artifact.manifest import Manifest
from shardport.registry.artifact.manifest_check import check_manifest
from shardport.registry.artifact.refs import Ref
from shardport.registry.errors import NotFoundError
from shardport.registry.session import Session
from shardport.registry.trust.signatures import verify_manifest
from shardport.registry.trust.tagging import history
from shardport.registry.trust.tags import TagEntry

if TYPE_CHECKING:
    from shardport.registry.artifact.digests import Digest


@dataclass(frozen=True)
class Resolved:
    """A reference resolved once to a digest, with what was verified on the way."""

    ref: Ref
    digest: Digest
    manifest: Manifest
    raw: bytes
    tag_entry: TagEntry | None
    signers: tuple[str, ...]


def resolve(session: Session, ref: Ref) -> Resolved:
    """Resolve ``ref``: verify the tag history (for ``NAME:TAG``), the manifest digest and signature.

    The manifest must also be consistent (:func:`check_manifest`): everything that resolves a reference
    (pull, rank pulls, inspect, tag, rollback, verify REF, decode) refuses one that is not.
    """
    entry = None
    if ref.tag is not None:
        entries = history(session, ref.name, ref.tag)
        if not entries:
            raise NotFoundError(f"tag {ref}: not found in store {session.store.url}")
        entry = entries[-1]
        digest = entry.doc.target
    else:
        assert ref.digest is not None
        digest = ref.digest
    try:
        raw = session.store.read_blob(digest)
    except NotFoundError as exc:
        raise NotFoundError(f"manifest {digest} ({ref}): not found in store {session.store.url}") from exc
    manifest = Manifest.from_bytes(raw, source=f"manifest {digest}")
    signers = verify_manifest(session, ref.name, digest, ref.tag)
    check_manifest(manifest, source=f"manifest {digest}")
    return Resolved(
        ref=ref, digest=digest, manifest=manifest, raw=raw, tag_entry=entry, signers=tuple(signers)
    )
