"""shardport.provenance: signatures and statements, independent of what they sign.

Consumes bytes (a payload to sign, an envelope or Sigstore bundle to verify) and keys; produces DSSE v1
envelopes over in-toto Statement v1 payloads (canonical JSON, RFC 8785), Ed25519 key pairs with stable
key ids, and offline verification of Sigstore bundles against a trusted-root file. Imported by every
other package; imports none of them. Sigstore itself is imported only where a bundle is made or checked.

- :mod:`.dsse` — :class:`Envelope`, :func:`sign`, :func:`pae` (DSSE pre-authentication encoding);
- :mod:`.statement` — :class:`Statement`, :class:`Subject`, :data:`PAYLOAD_TYPE`;
- :mod:`.canonical` — RFC 8785 bytes of a document to sign, refusing NaN/inf by JSON pointer;
- :mod:`.keys` — :class:`SigningKey`, :class:`VerifyingKey` (Ed25519, PEM, ``ed25519:`` key ids);
- :mod:`.sigstore_signing` — keyless signing (needs the network) and offline bundle verification;
- errors: :class:`ProvenanceError` and its subclasses (:mod:`.errors` draws the tree).
"""

from .dsse import Envelope, Signature, pae, sign
from .errors import (
    EnvelopeFormatError,
    KeyFormatError,
    NonFiniteNumberError,
    ProvenanceError,
    SigstoreSigningError,
    SigstoreUnavailableError,
    SigstoreVerificationError,
)
from .keys import SigningKey, VerifyingKey
from .statement import PAYLOAD_TYPE, Statement, Subject

__all__ = [
    "PAYLOAD_TYPE",
    "Envelope",
    "EnvelopeFormatError",
    "KeyFormatError",
    "NonFiniteNumberError",
    "ProvenanceError",
    "Signature",
    "SigningKey",
    "SigstoreSigningError",
    "SigstoreUnavailableError",
    "SigstoreVerificationError",
    "Statement",
    "Subject",
    "VerifyingKey",
    "pae",
    "sign",
]
