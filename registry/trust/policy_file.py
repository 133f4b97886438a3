"""Reading and writing the trust policy file: the I/O beside the pure :mod:`.policy`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from shardport.registry.output.writers import write_file
from shardport.registry.trust.policy import TrustPolicy


def load_policy(path: Path) -> TrustPolicy:
    """The policy in ``path`` (a policy file, or a PEM public key trusted for everything); missing: empty.

    Each keyless identity's ``trusted_root`` is resolved against the policy file's folder.
    """
    if not path.exists():
        return TrustPolicy()
    policy = TrustPolicy.parse(path.read_bytes(), source=str(path), key_name=path.stem)
    folder = path.parent
    roots = tuple(
        dataclasses.replace(i, trusted_root=str((folder / i.trusted_root).resolve())) for i in policy.sigstore
    )
    return dataclasses.replace(policy, sigstore=roots)


def save_policy(policy: TrustPolicy, path: Path) -> None:
    """Write the policy atomically (only keygen writes one)."""
    write_file(path, policy.to_bytes())
