"""Persisted client trust state: per store and tag, the highest version and document digest seen.

Kept under ``$SHARDPORT_HOME/state/<store-id>.json``; updated under an exclusive lock, written
atomically, and only ever moved forward.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from shardport.registry.hashing import check_digest
from shardport.registry.tags import SeenTag


class TrustState:
    """Trusted tag state for one store."""

    def __init__(self, folder: Path, store_id: str) -> None:
        self.path = folder / (hashlib.sha256(store_id.encode()).hexdigest()[:24] + ".json")
        self.store_id = store_id

    def _load(self) -> dict[str, dict[str, object]]:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        tags = doc.get("tags", {})
        return tags if isinstance(tags, dict) else {}

    def get(self, repository: str, tag: str) -> SeenTag | None:
        """What was last trusted for ``repository:tag``."""
        entry = self._load().get(f"{repository}:{tag}")
        if not entry:
            return None
        digest = check_digest(entry["digest"], what=f"client state {self.path}: {repository}:{tag}")
        return SeenTag(version=int(str(entry["version"])), digest=digest)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def advance(self, repository: str, tag: str, seen: SeenTag) -> None:
        """Record ``seen`` unless a higher version is already recorded."""
        with self._locked():
            tags = self._load()
            key = f"{repository}:{tag}"
            old = tags.get(key)
            if old and int(str(old["version"])) >= seen.version:
                return
            tags[key] = {"version": seen.version, "digest": seen.digest}
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"store": self.store_id, "tags": tags}, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
