"""Where shardport keeps its local state: ``$SHARDPORT_HOME`` (default ``~/.shardport``).

::

    $SHARDPORT_HOME/store/            default local store (override with --store or SHARDPORT_STORE)
    $SHARDPORT_HOME/keys/<name>.key   Ed25519 private keys (0600) and <name>.pub public keys
    $SHARDPORT_HOME/trust.json        the trust policy (which keys may sign which repositories/tags)
    $SHARDPORT_HOME/state/            per-store trusted tag state (highest version and digest seen)
"""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """The shardport home folder."""
    return Path(os.environ.get("SHARDPORT_HOME") or "~/.shardport").expanduser()


def default_store_url() -> str:
    """``SHARDPORT_STORE`` or the local store under the home folder."""
    return os.environ.get("SHARDPORT_STORE") or str(home() / "store")


def keys_dir() -> Path:
    """Folder of key pairs."""
    return home() / "keys"


def trust_path() -> Path:
    """The default trust policy file."""
    return home() / "trust.json"


def state_dir() -> Path:
    """Folder of trusted tag state."""
    return home() / "state"
