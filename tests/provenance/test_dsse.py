from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from shardport.provenance import dsse
from shardport.provenance.errors import EnvelopeFormatError, KeyFormatError
from shardport.provenance.keys import SigningKey, VerifyingKey
from shardport.provenance.statement import PAYLOAD_TYPE, Statement, Subject


def test_pae_matches_spec_example() -> None:
    # DSSE v1 protocol: "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body
    assert dsse.pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def test_sign_verify_roundtrip_and_tamper() -> None:
    key, other = SigningKey.generate(), SigningKey.generate()
    st = Statement((Subject("m", "ab" * 32),), "https://example/p", {"a": 1, "f": 0.5})
    env = dsse.sign(PAYLOAD_TYPE, st.to_bytes(), [key])
    back = dsse.Envelope.from_bytes(env.to_bytes())
    assert back == env
    assert back.signed_by([key.verifying_key(), other.verifying_key()]) == [key.verifying_key()]
    assert Statement.from_bytes(back.payload) == st
    tampered = dsse.Envelope(back.payload_type, back.payload.replace(b'"a":1', b'"a":2'), back.signatures)
    assert tampered.signed_by([key.verifying_key()]) == []
    retyped = dsse.Envelope("text/plain", back.payload, back.signatures)
    assert retyped.signed_by([key.verifying_key()]) == []


def test_canonical_json_floats() -> None:
    st = Statement((Subject("m", "00" * 32),), "p", {"x": 1.0, "y": 1e-05})
    assert b'"x":1,' in st.to_bytes() and b'"y":0.00001' in st.to_bytes()


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"[]",
        b"{",
        json.dumps({"payloadType": "t", "payload": "!!", "signatures": []}).encode(),
        json.dumps({"payloadType": "t", "payload": "", "signatures": [{"keyid": "k"}]}).encode(),
        json.dumps({"payloadType": 1, "payload": "", "signatures": []}).encode(),
    ],
)
def test_malformed_envelopes(raw: bytes) -> None:
    with pytest.raises(EnvelopeFormatError, match="where"):
        dsse.Envelope.from_bytes(raw, source="where")


def test_statement_rejects_wrong_type() -> None:
    bad = json.dumps({"_type": "x", "subject": [], "predicateType": "p", "predicate": {}}).encode()
    with pytest.raises(ValueError, match="_type"):
        Statement.from_bytes(bad)


def test_keys_roundtrip(tmp_path: Path) -> None:
    key = SigningKey.generate()
    key.save(tmp_path / "k.key", tmp_path / "k.pub")
    assert (tmp_path / "k.key").stat().st_mode & 0o777 == 0o600
    assert SigningKey.load(tmp_path / "k.key").keyid == key.keyid
    assert VerifyingKey.from_pem((tmp_path / "k.pub").read_bytes()).keyid == key.keyid
    with pytest.raises(FileExistsError):
        key.save(tmp_path / "k.key", tmp_path / "k.pub")
    with pytest.raises(KeyFormatError, match="not a PEM"):
        VerifyingKey.from_pem(b"garbage", source="x.pub")
    sig = key.sign(b"m")
    assert key.verifying_key().verify(sig, b"m") and not key.verifying_key().verify(sig, b"n")
    assert base64.b64encode(sig)
