"""Pure verification of tag histories (no store)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from shardport.provenance import dsse
from shardport.provenance.keys import SigningKey
from shardport.provenance.statement import PAYLOAD_TYPE
from shardport.registry.artifact.hashing import digest_bytes
from shardport.registry.errors import (
    EquivocationError,
    RollbackAttackError,
    SignatureError,
    TagChainError,
    TagExpiredError,
    UnsignedError,
    UntrustedSignerError,
)
from shardport.registry.trust.policy import TrustPolicy
from shardport.registry.trust.tags import SeenTag, TagEntry, next_document, verify_history

NOW = datetime(2026, 11, 30, tzinfo=timezone.utc)
T1, T2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def build(key: SigningKey | None, targets: list[str], repo: str = "r", tag: str = "t") -> dict[int, bytes]:
    raws: dict[int, bytes] = {}
    entries: list[TagEntry] = []
    for i, target in enumerate(targets):
        doc = next_document(
            entries,
            repository=repo,
            tag=tag,
            target=target,
            signer=key.keyid if key else None,
            now=NOW + timedelta(seconds=i),
            valid_for=timedelta(days=1),
        )
        raw = dsse.sign(PAYLOAD_TYPE, doc.statement().to_bytes(), [key] if key else []).to_bytes()
        raws[doc.version] = raw
        entries.append(TagEntry(doc=doc, raw=raw, digest=digest_bytes(raw), signers=()))
    return raws


@pytest.fixture
def key() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture
def policy(key: SigningKey) -> TrustPolicy:
    return TrustPolicy().with_key(key.verifying_key(), "ci")


def verify(
    raws: dict[int, bytes],
    policy: TrustPolicy,
    seen: SeenTag | None = None,
    now: datetime = NOW,
    allow_unsigned: bool = False,
) -> list[TagEntry]:
    return verify_history(
        raws, repository="r", tag="t", policy=policy, seen=seen, now=now, allow_unsigned=allow_unsigned
    )


def test_good_chain(key: SigningKey, policy: TrustPolicy) -> None:
    entries = verify(build(key, [T1, T2, T1]), policy)
    assert [e.doc.version for e in entries] == [1, 2, 3]
    assert entries[1].doc.previous == entries[0].digest
    assert entries[2].signers == (key.keyid,)


def test_gap(key: SigningKey, policy: TrustPolicy) -> None:
    raws = build(key, [T1, T2, T1])
    del raws[2]
    with pytest.raises(TagChainError, match="not contiguous"):
        verify(raws, policy)


def test_swapped_documents(key: SigningKey, policy: TrustPolicy) -> None:
    raws = build(key, [T1, T2])
    raws[1], raws[2] = raws[2], raws[1]
    with pytest.raises(TagChainError, match="version 1"):
        verify(raws, policy)


def test_other_tag_document(key: SigningKey, policy: TrustPolicy) -> None:
    raws = build(key, [T1])
    raws[2] = build(key, [T1, T2], tag="other")[2]
    with pytest.raises(TagChainError, match="other"):
        verify(raws, policy)


def test_broken_previous(key: SigningKey, policy: TrustPolicy) -> None:
    a, b = build(key, [T1, T2]), build(key, [T2, T2])
    with pytest.raises(TagChainError, match="broken chain"):
        verify({1: a[1], 2: b[2]}, policy)


def test_rollback_and_equivocation(key: SigningKey, policy: TrustPolicy) -> None:
    raws = build(key, [T1, T2])
    entries = verify(raws, policy)
    seen = SeenTag(version=2, digest=entries[1].digest)
    with pytest.raises(RollbackAttackError, match="already saw version 2"):
        verify({1: raws[1]}, policy, seen=seen)
    other = build(key, [T1, T1])
    with pytest.raises(EquivocationError):
        verify(other, policy, seen=seen)
    assert len(verify(build(key, [T1, T2]) | {}, policy, seen=SeenTag(1, entries[0].digest))) == 2


def test_expired(key: SigningKey, policy: TrustPolicy) -> None:
    raws = build(key, [T1])
    with pytest.raises(TagExpiredError, match="expired"):
        verify(raws, policy, now=NOW + timedelta(days=2))


def test_signatures(key: SigningKey, policy: TrustPolicy) -> None:
    with pytest.raises(UnsignedError):
        verify(build(None, [T1]), policy)
    assert len(verify(build(None, [T1]), policy, allow_unsigned=True)) == 1
    with pytest.raises(UntrustedSignerError, match="does not list"):
        verify(build(SigningKey.generate(), [T1]), policy)
    scoped = TrustPolicy().with_key(key.verifying_key(), "ci", scopes=("other/*",))
    with pytest.raises(UntrustedSignerError, match="does not allow"):
        verify(build(key, [T1]), scoped)
    tag_scoped = TrustPolicy().with_key(key.verifying_key(), "ci", scopes=("r:t",))
    assert verify(build(key, [T1]), tag_scoped)


def test_altered_payload(key: SigningKey, policy: TrustPolicy) -> None:
    raws = build(key, [T1])
    env = dsse.Envelope.from_bytes(raws[1])
    forged = dsse.Envelope(
        env.payload_type, env.payload.replace(T1[7:].encode(), T2[7:].encode()), env.signatures
    )
    with pytest.raises(SignatureError, match="does not verify"):
        verify({1: forged.to_bytes()}, policy)
