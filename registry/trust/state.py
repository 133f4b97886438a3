"""Persisted client trust state: per store and tag, the highest version and document digest seen.

Kept under ``$SHARDPORT_HOME/state/<sha256(store identity)[:24]>.json``; updated under an exclusive
lock, written atomically, and only ever moved forward.

The store identity is normalised (:func:`store_identity`): however a user spells the same store
(``s3://b/reg``, ``s3://b/reg/``, with ``--s3-endpoint`` or ``AWS_ENDPOINT_URL``), one state file
protects it, so deleting a version on the server is caught whichever spelling the next command uses.
Files written under the spellings older releases used are read too (the highest version wins).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

from shardport.registry.artifact.hashing import is_digest
from shardport.registry.errors import StateFileError
from shardport.registry.output.writers import write_file
from shardport.registry.trust.tags import SeenTag

_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalise_endpoint(endpoint: str | None) -> str:
    """An S3 endpoint URL in one spelling: lowercase scheme and host, no default port, no trailing ``/``.

    None (no endpoint configured) is AWS itself, whose bucket names are global: ``aws``.
    """
    if not endpoint:
        return "aws"
    parts = urlsplit(endpoint.strip())
    scheme = (parts.scheme or "https").lower()
    host = (parts.hostname or "").lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = host if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"
    return f"{scheme}://{netloc}{parts.path.rstrip('/')}"


def store_identity(url: str, *, local_root: str | None, endpoint: str | None) -> str:
    """The identity that client state is keyed by.

    Local stores: ``file://`` + the resolved folder. S3: ``s3://bucket/prefix`` (no leading, trailing or
    doubled slashes) + ``@`` + the normalised resolved endpoint (:func:`normalise_endpoint`).
    """
    if local_root is not None:
        return f"file://{local_root}"
    path = url.removeprefix("s3://")
    segments = [s for s in path.split("/") if s]
    return f"s3://{'/'.join(segments)}@{normalise_endpoint(endpoint)}"


def legacy_identities(url: str, explicit_endpoint: str | None) -> tuple[str, ...]:
    """The ids older releases keyed an S3 store's state by (the raw URL, ``#endpoint`` when given)."""
    bases = {url, url.rstrip("/"), url.rstrip("/") + "/"}
    ids = set(bases)
    if explicit_endpoint:
        ids |= {f"{b}#{explicit_endpoint}" for b in bases}
    return tuple(sorted(ids))


def _file_for(folder: Path, store_id: str) -> Path:
    return folder / (hashlib.sha256(store_id.encode()).hexdigest()[:24] + ".json")


def _parse(path: Path) -> dict[str, SeenTag]:
    """The tags recorded in one state file ({} when it does not exist); :class:`StateFileError` if corrupt."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise StateFileError(f"client state {path}: cannot be read ({exc.strerror})") from exc
    remedy = (
        "it records the tag versions this client has trusted (rollback protection); restore it, or "
        "delete it to trust the store's current tags afresh"
    )
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise StateFileError(f"client state {path}: not valid JSON ({exc}); {remedy}") from exc
    tags = doc.get("tags", {}) if isinstance(doc, dict) else None
    if not isinstance(tags, dict):
        raise StateFileError(f"client state {path}: expected an object with a 'tags' object; {remedy}")
    out: dict[str, SeenTag] = {}
    for key, entry in tags.items():
        version = entry.get("version") if isinstance(entry, dict) else None
        digest = entry.get("digest") if isinstance(entry, dict) else None
        if not isinstance(version, int) or isinstance(version, bool) or version < 1 or not is_digest(digest):
            raise StateFileError(
                f"client state {path}: tag {key!r}: expected {{'version': int >= 1, 'digest': "
                f"'sha256:<64 hex>'}}, found {entry!r}; {remedy}"
            )
        out[str(key)] = SeenTag(version=version, digest=digest)
    return out


class TrustState:
    """Trusted tag state for one store."""

    def __init__(self, folder: Path, store_id: str, legacy_ids: Iterable[str] = ()) -> None:
        self.path = _file_for(folder, store_id)
        self.store_id = store_id
        self.legacy_paths = tuple(p for p in (_file_for(folder, i) for i in legacy_ids) if p != self.path)

    def _load(self) -> dict[str, SeenTag]:
        return _parse(self.path)

    def get(self, repository: str, tag: str) -> SeenTag | None:
        """What was last trusted for ``repository:tag`` (the highest version across legacy files too)."""
        key = f"{repository}:{tag}"
        best = self._load().get(key)
        for legacy in self.legacy_paths:
            old = _parse(legacy).get(key)
            if old is not None and (best is None or old.version > best.version):
                best = old
        return best

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
            if old and old.version >= seen.version:
                return
            tags[key] = seen
            doc = {
                "store": self.store_id,
                "tags": {k: {"version": v.version, "digest": v.digest} for k, v in tags.items()},
            }
            write_file(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())
