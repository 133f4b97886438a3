"""Sigstore keyless signing of in-toto statements, and offline verification of Sigstore bundles.

Consumes: in-toto Statement v1 bytes (to sign); a Sigstore bundle (JSON bytes), the artifact it
signs, a trusted-root JSON file and the signer identity and OIDC issuer expected (to verify).
Produces: Sigstore bundle JSON bytes (a DSSE envelope, a Fulcio certificate and a Rekor entry), and
:class:`VerifiedBundle` records.

Signing needs the network (the Sigstore TUF repository, Fulcio, Rekor) and an OIDC identity, either
given or found in the environment (GitHub Actions, GitLab CI, Buildkite, CircleCI, GCP). Where either
is missing it fails within seconds with :class:`SigstoreUnavailableError`, never by waiting on a
browser or a dead connection; an Ed25519 key is the offline alternative. Verification never touches
the network: its trust comes only from the trusted-root file it is given.

The ``sigstore`` package is imported lazily, on first use.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import socket
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from shardport.provenance.errors import (
    SigstoreSigningError,
    SigstoreUnavailableError,
    SigstoreVerificationError,
)

if TYPE_CHECKING:
    from cryptography.x509 import Certificate
    from sigstore.models import Bundle, TrustedRoot
    from sigstore.oidc import IdentityToken

__all__ = ["INTOTO_PAYLOAD_TYPE", "VerifiedBundle", "sign_statement_sigstore", "verify_bundle_offline"]

INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
_STATEMENT_TYPE_PREFIX = "https://in-toto.io/Statement/"
_PREFLIGHT_TIMEOUT_S = 5.0
_REMEDY = "use an Ed25519 key (registry keygen) instead"
# Fulcio's OIDC issuer extension (v2: a DER UTF8String); v1 (1.3.6.1.4.1.57264.1.1) is raw bytes.
_OIDC_ISSUER_V2_OID = "1.3.6.1.4.1.57264.1.8"


@dataclass(frozen=True, slots=True)
class _Instance:
    """A Sigstore instance, and the endpoints signing must reach (host, port) before it starts."""

    name: str
    endpoints: tuple[tuple[str, int], ...]


# The TUF repository (refreshed before signing) and Fulcio; the Rekor and timestamp URLs come from
# the signing config that TUF delivers, so the library reports those failures itself.
_INSTANCES: dict[bool, _Instance] = {
    False: _Instance("production", (("tuf-repo-cdn.sigstore.dev", 443), ("fulcio.sigstore.dev", 443))),
    True: _Instance("staging", (("tuf-repo-cdn.sigstage.dev", 443), ("fulcio.sigstage.dev", 443))),
}


@dataclass(frozen=True, slots=True)
class VerifiedBundle:
    """What an offline-verified Sigstore bundle establishes.

    ``kind`` is ``"message_signature"`` (a signature over the artifact's bytes) or ``"dsse"`` (a
    DSSE envelope whose payload is an in-toto statement, then in ``statement`` as the exact signed
    bytes). ``identity`` and ``issuer`` are the certificate's subject (e-mail or workflow URI) and
    OIDC issuer, both checked. ``integrated_time`` is the Rekor integration time bound by the log's
    signed entry timestamp; it is ``None`` for Rekor v2 entries, which carry no integration time
    (their time comes from RFC 3161 timestamps, which verification checks).
    """

    kind: Literal["message_signature", "dsse"]
    identity: str
    issuer: str
    integrated_time: datetime | None
    statement: bytes | None


# ---------------------------------------------------------------------------------------- signing


def sign_statement_sigstore(
    statement_bytes: bytes, *, staging: bool = False, identity_token: str | None = None
) -> bytes:
    """Sign an in-toto statement keylessly (DSSE, Fulcio certificate, Rekor entry).

    ``identity_token`` is a raw OIDC token with audience ``sigstore``; when it is ``None`` an ambient
    CI credential is looked for (no interactive browser flow). ``staging`` selects Sigstore's staging
    instance. Returns the Sigstore bundle as JSON bytes.

    Raises :class:`SigstoreUnavailableError` when signing is impossible here (package missing, no
    identity, services unreachable) and :class:`SigstoreSigningError` when the statement is not an
    in-toto Statement v1 or the services refuse the request.
    """
    _require_sigstore()
    from sigstore import dsse
    from sigstore.errors import Error, NetworkError, TUFError
    from sigstore.models import ClientTrustConfig
    from sigstore.oidc import ExpiredIdentity, IdentityError
    from sigstore.sign import SigningContext

    instance = _INSTANCES[staging]
    try:
        statement = dsse.Statement(statement_bytes)
    except Error as exc:
        raise SigstoreSigningError(f"sigstore signs only in-toto Statement v1 documents: {exc}") from exc
    token = _identity_token(identity_token)
    _require_reachable(instance)
    try:
        config = ClientTrustConfig.staging() if staging else ClientTrustConfig.production()
        context = SigningContext.from_trust_config(config)
        with context.signer(token, cache=False) as signer:
            bundle = signer.sign_dsse(statement)
    except (OSError, NetworkError, TUFError, IdentityError, ExpiredIdentity) as exc:
        raise _unavailable(f"Sigstore {instance.name} failed ({type(exc).__name__}: {exc})") from exc
    except Exception as exc:
        raise SigstoreSigningError(
            f"Sigstore {instance.name} refused to sign ({type(exc).__name__}: {exc}); {_REMEDY}"
        ) from exc
    return bundle.to_json().encode("utf-8")


def _unavailable(reason: str) -> SigstoreUnavailableError:
    return SigstoreUnavailableError(
        f"sigstore signing needs network access to Fulcio/Rekor and an OIDC identity: {reason}; {_REMEDY}"
    )


def _require_sigstore() -> None:
    if importlib.util.find_spec("sigstore") is None:
        raise SigstoreUnavailableError(
            f"the 'sigstore' package is not installed: pip install 'sigstore>=3', or {_REMEDY[4:]}"
        )


def _identity_token(explicit: str | None) -> IdentityToken:
    """The OIDC identity to sign as: the token given, else an ambient CI credential."""
    from sigstore.oidc import IdentityError, IdentityToken, detect_credential

    if explicit is None:
        try:
            raw = detect_credential()
        except IdentityError as exc:
            raise _unavailable(f"ambient OIDC credential detection failed ({exc})") from exc
        if raw is None:
            raise _unavailable(
                "no identity_token was given and no ambient OIDC credential was found "
                "(GitHub Actions with id-token: write, GitLab CI, Buildkite, CircleCI or GCP)"
            )
    else:
        raw = explicit
    try:
        return IdentityToken(raw)
    except IdentityError as exc:
        raise _unavailable(f"the OIDC identity token was rejected ({exc})") from exc


def _require_reachable(instance: _Instance) -> None:
    """Open (and close) a TCP connection to each endpoint, or to the HTTPS proxy for it, at once.

    The library's own HTTP calls to Fulcio have no timeout; this check makes "offline" fail in
    seconds. DNS lookups run in the probing threads, so a hung resolver is bounded too.
    """
    probes = [_Probe(host, port) for host, port in instance.endpoints]
    for probe in probes:
        probe.start()
    for probe in probes:
        probe.join(_PREFLIGHT_TIMEOUT_S + 1.0)
    for probe in probes:
        if probe.is_alive():
            raise _unavailable(f"{probe.target} did not answer within {_PREFLIGHT_TIMEOUT_S:g} s (offline?)")
        if probe.error is not None:
            raise _unavailable(f"cannot reach {probe.target} ({probe.error}; offline?)") from probe.error


def _via_proxy(host: str, port: int) -> tuple[str, int]:
    """Where a connection to ``host`` really goes: the HTTPS proxy from the environment, if any."""
    proxy = urllib.request.getproxies().get("https")
    if not proxy or urllib.request.proxy_bypass(host):
        return host, port
    parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if parts.hostname is None:
        return host, port
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


class _Probe(threading.Thread):
    """A daemon thread that tries one TCP connection to an endpoint and records the error, if any."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(name=f"sigstore-preflight-{host}", daemon=True)
        self._address = _via_proxy(host, port)
        self.target = f"{host}:{port}"
        if self._address != (host, port):
            self.target += f" via proxy {self._address[0]}:{self._address[1]}"
        self.error: OSError | None = None

    def run(self) -> None:
        """Connect and close at once; a failure is kept in ``error``."""
        try:
            with socket.create_connection(self._address, timeout=_PREFLIGHT_TIMEOUT_S):
                pass
        except OSError as exc:
            self.error = exc


# ----------------------------------------------------------------------------------- verification


def verify_bundle_offline(
    bundle_json: bytes,
    *,
    artifact: bytes | None,
    trusted_root_path: Path,
    identity: str,
    issuer: str,
) -> VerifiedBundle:
    """Verify a Sigstore bundle offline against a trusted root and a signer policy.

    Message-signature bundles need ``artifact`` (the signed bytes). DSSE bundles must carry an in-toto
    statement; ``artifact`` is optional for them and, when given, its sha256 must be one of the
    statement's subjects. The certificate must chain to a Fulcio CA in ``trusted_root_path``, carry
    the SAN ``identity`` and the OIDC issuer ``issuer``, and the transparency-log entry (and any
    RFC 3161 timestamps) must verify against the logs and authorities of the same file.

    Raises :class:`SigstoreVerificationError` naming the failed check.
    """
    _require_sigstore()
    from sigstore.verify import Verifier

    trusted_root = _load_trusted_root(trusted_root_path)
    bundle, doc = _load_bundle(bundle_json)
    is_dsse = isinstance(doc.get("dsseEnvelope"), dict)
    if not is_dsse and artifact is None:
        raise SigstoreVerificationError(
            "the bundle is a message signature over an artifact: pass the artifact's bytes to verify it"
        )
    policy = _SignerPolicy(identity=identity, issuer=issuer)
    envelope: tuple[str, bytes] | None = None
    try:
        verifier = Verifier(trusted_root=trusted_root)
        if is_dsse:
            envelope = verifier.verify_dsse(bundle, policy)
        elif artifact is not None:
            verifier.verify_artifact(artifact, bundle, policy)
    except Exception as exc:
        raise SigstoreVerificationError(_explain(exc, policy, doc, artifact, trusted_root_path)) from exc
    if envelope is not None:
        _check_statement(*envelope, artifact)
    return VerifiedBundle(
        kind="dsse" if is_dsse else "message_signature",
        identity=identity,
        issuer=issuer,
        integrated_time=_integrated_time(doc),
        statement=envelope[1] if envelope is not None else None,
    )


class _SignerPolicy:
    """A sigstore verification policy: the OIDC issuer, then the SAN identity; remembers what failed.

    The library calls it after the certificate chain and SCT have verified. The comparisons are the
    library's own policies (``OIDCIssuerV2`` when the certificate has it, else ``OIDCIssuer``).
    """

    def __init__(self, *, identity: str, issuer: str) -> None:
        self._identity, self._issuer = identity, issuer
        self.failure: str | None = None

    def verify(self, cert: Certificate) -> None:
        """Raise sigstore's ``VerificationError`` unless ``cert`` names the expected signer."""
        from cryptography.x509 import ExtensionNotFound, ObjectIdentifier
        from sigstore.verify import policy

        issuer_policy: policy.VerificationPolicy
        try:
            cert.extensions.get_extension_for_oid(ObjectIdentifier(_OIDC_ISSUER_V2_OID))
            issuer_policy = policy.OIDCIssuerV2(self._issuer)
        except ExtensionNotFound:
            issuer_policy = policy.OIDCIssuer(self._issuer)
        try:
            issuer_policy.verify(cert)
        except Exception as exc:
            self.failure = f"OIDC issuer mismatch: expected {self._issuer!r} ({exc})"
            raise
        try:
            policy.Identity(identity=self._identity).verify(cert)
        except Exception as exc:
            self.failure = f"signer identity mismatch: expected {self._identity!r} ({exc})"
            raise


def _load_trusted_root(path: Path) -> TrustedRoot:
    from sigstore.models import TrustedRoot

    try:
        return TrustedRoot.from_file(str(path))
    except OSError as exc:
        raise SigstoreVerificationError(f"cannot read trusted root {path}: {exc.strerror}") from exc
    except Exception as exc:
        raise SigstoreVerificationError(f"{path} is not a Sigstore trusted root: {exc}") from exc


def _load_bundle(bundle_json: bytes) -> tuple[Bundle, dict[str, Any]]:
    from sigstore.models import Bundle

    try:
        doc = json.loads(bundle_json)
    except (ValueError, RecursionError) as exc:
        raise SigstoreVerificationError(f"bad bundle JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise SigstoreVerificationError(f"bad bundle JSON: expected an object, found {type(doc).__name__}")
    try:
        bundle = Bundle.from_json(bundle_json)
    except Exception as exc:
        raise SigstoreVerificationError(f"bad bundle JSON: not a Sigstore bundle ({exc})") from exc
    return bundle, doc


def _explain(
    exc: Exception, policy: _SignerPolicy, doc: dict[str, Any], artifact: bytes | None, root: Path
) -> str:
    """Name the check that failed, in our words where we can tell, with the library's reason."""
    from sigstore.errors import CertValidationError

    if policy.failure is not None:
        return policy.failure
    if isinstance(exc, CertValidationError):
        return f"untrusted signer: the certificate does not chain to a Fulcio CA in {root} ({exc})"
    if artifact is not None and not isinstance(doc.get("dsseEnvelope"), dict):
        signed = _signed_digest(doc)
        actual = hashlib.sha256(artifact).hexdigest()
        if signed is not None and signed != actual:
            return f"tampered artifact: its sha256 is {actual}, the bundle signs {signed}"
    return f"bundle does not verify against trusted root {root} ({type(exc).__name__}: {exc})"


def _signed_digest(doc: dict[str, Any]) -> str | None:
    """The sha256 (hex) a message-signature bundle declares it signs, if it declares one."""
    try:
        digest = doc["messageSignature"]["messageDigest"]
        if digest.get("algorithm") != "SHA2_256":
            return None
        return base64.b64decode(digest["digest"], validate=True).hex()
    except (KeyError, TypeError, AttributeError, ValueError):
        return None


def _check_statement(payload_type: str, statement: bytes, artifact: bytes | None) -> None:
    """The DSSE payload must be an in-toto statement, and name ``artifact`` when one is given."""
    if payload_type != INTOTO_PAYLOAD_TYPE:
        raise SigstoreVerificationError(
            f"DSSE payload type is {payload_type!r}, expected {INTOTO_PAYLOAD_TYPE!r} (an in-toto statement)"
        )
    try:
        doc = json.loads(statement)
        if not str(doc["_type"]).startswith(_STATEMENT_TYPE_PREFIX):
            raise ValueError(f"_type is {doc['_type']!r}")
        subjects = [s["digest"].get("sha256") for s in doc["subject"]]
    except (RecursionError, KeyError, TypeError, AttributeError, ValueError) as exc:
        raise SigstoreVerificationError(f"DSSE payload is not an in-toto statement ({exc})") from exc
    if artifact is not None:
        actual = hashlib.sha256(artifact).hexdigest()
        if actual not in subjects:
            raise SigstoreVerificationError(
                f"tampered artifact: its sha256 {actual} is not a subject of the signed statement "
                f"(subjects: {subjects})"
            )


def _integrated_time(doc: dict[str, Any]) -> datetime | None:
    """Rekor's integration time, when the entry has one bound by an inclusion promise (Rekor v1)."""
    try:
        entry = doc["verificationMaterial"]["tlogEntries"][0]
        seconds = int(entry.get("integratedTime") or 0)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError):
        return None
    if seconds <= 0 or not entry.get("inclusionPromise"):
        return None
    return datetime.fromtimestamp(seconds, tz=timezone.utc)
