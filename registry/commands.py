"""Library functions behind the small commands: keygen, tag, rollback, log, ls, inspect."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from shardport.provenance.keys import SigningKey
from shardport.registry import home
from shardport.registry.artifact.refs import Ref
from shardport.registry.errors import NotFoundError, UsageError
from shardport.registry.session import Session
from shardport.registry.trust.policy_file import load_policy, save_policy
from shardport.registry.trust.signatures import SIGNATURE_ARTIFACT, attach, referrers, sign_manifest
from shardport.registry.trust.tagging import (
    DEFAULT_VALIDITY,
    history,
    list_tags,
    move_tag,
    repositories,
    require_signing_scope,
)
from shardport.registry.trust.tags import RollbackOf, TagEntry

_KEY_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a whole-string match: names become file names


def keygen(name: str = "default", scopes: tuple[str, ...] = ("*",)) -> dict[str, str]:
    """Make an Ed25519 key pair under ``$SHARDPORT_HOME/keys`` and trust it locally."""
    if not _KEY_NAME.fullmatch(name):
        raise UsageError(f"key name {name!r}: use 1-64 ASCII letters, digits, '-' and '_'")
    private = home.keys_dir() / f"{name}.key"
    public = home.keys_dir() / f"{name}.pub"
    if private.exists():
        raise UsageError(f"key {private} already exists; pick another --name or remove it first")
    key = SigningKey.generate()
    key.save(private, public)
    policy = load_policy(home.trust_path()).with_key(key.verifying_key(), name, scopes)
    save_policy(policy, home.trust_path())
    return {
        "keyid": key.keyid,
        "private_key": str(private),
        "public_key": str(public),
        "trust": str(home.trust_path()),
    }


def entry_json(session: Session, e: TagEntry) -> dict[str, Any]:
    """One tag version for ``log`` and ``--json`` output."""
    return {
        "version": e.doc.version,
        "target": e.doc.target,
        "issued_at": e.doc.issued_at,
        "expires": e.doc.expires,
        "signer": e.doc.signer,
        "signer_name": session.policy.name_of(e.doc.signer) if e.doc.signer else None,
        "verified_signers": list(e.signers),
        "rollback_of": (
            {"version": e.doc.rollback_of.version, "reason": e.doc.rollback_of.reason}
            if e.doc.rollback_of
            else None
        ),
        "document": e.digest,
    }


def tag(
    session: Session,
    ref: Ref,
    name: str,
    tag_name: str,
    *,
    retries: int = 0,
    valid_for: timedelta = DEFAULT_VALIDITY,
) -> dict[str, Any]:
    """Point ``name:tag_name`` at what ``ref`` resolves to (verified)."""
    require_signing_scope(session, name, tag_name)
    from shardport.registry.trust.resolve import resolve  # manifests load pydantic: only where one is read

    resolved = resolve(session, ref)
    if name != ref.name:  # the manifest's signatures follow it into the other repository
        for blob in referrers(session, ref.name, resolved.digest, SIGNATURE_ARTIFACT):
            attach(session, name, resolved.digest, blob, SIGNATURE_ARTIFACT)
        sign_manifest(session, name, resolved.digest)
    entry = move_tag(session, name, tag_name, resolved.digest, retries=retries, valid_for=valid_for)
    return {"ref": f"{name}:{tag_name}", "digest": resolved.digest, "version": entry.doc.version}


def rollback(
    session: Session, ref: Ref, *, to: str | None, steps: int | None, reason: str, retries: int = 0
) -> dict[str, Any]:
    """Move ``ref``'s tag back to an earlier target of its history, recording ``rollback_of``."""
    assert ref.tag is not None
    entries = history(session, ref.name, ref.tag)
    if not entries:
        raise NotFoundError(f"tag {ref}: not found")
    head = entries[-1]
    if steps is not None:
        if steps < 1 or steps >= head.doc.version:
            raise UsageError(
                f"--steps {steps}: tag {ref} is at version {head.doc.version}; use 1..{head.doc.version - 1}"
            )
        target = entries[head.doc.version - steps - 1].doc.target
    elif to is not None:
        if not any(e.doc.target == to for e in entries[:-1]):
            raise NotFoundError(f"{to} is not an earlier target of tag {ref}; see `registry log {ref}`")
        target = to
    else:
        raise UsageError("rollback needs --to DIGEST or --steps N")
    if target == head.doc.target:
        raise UsageError(f"tag {ref} already points at {target}")
    from shardport.registry.trust.resolve import resolve

    resolve(session, Ref(name=ref.name, digest=target))
    entry = move_tag(
        session,
        ref.name,
        ref.tag,
        target,
        rollback_of=RollbackOf(version=head.doc.version, reason=reason),
        retries=retries,
    )
    return {"ref": str(ref), "digest": target, "version": entry.doc.version, "rolled_back": head.doc.version}


def log(session: Session, ref: Ref) -> list[dict[str, Any]]:
    """The tag's verified history, oldest first."""
    assert ref.tag is not None
    entries = history(session, ref.name, ref.tag)
    if not entries:
        raise NotFoundError(f"tag {ref}: not found")
    return [entry_json(session, e) for e in entries]


def ls(session: Session, name: str | None) -> list[dict[str, Any]]:
    """Repositories and their tags (with the newest version of each)."""
    names = [name] if name else repositories(session)
    out = []
    for n in names:
        tags = []
        for t in list_tags(session, n):
            entries = history(session, n, t, remember=False)
            if entries:
                tags.append({"tag": t, "version": entries[-1].doc.version, "target": entries[-1].doc.target})
        out.append({"name": n, "tags": tags})
    if name and not out[0]["tags"]:
        raise NotFoundError(f"repository {name}: no tags in store {session.store.url}")
    return out


def inspect(session: Session, ref: Ref) -> dict[str, Any]:
    """The verified manifest of ``ref``: digest, versions, files (and ``e_quant`` where push measured it)."""
    from shardport.registry.trust.resolve import resolve

    resolved = resolve(session, ref)
    out: dict[str, Any] = {
        "ref": str(ref),
        "digest": resolved.digest,
        "signers": list(resolved.signers),
        "manifest": resolved.manifest.model_dump(mode="json", by_alias=True),
    }
    quant = resolved.manifest.quantization.quant_error
    if quant:  # push --reference measured it: the headline beside the per-weight record in the manifest
        top = max(quant, key=lambda w: (quant[w].e_quant, w))
        out["e_quant"] = {
            "weights": len(quant),
            "max": quant[top].e_quant,
            "weight": top,
            "over_tolerance": sorted(w for w, q in quant.items() if not q.e_quant <= q.tolerance),
        }
    if ref.tag:
        out["versions"] = [entry_json(session, e) for e in history(session, ref.name, ref.tag)]
    return out
