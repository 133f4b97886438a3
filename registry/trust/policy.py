"""Trust policy: which Ed25519 keys may sign which repositories and tags. Pure decisions; no I/O.

Policy file (JSON)::

    {"version": 1,
     "keys": [{"keyid": "ed25519:…", "name": "ci", "public_key": "-----BEGIN PUBLIC KEY-----…",
               "scopes": ["*"]}]}

A scope is a glob matched against the repository name (``acme/*``) or, when it contains ``:``,
against ``name:tag`` (``acme/llama:prod``). ``*`` and ``?`` stay within one ``/``-separated segment
(``acme/*`` matches ``acme/llama`` but not ``acme/team/llama``); ``**`` crosses segments
(``acme/**``). A scope that is exactly ``*`` (the default) or ``**`` allows every repository and tag.
Manifests are signed for a repository, but a tag-scoped key is accepted for a manifest reached
through a tag its scope allows (the resolver passes the tag it resolved).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

from shardport.provenance.dsse import Envelope
from shardport.provenance.errors import KeyFormatError
from shardport.provenance.keys import VerifyingKey
from shardport.registry.errors import (
    SignatureError,
    UnsignedError,
    UntrustedSignerError,
    UsageError,
)


@functools.lru_cache(maxsize=256)
def _glob(pattern: str) -> re.Pattern[str]:
    """Compile a scope glob: ``**`` any characters, ``*`` any within a segment, ``?`` one such."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def scope_matches(scope: str, repository: str, tag: str | None) -> bool:
    """Whether ``scope`` allows ``repository`` (and, for a ``name:tag`` scope, ``tag``).

    A repository scope allows every tag of the repositories it matches; a ``name:tag`` scope allows
    only content reached through a matching tag, so it never matches when ``tag`` is None.
    """
    if scope in ("*", "**"):
        return True
    if ":" in scope:
        repo_glob, _, tag_glob = scope.rpartition(":")
        return (
            tag is not None
            and _glob(repo_glob).fullmatch(repository) is not None
            and _glob(tag_glob).fullmatch(tag) is not None
        )
    return _glob(scope).fullmatch(repository) is not None


@dataclass(frozen=True)
class TrustedKey:
    """A key the policy lists, with its name and scopes."""

    key: VerifyingKey
    name: str
    scopes: tuple[str, ...]

    def allows(self, repository: str, tag: str | None) -> bool:
        """Whether this key may sign for ``repository`` (and ``tag``, when given)."""
        return any(scope_matches(scope, repository, tag) for scope in self.scopes)


@dataclass(frozen=True)
class SigstoreIdentity:
    """A keyless (Sigstore) signer the policy trusts: certificate identity, OIDC issuer, trusted root."""

    identity: str
    issuer: str
    trusted_root: str
    scopes: tuple[str, ...] = ("*",)

    def allows(self, repository: str, tag: str | None = None) -> bool:
        """Whether this identity may sign manifests of ``repository`` (reached through ``tag``)."""
        return any(scope_matches(scope, repository, tag) for scope in self.scopes)


@dataclass(frozen=True)
class TrustPolicy:
    """The set of trusted keys and keyless identities."""

    keys: tuple[TrustedKey, ...] = ()
    sigstore: tuple[SigstoreIdentity, ...] = ()

    @classmethod
    def parse(cls, data: bytes, *, source: str, key_name: str) -> TrustPolicy:
        """A policy from a policy file's bytes, or from a PEM public key (trusted for everything).

        ``source`` names the file in errors; ``key_name`` names a PEM key's entry. A keyless identity's
        ``trusted_root`` stays as written (relative to the policy's folder; :func:`~.policy_file.load_policy`
        resolves it on disk).
        """
        if data.lstrip().startswith(b"-----BEGIN"):
            try:
                key = VerifyingKey.from_pem(data, source=source)
            except KeyFormatError as exc:
                raise UsageError(str(exc)) from exc
            return cls(keys=(TrustedKey(key=key, name=key_name, scopes=("*",)),))
        try:
            doc = json.loads(data)
            keys = tuple(
                TrustedKey(
                    key=VerifyingKey.from_pem(
                        k["public_key"].encode(), source=f"{source}: key {k.get('name')}"
                    ),
                    name=str(k.get("name", "")),
                    scopes=tuple(str(s) for s in k.get("scopes", ["*"])),
                )
                for k in doc.get("keys", [])
            )
            idents = tuple(
                SigstoreIdentity(
                    identity=str(i["identity"]),
                    issuer=str(i["issuer"]),
                    trusted_root=str(i["trusted_root"]),
                    scopes=tuple(str(s) for s in i.get("scopes", ["*"])),
                )
                for i in doc.get("sigstore", [])
            )
        except (ValueError, RecursionError, KeyError, TypeError, AttributeError, KeyFormatError) as exc:
            raise UsageError(f"trust policy {source}: malformed ({exc}); expected {{'keys': [...]}}") from exc
        return cls(keys=keys, sigstore=idents)

    def to_bytes(self) -> bytes:
        """The policy file's bytes (JSON, indented)."""
        doc = {
            "version": 1,
            "keys": [
                {
                    "keyid": k.key.keyid,
                    "name": k.name,
                    "public_key": k.key.to_pem().decode(),
                    "scopes": list(k.scopes),
                }
                for k in self.keys
            ],
            "sigstore": [
                {
                    "identity": i.identity,
                    "issuer": i.issuer,
                    "trusted_root": i.trusted_root,
                    "scopes": list(i.scopes),
                }
                for i in self.sigstore
            ],
        }
        return (json.dumps(doc, indent=2) + "\n").encode()

    def with_key(self, key: VerifyingKey, name: str, scopes: tuple[str, ...] = ("*",)) -> TrustPolicy:
        """A copy with ``key`` added (or its entry replaced)."""
        kept = tuple(k for k in self.keys if k.key.keyid != key.keyid)
        return TrustPolicy(
            keys=(*kept, TrustedKey(key=key, name=name, scopes=scopes)), sigstore=self.sigstore
        )

    def name_of(self, keyid: str) -> str | None:
        """The policy's name for ``keyid``."""
        for k in self.keys:
            if k.key.keyid == keyid:
                return k.name
        return None

    def check(self, envelope: Envelope, *, what: str, repository: str, tag: str | None = None) -> list[str]:
        """Return the key ids of trusted, in-scope keys that signed ``envelope``; else raise.

        ``what`` names the signed object in messages (e.g. ``tag acme/m:prod version 3``).
        """
        if not envelope.signatures:
            raise UnsignedError(f"{what} is unsigned; pass --allow-unsigned to accept unsigned content")
        good = envelope.signed_by(k.key for k in self.keys)
        if not good:
            ids = ", ".join(sorted({s.keyid for s in envelope.signatures}))
            listed = {k.key.keyid for k in self.keys}
            if any(s.keyid in listed for s in envelope.signatures):
                raise SignatureError(
                    f"{what}: signature by {ids} does not verify (the signed content was altered)"
                )
            raise UntrustedSignerError(
                f"{what}: signed by {ids}, which the trust policy does not list; add the key with "
                "--trust FILE|PUBKEY or to $SHARDPORT_HOME/trust.json"
            )
        by_id = {k.key.keyid: k for k in self.keys}
        allowed = [k.keyid for k in good if by_id[k.keyid].allows(repository, tag)]
        if not allowed:
            scope = f"{repository}:{tag}" if tag else repository
            raise UntrustedSignerError(
                f"{what}: signed by {', '.join(k.keyid for k in good)}, which the trust policy does not "
                f"allow for {scope}"
            )
        return allowed
