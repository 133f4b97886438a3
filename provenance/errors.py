"""Errors of the provenance package.

Every error says what failed and, where there is one, what to do about it. Third-party exceptions
(sigstore, cryptography, pydantic) are wrapped once, where they are raised, with the cause chained.
All of them are verification or contract failures for the CLI (exit code 1).

Tree::

    ShardportError
    └── ProvenanceError                    (1)
        ├── KeyFormatError                      a key file is unreadable, not PEM, or not Ed25519
        ├── EnvelopeFormatError                 bytes are not a well-formed DSSE envelope
        ├── SigstoreUnavailableError            sigstore cannot sign (or is not installed) here:
        │                                       no network to Fulcio/Rekor, no OIDC identity
        ├── SigstoreSigningError                the statement or the request was refused
        └── SigstoreVerificationError           a Sigstore bundle does not verify (bad JSON,
                                                wrong identity or issuer, tampered artifact,
                                                untrusted CA, bad trusted root)
"""

from __future__ import annotations

from shardport import ShardportError


class ProvenanceError(ShardportError):
    """Base of every provenance error."""

    exit_code = 1


class KeyFormatError(ProvenanceError):
    """A key is unreadable, not PEM, or not an Ed25519 key (the message names its source)."""


class EnvelopeFormatError(ProvenanceError):
    """Bytes are not a well-formed DSSE envelope (the message names the source and the field)."""


class SigstoreUnavailableError(ProvenanceError):
    """Sigstore keyless signing is impossible here (offline, no OIDC identity, package missing).

    The remedy is in the message: run where Fulcio and Rekor are reachable with an OIDC identity,
    or sign with an Ed25519 key (``registry keygen``).
    """


class SigstoreSigningError(ProvenanceError):
    """Sigstore signing was attempted and refused.

    The input is not an in-toto statement, or Fulcio/Rekor rejected the request (the service's
    answer is chained).
    """


class SigstoreVerificationError(ProvenanceError):
    """A Sigstore bundle failed offline verification; the message names the check that failed."""
