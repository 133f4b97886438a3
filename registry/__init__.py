"""shardport.registry: a signed, content-addressed registry of model checkpoints.

Consumes checkpoint folders (safetensors, sharded safetensors, GGUF, anything else as opaque files),
contract declarations and signing keys; produces artifacts in a store (a local folder or
``s3://bucket/prefix``): content-addressed blobs, a manifest per artifact (files, tensor table,
numeric contracts with decode witnesses, graph bindings, model parameters, a tile index), DSSE
signatures attached to it, and signed, hash-chained tag documents that clients refuse to see rolled
back. Every read verifies: tag history against this client's trust state and policy, signatures,
every byte's hash, and what the bytes decode to.

The public face (imported lazily, so that ``registry --help`` and the small commands stay fast):

- :class:`Session` — the store, trust policy and state, signing key of one invocation;
- :class:`Ref`, :func:`parse_ref` — ``NAME:TAG`` and ``NAME@sha256:HEX``;
- :class:`Manifest` — the artifact's description; :func:`resolve` / :class:`Resolved` — a reference
  verified down to one manifest digest;
- :func:`push`, :func:`pull`, :func:`convert`, :func:`verify_ref`, :func:`verify_dir`,
  :func:`verify_checkpoint`, :func:`gc`, :func:`fsck` — the commands, as library calls;
- :class:`Store`, :class:`TrustPolicy` — the storage backend and the trust decisions;
- errors: :class:`RegistryError` and its subclasses (:mod:`.errors` draws the tree); container gates
  in :mod:`.formats`, numeric contracts in :mod:`.contracts`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardport._lazy import lazy_exports

if TYPE_CHECKING:
    from shardport.registry.artifact.manifest import Manifest
    from shardport.registry.artifact.refs import Ref, parse_ref
    from shardport.registry.convert import convert
    from shardport.registry.errors import RegistryError
    from shardport.registry.housekeeping import FsckReport, GcReport, fsck, gc
    from shardport.registry.pull import PullResult, pull
    from shardport.registry.push import PushResult, push
    from shardport.registry.session import Session
    from shardport.registry.store.backend import Store
    from shardport.registry.trust.policy import TrustPolicy
    from shardport.registry.trust.resolve import Resolved, resolve
    from shardport.registry.verify import Report, verify_checkpoint, verify_dir, verify_ref

#: Where each exported name lives; imported on first use (PEP 562).
_HOME = {
    "convert": "convert",
    "RegistryError": "errors",
    **dict.fromkeys(("FsckReport", "GcReport", "fsck", "gc"), "housekeeping"),
    "Manifest": "artifact.manifest",
    **dict.fromkeys(("PullResult", "pull"), "pull"),
    **dict.fromkeys(("PushResult", "push"), "push"),
    **dict.fromkeys(("Ref", "parse_ref"), "artifact.refs"),
    **dict.fromkeys(("Resolved", "resolve"), "trust.resolve"),
    "Session": "session",
    "Store": "store.backend",
    "TrustPolicy": "trust.policy",
    **dict.fromkeys(("Report", "verify_checkpoint", "verify_dir", "verify_ref"), "verify"),
}


__getattr__ = lazy_exports(__name__, globals(), _HOME)


__all__ = [
    "FsckReport",
    "GcReport",
    "Manifest",
    "PullResult",
    "PushResult",
    "Ref",
    "RegistryError",
    "Report",
    "Resolved",
    "Session",
    "Store",
    "TrustPolicy",
    "convert",
    "fsck",
    "gc",
    "parse_ref",
    "pull",
    "push",
    "resolve",
    "verify_checkpoint",
    "verify_dir",
    "verify_ref",
]
