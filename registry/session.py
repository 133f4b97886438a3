"""What every registry operation works with: the store, the trust policy and state, the signing key."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from shardport.provenance.keys import SigningKey
from shardport.registry import home
from shardport.registry.store.protocol import Store, open_store
from shardport.registry.trust.policy import TrustPolicy
from shardport.registry.trust.policy_file import load_policy
from shardport.registry.trust.state import TrustState, legacy_identities, store_identity


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Session:
    """One invocation's view of the registry."""

    store: Store
    policy: TrustPolicy
    state: TrustState
    key: SigningKey | None = None
    allow_unsigned: bool = False
    clock: Callable[[], datetime] = field(default=_utcnow)

    @classmethod
    def open(
        cls,
        store_url: str | None = None,
        *,
        s3_endpoint: str | None = None,
        trust: Path | None = None,
        key: Path | None = None,
        allow_unsigned: bool = False,
    ) -> Session:
        """Open the store and load the trust policy, state and signing key from ``$SHARDPORT_HOME``.

        ``key`` defaults to ``$SHARDPORT_HOME/keys/default.key`` when that exists.
        """
        store = open_store(store_url or home.default_store_url(), s3_endpoint=s3_endpoint)
        root = None if store.local_root is None else str(store.local_root)
        store_id = store_identity(store.url, local_root=root, endpoint=store.endpoint)
        legacy = () if root is not None else legacy_identities(store.url, s3_endpoint)  # only S3 had them
        policy = load_policy(trust or home.trust_path())
        signing = None
        default_key = home.keys_dir() / "default.key"
        if key is not None:
            signing = SigningKey.load(key)
        elif default_key.exists():
            signing = SigningKey.load(default_key)
        return cls(
            store=store,
            policy=policy,
            state=TrustState(home.state_dir(), store_id, legacy),
            key=signing,
            allow_unsigned=allow_unsigned,
        )
