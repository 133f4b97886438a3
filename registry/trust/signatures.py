"""Manifest signatures: DSSE envelopes over an in-toto statement whose subject is the manifest.

Stored as blobs and attached to the manifest with a referrer key
``repos/<name>/referrers/<manifest-hex>/<blob-hex>`` whose content names the artifact type.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from shardport.provenance import dsse
from shardport.provenance.dsse import Envelope
from shardport.provenance.errors import EnvelopeFormatError
from shardport.provenance.statement import PAYLOAD_TYPE, Statement, Subject
from shardport.registry.artifact.hashing import hex_of, is_digest
from shardport.registry.errors import SignatureError, UnsignedError, UntrustedSignerError, VerificationError
from shardport.registry.session import Session
from shardport.registry.store.keys import referrer_key

if TYPE_CHECKING:
    from shardport.registry.artifact.digests import Digest

SIGNATURE_PREDICATE = "https://shardport.dev/manifest-signature/v1"
SIGNATURE_ARTIFACT = "application/vnd.shardport.signature.v1+json"
SIGSTORE_ARTIFACT = "application/vnd.dev.sigstore.bundle.v0.3+json"


def manifest_statement(name: str, manifest_digest: Digest) -> Statement:
    """The statement a manifest signature signs."""
    return Statement(
        subjects=(Subject(name=f"{name}@{manifest_digest}", sha256=hex_of(manifest_digest)),),
        predicate_type=SIGNATURE_PREDICATE,
        predicate={"repository": name, "manifest": manifest_digest},
    )


def attach(session: Session, name: str, manifest: str, blob: str, artifact_type: str) -> None:
    """Attach ``blob`` to ``manifest`` in repository ``name``."""
    body = json.dumps({"artifactType": artifact_type, "digest": blob}, sort_keys=True).encode()
    session.store.put(referrer_key(name, manifest, blob), body)


def referrers(session: Session, name: str, manifest: str, artifact_type: str | None = None) -> list[str]:
    """Digests of the blobs attached to ``manifest`` (optionally of one artifact type)."""
    folder = f"repos/{name}/referrers/{hex_of(manifest)}"
    out = []
    for child in session.store.listdir(folder):
        try:
            doc = json.loads(session.store.read(f"{folder}/{child}"))
        except (ValueError, RecursionError):
            continue
        if isinstance(doc, dict) and (artifact_type is None or doc.get("artifactType") == artifact_type):
            digest = doc.get("digest")
            if is_digest(digest) and hex_of(digest) == child:  # a malformed link attaches nothing
                out.append(digest)
    return out


def sign_manifest(session: Session, name: str, manifest: str) -> str | None:
    """Sign ``manifest`` with the session key, store and attach the envelope; return its digest."""
    if session.key is None:
        return None
    env = dsse.sign(PAYLOAD_TYPE, manifest_statement(name, manifest).to_bytes(), [session.key])
    blob = session.store.put_blob(env.to_bytes())
    attach(session, name, manifest, blob, SIGNATURE_ARTIFACT)
    return blob


def attach_sigstore_bundle(session: Session, name: str, manifest: str, bundle: bytes) -> str:
    """Store a Sigstore bundle over ``manifest``'s statement and attach it."""
    blob = session.store.put_blob(bundle)
    attach(session, name, manifest, blob, SIGSTORE_ARTIFACT)
    return blob


def check_sigstore_bundle(
    session: Session, raw: bytes, name: str, manifest: str, source: str, tag: str | None = None
) -> list[str]:
    """Verify a Sigstore bundle offline against the policy's keyless identities; return the signers.

    ``tag``: the tag through which the manifest was reached (tag-scoped identities need it).
    """
    from shardport.provenance.errors import ProvenanceError
    from shardport.provenance.sigstore_signing import verify_bundle_offline

    allowed = [i for i in session.policy.sigstore if i.allows(name, tag)]
    if not allowed:
        raise UntrustedSignerError(
            f"{source}: a Sigstore bundle, but the trust policy lists no Sigstore identity for {name}"
        )
    reasons = []
    for ident in allowed:
        try:
            verified = verify_bundle_offline(
                raw,
                artifact=None,
                trusted_root_path=Path(ident.trusted_root),
                identity=ident.identity,
                issuer=ident.issuer,
            )
        except ProvenanceError as exc:
            reasons.append(str(exc))
            continue
        try:
            st = Statement.from_bytes(verified.statement or b"")
        except ValueError as exc:
            raise SignatureError(f"{source}: {exc}") from exc
        if st.predicate_type != SIGNATURE_PREDICATE or [s.sha256 for s in st.subjects] != [hex_of(manifest)]:
            raise SignatureError(
                f"{source}: a valid Sigstore bundle by {ident.identity}, but it does not sign "
                f"manifest {manifest}"
            )
        return [f"sigstore:{ident.identity}"]
    raise SignatureError(f"{source}: Sigstore bundle does not verify: {'; '.join(reasons)}")


def check_envelope(
    session: Session, raw: bytes, name: str, manifest: str, source: str, tag: str | None = None
) -> list[str]:
    """Verify one signature envelope of ``manifest``; return the trusted key ids that signed it.

    ``tag``: the tag through which the manifest was reached, so that a key scoped to ``name:tag`` is
    accepted for what it pushed there (None when the manifest was named by digest).
    """
    try:
        env = Envelope.from_bytes(raw, source=source)
        st = Statement.from_bytes(env.payload)
    except (EnvelopeFormatError, ValueError) as exc:
        raise SignatureError(f"{source}: {exc}") from exc
    if st.predicate_type != SIGNATURE_PREDICATE or [s.sha256 for s in st.subjects] != [hex_of(manifest)]:
        raise SignatureError(f"{source}: does not sign manifest {manifest}")
    return session.policy.check(env, what=f"manifest {manifest} ({source})", repository=name, tag=tag)


def verify_manifest(session: Session, name: str, manifest: str, tag: str | None = None) -> list[str]:
    """Key ids of trusted signers of ``manifest``; raise unless ``allow_unsigned``.

    ``tag``: the tag the manifest was resolved through, if any (see :func:`check_envelope`).
    """
    blobs = referrers(session, name, manifest, SIGNATURE_ARTIFACT)
    errors: list[VerificationError] = []
    signers: list[str] = []
    for blob in blobs:
        try:
            raw = session.store.read_blob(blob)
            signers += check_envelope(session, raw, name, manifest, f"signature {blob}", tag)
        except VerificationError as exc:
            errors.append(exc)
    for blob in referrers(session, name, manifest, SIGSTORE_ARTIFACT):
        try:
            raw = session.store.read_blob(blob)
            signers += check_sigstore_bundle(session, raw, name, manifest, f"Sigstore bundle {blob}", tag)
        except VerificationError as exc:
            errors.append(exc)
    if signers or session.allow_unsigned:
        return sorted(set(signers))
    if errors:
        raise errors[0]
    raise UnsignedError(
        f"manifest {manifest} in {name} has no signature; pass --allow-unsigned to accept unsigned content"
    )
