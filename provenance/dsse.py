"""DSSE envelopes (Dead Simple Signing Envelope, v1) signed with Ed25519.

The envelope is JSON ``{"payloadType", "payload" (base64), "signatures": [{"keyid", "sig"}]}``;
a signature covers the pre-authentication encoding ``PAE(payloadType, payload)``, never the JSON.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from dataclasses import dataclass

import rfc8785

from shardport.provenance.errors import EnvelopeFormatError
from shardport.provenance.keys import SigningKey, VerifyingKey


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    ptype = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(ptype), ptype, len(payload), payload)


@dataclass(frozen=True, slots=True)
class Signature:
    """One signature of an envelope."""

    keyid: str
    sig: bytes


@dataclass(frozen=True, slots=True)
class Envelope:
    """A DSSE envelope."""

    payload_type: str
    payload: bytes
    signatures: tuple[Signature, ...]

    def to_bytes(self) -> bytes:
        """Canonical JSON bytes of the envelope."""
        return rfc8785.dumps(
            {
                "payloadType": self.payload_type,
                "payload": base64.b64encode(self.payload).decode("ascii"),
                "signatures": [
                    {"keyid": s.keyid, "sig": base64.b64encode(s.sig).decode("ascii")}
                    for s in self.signatures
                ],
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "envelope") -> Envelope:
        """Parse an envelope; ``source`` names where it came from in error messages."""
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep, a huge number
            raise EnvelopeFormatError(f"{source}: not a JSON DSSE envelope ({exc})") from exc
        if not isinstance(doc, dict):
            raise EnvelopeFormatError(f"{source}: expected a JSON object, found {type(doc).__name__}")
        ptype, payload, sigs = doc.get("payloadType"), doc.get("payload"), doc.get("signatures")
        if not isinstance(ptype, str) or not isinstance(payload, str) or not isinstance(sigs, list):
            raise EnvelopeFormatError(
                f"{source}: fields payloadType (str), payload (base64 str), signatures (list) required"
            )
        try:
            raw_payload = base64.b64decode(payload, validate=True)
            signatures = tuple(
                Signature(keyid=str(s["keyid"]), sig=base64.b64decode(s["sig"], validate=True)) for s in sigs
            )
        except (binascii.Error, KeyError, TypeError, ValueError) as exc:
            raise EnvelopeFormatError(f"{source}: malformed payload or signature entry ({exc})") from exc
        return cls(payload_type=ptype, payload=raw_payload, signatures=signatures)

    def signed_by(self, keys: Iterable[VerifyingKey]) -> list[VerifyingKey]:
        """The keys among ``keys`` whose signature over this envelope verifies."""
        message = pae(self.payload_type, self.payload)
        by_id: dict[str, list[bytes]] = {}
        for s in self.signatures:
            by_id.setdefault(s.keyid, []).append(s.sig)
        good = []
        for key in keys:
            if any(key.verify(sig, message) for sig in by_id.get(key.keyid, [])):
                good.append(key)
        return good


def sign(payload_type: str, payload: bytes, keys: Iterable[SigningKey]) -> Envelope:
    """Make an envelope over ``payload`` signed by every key in ``keys`` (none: unsigned)."""
    message = pae(payload_type, payload)
    sigs = tuple(Signature(keyid=k.keyid, sig=k.sign(message)) for k in keys)
    return Envelope(payload_type=payload_type, payload=payload, signatures=sigs)
