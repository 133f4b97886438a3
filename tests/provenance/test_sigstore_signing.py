"""Sigstore: offline verification of real bundles (tests/vectors/sigstore) and fail-fast signing.

Nothing here reaches the network: verification is offline by design, and the signing tests stop
at the missing credential, at a refused loopback connection, or at a stubbed library call.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pytest

from shardport import ShardportError
from shardport.provenance import sigstore_signing
from shardport.provenance.errors import (
    ProvenanceError,
    SigstoreSigningError,
    SigstoreUnavailableError,
    SigstoreVerificationError,
)
from shardport.provenance.sigstore_signing import (
    VerifiedBundle,
    sign_statement_sigstore,
    verify_bundle_offline,
)

VECTORS = Path(__file__).resolve().parent.parent / "vectors" / "sigstore"
STAGING_ROOT = VECTORS / "staging-trusted_root.json"
PRODUCTION_ROOT = VECTORS / "production-trusted_root.json"

# sigstore-python's test/assets/staging-rekor-v2.txt: message signature, staging, Rekor v2 + TSA.
MSG_ARTIFACT = (VECTORS / "staging-rekor-v2.txt").read_bytes()
MSG_BUNDLE = (VECTORS / "staging-rekor-v2.txt.sigstore.json").read_bytes()
MSG_IDENTITY = "jku@goto.fi"
MSG_ISSUER = "https://github.com/login/oauth"

# sigstore-rs's tests/data/dsse_v001_bundle.sigstore.json: DSSE in-toto statement, production,
# Rekor v1 dsse/0.0.1 entry with an inclusion promise.
DSSE_BUNDLE = (VECTORS / "dsse_v001_bundle.sigstore.json").read_bytes()
DSSE_IDENTITY = "https://github.com/prefix-dev/sigstore-example/.github/workflows/action.yaml@refs/heads/main"
DSSE_ISSUER = "https://token.actions.githubusercontent.com"
DSSE_SUBJECT_SHA256 = "3862a3677d33a45134a2ce3452b23f8f7459fe581cefbc3818272648cd987cfb"

STATEMENT = json.dumps(
    {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "manifest", "digest": {"sha256": "00" * 32}}],
        "predicateType": "https://shardport.dev/evidence/v1",
        "predicate": {},
    }
).encode()
FAST_S = 30.0


def _verify_msg(**overrides: object) -> VerifiedBundle:
    kwargs: dict[str, object] = {
        "artifact": MSG_ARTIFACT,
        "trusted_root_path": STAGING_ROOT,
        "identity": MSG_IDENTITY,
        "issuer": MSG_ISSUER,
    }
    kwargs.update(overrides)
    bundle = kwargs.pop("bundle_json", MSG_BUNDLE)
    return verify_bundle_offline(bundle, **kwargs)  # type: ignore[arg-type]


def _verify_dsse(**overrides: object) -> VerifiedBundle:
    kwargs: dict[str, object] = {
        "artifact": None,
        "trusted_root_path": PRODUCTION_ROOT,
        "identity": DSSE_IDENTITY,
        "issuer": DSSE_ISSUER,
    }
    kwargs.update(overrides)
    return verify_bundle_offline(DSSE_BUNDLE, **kwargs)  # type: ignore[arg-type]


def _root_with_cas_of(base: Path, donor: Path, dest: Path) -> Path:
    """``base``'s trusted root with its Fulcio CAs replaced by ``donor``'s (logs and TSAs kept)."""
    root = json.loads(base.read_text())
    root["certificateAuthorities"] = json.loads(donor.read_text())["certificateAuthorities"]
    dest.write_text(json.dumps(root))
    return dest


# ------------------------------------------------------------------------------------ verification


def test_vectors_are_the_committed_bytes() -> None:
    # The message-signature bundle declares the artifact's digest; a re-encoded copy would differ.
    declared = json.loads(MSG_BUNDLE)["messageSignature"]["messageDigest"]["digest"]
    assert base64.b64decode(declared) == hashlib.sha256(MSG_ARTIFACT).digest()


def test_message_signature_vector_verifies_offline() -> None:
    result = _verify_msg()
    assert result == VerifiedBundle(
        kind="message_signature",
        identity=MSG_IDENTITY,
        issuer=MSG_ISSUER,
        integrated_time=None,  # Rekor v2: the time comes from the RFC 3161 timestamp
        statement=None,
    )


def test_dsse_vector_verifies_offline_and_returns_the_statement() -> None:
    result = _verify_dsse()
    assert result.kind == "dsse"
    assert (result.identity, result.issuer) == (DSSE_IDENTITY, DSSE_ISSUER)
    assert result.integrated_time == datetime(2025, 9, 1, 11, 51, 42, tzinfo=timezone.utc)
    assert result.statement is not None
    statement = json.loads(result.statement)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["subject"][0]["digest"]["sha256"] == DSSE_SUBJECT_SHA256


def test_verified_bundle_is_frozen() -> None:
    result = _verify_msg()
    with pytest.raises(AttributeError):
        result.identity = "someone@else"  # type: ignore[misc]


def test_flipped_artifact_byte_is_rejected() -> None:
    tampered = bytearray(MSG_ARTIFACT)
    tampered[0] ^= 0x01
    with pytest.raises(SigstoreVerificationError, match="tampered artifact"):
        _verify_msg(artifact=bytes(tampered))


def test_dsse_artifact_must_be_a_subject_of_the_statement() -> None:
    with pytest.raises(SigstoreVerificationError, match="not a subject of the signed statement"):
        _verify_dsse(artifact=b"not the conda package")


def test_message_signature_needs_the_artifact() -> None:
    with pytest.raises(SigstoreVerificationError, match="pass the artifact"):
        _verify_msg(artifact=None)


@pytest.mark.parametrize("verify", [_verify_msg, _verify_dsse], ids=["message", "dsse"])
def test_wrong_identity_is_rejected(verify: Callable[..., VerifiedBundle]) -> None:
    with pytest.raises(SigstoreVerificationError, match="signer identity mismatch") as info:
        verify(identity="mallory@example.com")
    assert "mallory@example.com" in str(info.value)


@pytest.mark.parametrize("verify", [_verify_msg, _verify_dsse], ids=["message", "dsse"])
def test_wrong_issuer_is_rejected(verify: Callable[..., VerifiedBundle]) -> None:
    with pytest.raises(SigstoreVerificationError, match="OIDC issuer mismatch"):
        verify(issuer="https://accounts.google.com")


def _flip_signature(bundle: bytes) -> bytes:
    doc = json.loads(bundle)
    sig = base64.b64decode(doc["messageSignature"]["signature"])
    doc["messageSignature"]["signature"] = base64.b64encode(sig[:-1] + bytes([sig[-1] ^ 1])).decode()
    return json.dumps(doc).encode()


def _drop_certificate(bundle: bytes) -> bytes:
    doc = json.loads(bundle)
    del doc["verificationMaterial"]["certificate"]
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda b: b[:-40], "bad bundle JSON"),
        (lambda b: b"\xff\xfe" + b, "bad bundle JSON"),
        (lambda b: b"[]", "expected an object"),
        (lambda b: b.replace(b"bundle.v0.3+json", b"bundle.v9.9+json"), "not a Sigstore bundle"),
        (_drop_certificate, "not a Sigstore bundle"),
        (_flip_signature, "does not verify"),
    ],
    ids=["truncated", "not-utf8", "not-object", "unknown-media-type", "no-certificate", "bad-signature"],
)
def test_corrupted_bundle_is_rejected(corrupt: Callable[[bytes], bytes], message: str) -> None:
    with pytest.raises(SigstoreVerificationError, match=message):
        _verify_msg(bundle_json=corrupt(MSG_BUNDLE))


def test_trusted_root_without_the_signers_ca_is_rejected(tmp_path: Path) -> None:
    # Staging logs and timestamp authority, production Fulcio CAs: time verifies, the chain cannot.
    root = _root_with_cas_of(STAGING_ROOT, PRODUCTION_ROOT, tmp_path / "root.json")
    with pytest.raises(SigstoreVerificationError, match="untrusted signer"):
        _verify_msg(trusted_root_path=root)


def test_dsse_bundle_against_root_without_its_ca_is_rejected(tmp_path: Path) -> None:
    root = _root_with_cas_of(PRODUCTION_ROOT, STAGING_ROOT, tmp_path / "root.json")
    with pytest.raises(SigstoreVerificationError, match="untrusted signer"):
        _verify_dsse(trusted_root_path=root)


def test_other_instance_root_is_rejected() -> None:
    with pytest.raises(SigstoreVerificationError, match="does not verify against trusted root"):
        _verify_msg(trusted_root_path=PRODUCTION_ROOT)


def test_unreadable_or_malformed_trusted_root_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(SigstoreVerificationError, match="cannot read trusted root"):
        _verify_msg(trusted_root_path=tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"mediaType": "nope"}')
    with pytest.raises(SigstoreVerificationError, match="is not a Sigstore trusted root"):
        _verify_msg(trusted_root_path=bad)


def test_errors_are_provenance_errors_with_their_exit_codes() -> None:
    """A bundle that does not verify is a verification failure (1); signing that cannot happen here
    or is refused by the service is an unavailable service (6)."""
    expected = ((SigstoreUnavailableError, 6), (SigstoreSigningError, 6), (SigstoreVerificationError, 1))
    for cls, code in expected:
        assert issubclass(cls, ProvenanceError)
        assert issubclass(cls, ShardportError)
        assert cls.exit_code == code


# ----------------------------------------------------------------------------------------- signing


@pytest.fixture
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An environment with no CI identity and no proxy; GCP detection reads a missing file."""
    for name in (
        "GITHUB_ACTIONS",
        "ACTIONS_ID_TOKEN_REQUEST_TOKEN",
        "ACTIONS_ID_TOKEN_REQUEST_URL",
        "GOOGLE_SERVICE_ACCOUNT_NAME",
        "BUILDKITE",
        "GITLAB_CI",
        "CIRCLECI",
        "SIGSTORE_ID_TOKEN",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(
        "id._internal.oidc.ambient._GCP_PRODUCT_NAME_FILE", str(tmp_path / "no-dmi"), raising=False
    )


def _fake_token() -> str:
    """A well-formed, unsigned OIDC token for audience ``sigstore`` (enough to pass parsing)."""

    def part(doc: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()

    now = int(time.time())
    claims = {"iss": "https://issuer.invalid", "sub": "ci", "aud": "sigstore", "iat": now, "exp": now + 600}
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _offline(monkeypatch: pytest.MonkeyPatch, staging: bool = False) -> None:
    """Point the preflight at a loopback port nobody listens on: refused at once, no network."""
    instance = sigstore_signing._Instance("test", (("127.0.0.1", _closed_port()),))
    monkeypatch.setitem(sigstore_signing._INSTANCES, staging, instance)


@pytest.mark.usefixtures("no_ambient_credentials")
def test_signing_without_identity_fails_fast() -> None:
    started = time.monotonic()
    with pytest.raises(SigstoreUnavailableError) as info:
        sign_statement_sigstore(STATEMENT)
    assert time.monotonic() - started < FAST_S
    message = str(info.value)
    assert "needs network access to Fulcio/Rekor and an OIDC identity" in message
    assert "no ambient OIDC credential" in message
    assert "registry keygen" in message


@pytest.mark.usefixtures("no_ambient_credentials")
@pytest.mark.parametrize("staging", [False, True], ids=["production", "staging"])
def test_signing_offline_fails_fast_with_the_cause_chained(
    monkeypatch: pytest.MonkeyPatch, staging: bool
) -> None:
    _offline(monkeypatch, staging)
    started = time.monotonic()
    with pytest.raises(SigstoreUnavailableError, match=re.escape("cannot reach 127.0.0.1")) as info:
        sign_statement_sigstore(STATEMENT, staging=staging, identity_token=_fake_token())
    assert time.monotonic() - started < FAST_S
    assert isinstance(info.value.__cause__, OSError)
    assert "registry keygen" in str(info.value)


@pytest.mark.usefixtures("no_ambient_credentials")
def test_signing_probes_the_https_proxy_when_one_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with pytest.raises(SigstoreUnavailableError, match=re.escape("via proxy 127.0.0.1")):
        sign_statement_sigstore(STATEMENT, identity_token=_fake_token())


@pytest.mark.usefixtures("no_ambient_credentials")
def test_malformed_identity_token_is_rejected_before_any_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sigstore_signing, "_require_reachable", pytest.fail)
    with pytest.raises(SigstoreUnavailableError, match="identity token was rejected"):
        sign_statement_sigstore(STATEMENT, identity_token="not-a-jwt")


def test_non_statement_is_refused_before_any_identity_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sigstore_signing, "_identity_token", pytest.fail)
    with pytest.raises(SigstoreSigningError, match="in-toto Statement v1"):
        sign_statement_sigstore(b'{"predicate": {}}')


@pytest.mark.usefixtures("no_ambient_credentials")
def test_library_network_failure_is_wrapped_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from sigstore.errors import TUFError
    from sigstore.models import ClientTrustConfig

    def refresh_fails(*_args: object, **_kwargs: object) -> ClientTrustConfig:
        raise TUFError("Failed to refresh TUF metadata")

    monkeypatch.setattr(sigstore_signing, "_require_reachable", lambda _instance: None)
    monkeypatch.setattr(ClientTrustConfig, "production", refresh_fails)
    with pytest.raises(SigstoreUnavailableError, match="Failed to refresh TUF metadata") as info:
        sign_statement_sigstore(STATEMENT, identity_token=_fake_token())
    assert isinstance(info.value.__cause__, TUFError)


@pytest.mark.usefixtures("no_ambient_credentials")
def test_service_refusal_is_a_signing_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from sigstore.models import ClientTrustConfig
    from sigstore.sign import SigningContext

    def refused(*_args: object, **_kwargs: object) -> SigningContext:
        raise RuntimeError("Fulcio: 401 Unauthorized")

    monkeypatch.setattr(sigstore_signing, "_require_reachable", lambda _instance: None)
    monkeypatch.setattr(ClientTrustConfig, "production", lambda *a, **k: object())
    monkeypatch.setattr(SigningContext, "from_trust_config", refused)
    with pytest.raises(SigstoreSigningError, match="refused to sign") as info:
        sign_statement_sigstore(STATEMENT, identity_token=_fake_token())
    assert isinstance(info.value.__cause__, RuntimeError)
