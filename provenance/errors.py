"""Errors of the provenance package.

Every error says what failed and, where there is one, what to do about it. Third-party exceptions
(sigstore, cryptography, pydantic) are wrapped once, where they are raised, with the cause chained.
Exit codes (``shardport.EXIT_CODES``): a document or bundle that does not verify is a verification
failure (1); a key file the user named that cannot be used is a usage error (2); Sigstore signing
that cannot happen here, or that the service refused, is an unavailable service (6).

Tree::

    ShardportError
    └── ProvenanceError                    (1)
        ├── KeyFormatError                 (2)  a key file is unreadable, not PEM, or not Ed25519
        ├── EnvelopeFormatError                 bytes are not a well-formed DSSE envelope
        ├── NonFiniteNumberError           (2)  a document to sign holds NaN or ±inf (JCS has
        │                                       neither); the JSON pointers are listed
        ├── SigstoreUnavailableError       (6)  sigstore cannot sign (or is not installed) here:
        │                                       no network to Fulcio/Rekor, no OIDC identity
        ├── SigstoreSigningError           (6)  the statement or the request was refused
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

    exit_code = 2


class EnvelopeFormatError(ProvenanceError):
    """Bytes are not a well-formed DSSE envelope (the message names the source and the field)."""


class NonFiniteNumberError(ProvenanceError):
    """A document to be canonicalised and signed holds NaN or ±inf, which RFC 8785 cannot write.

    ``paths``: the JSON pointers of the values. The caller handed a value it should have recorded as a
    failed measurement (a usage error of the API, as a manifest's non-finite float is).
    """

    exit_code = 2

    def __init__(self, paths: list[str]) -> None:
        self.paths = list(paths)
        shown = ", ".join(self.paths[:8]) + (
            f" and {len(self.paths) - 8} more" if len(self.paths) > 8 else ""
        )
        super().__init__(
            f"a document to sign holds {len(self.paths)} non-finite number(s) (NaN or inf; canonical JSON, "
            f"RFC 8785, has none) at {shown}: record them as failed measurements, not as numbers"
        )


class SigstoreUnavailableError(ProvenanceError):
    """Sigstore keyless signing is impossible here (offline, no OIDC identity, package missing).

    The remedy is in the message: run where Fulcio and Rekor are reachable with an OIDC identity,
    or sign with an Ed25519 key (``registry keygen``).
    """

    exit_code = 6


class SigstoreSigningError(ProvenanceError):
    """Sigstore signing was attempted and refused.

    The input is not an in-toto statement, or Fulcio/Rekor rejected the request (the service's
    answer is chained).
    """

    exit_code = 6


class SigstoreVerificationError(ProvenanceError):
    """A Sigstore bundle failed offline verification; the message names the check that failed."""
