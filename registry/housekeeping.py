"""``registry gc`` and ``registry fsck``.

gc marks from every retained tag version (so rollback targets survive), every manifest's files and
attachments, every live upload lease, and a grace window on blob age; then sweeps the rest.
fsck reports corrupt blobs (content not hashing to the name), dangling references and broken tags.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shardport.provenance.dsse import Envelope
from shardport.provenance.errors import EnvelopeFormatError
from shardport.provenance.statement import Statement
from shardport.registry.errors import RegistryError, VerificationError
from shardport.registry.hashing import digest_bytes, hex_of
from shardport.registry.manifest import Manifest
from shardport.registry.session import Session
from shardport.registry.store import blob_key
from shardport.registry.tagging import read_raw_history
from shardport.registry.tags import TagEntry, parse_time, verify_history
from shardport.registry.trust import TrustPolicy
from shardport.registry.verify import _stream_digest

GRACE = timedelta(hours=1)
_HEX = re.compile(r"^[0-9a-f]{64}$")


def repositories(session: Session) -> list[str]:
    """Every repository name in the store (names may contain ``/``)."""
    found = set()
    for obj in session.store.walk("repos"):
        parts = obj.key.split("/")
        for marker in ("tags", "referrers"):
            if marker in parts[2:]:
                idx = parts.index(marker, 2)
                found.add("/".join(parts[1:idx]))
    return sorted(found)


def _chain(session: Session, name: str, tag: str) -> list[TagEntry]:
    """A tag's history checked for structure only (no trust decisions): for housekeeping."""
    return verify_history(
        read_raw_history(session, name, tag),
        repository=name,
        tag=tag,
        policy=TrustPolicy(),
        seen=None,
        now=datetime.min.replace(tzinfo=session.clock().tzinfo),
        allow_unsigned=True,
    )


@dataclass
class GcReport:
    """What gc kept and removed."""

    dry_run: bool
    kept_blobs: int = 0
    removed_blobs: list[str] = field(default_factory=list)
    removed_bytes: int = 0
    removed_uploads: list[str] = field(default_factory=list)
    removed_referrers: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        """The ``--json`` form."""
        return {
            "dry_run": self.dry_run,
            "kept_blobs": self.kept_blobs,
            "removed_blobs": self.removed_blobs,
            "removed_bytes": self.removed_bytes,
            "removed_uploads": self.removed_uploads,
            "removed_referrers": self.removed_referrers,
        }


def _mark_manifest(session: Session, name: str, digest: str, live: set[str]) -> None:
    live.add(digest)
    try:
        manifest = Manifest.from_bytes(session.store.read_blob(digest), source=f"manifest {digest}")
    except (RegistryError, ValueError):  # a missing or corrupt manifest marks nothing more
        return
    live.update(f.digest for f in manifest.files)
    if manifest.tile_index is not None:
        live.add(manifest.tile_index.digest)
    folder = f"repos/{name}/referrers/{hex_of(digest)}"
    live.update("sha256:" + child for child in session.store.listdir(folder) if _HEX.match(child))


def gc(session: Session, *, dry_run: bool = False, grace: timedelta = GRACE) -> GcReport:
    """Collect unreferenced blobs, expired uploads and attachments of collected manifests."""
    store = session.store
    now = session.clock()
    live: set[str] = set()
    report = GcReport(dry_run=dry_run)
    uploads = list(store.walk("uploads"))
    leased: set[str] = set()  # folders of live leases: everything in them is in use (a push, a convert)
    for obj in uploads:
        if obj.key.endswith("/lease.json"):
            folder = obj.key.rsplit("/", 1)[0]
            try:
                lease = json.loads(store.read(obj.key))
                expires = parse_time(lease["expires"])
                digests = [str(d) for d in lease["digests"]]
            except (ValueError, KeyError, TypeError):
                expires, digests = obj.mtime + grace, []
            if expires > now:
                live.update(digests)
                leased.add(folder + "/")
            else:
                report.removed_uploads.append(folder)
    for obj in uploads:
        if (
            not obj.key.endswith("/lease.json")
            and obj.mtime < now - grace
            and not any(obj.key.startswith(folder) for folder in leased)
        ):
            report.removed_uploads.append(obj.key)
    for name in repositories(session):
        for tag in store.listdir(f"repos/{name}/tags"):
            for doc_digest, target in _targets(session, name, tag):
                live.add(doc_digest)
                if target:
                    _mark_manifest(session, name, target, live)
    for obj in store.walk("blobs/sha256"):
        digest = "sha256:" + obj.key.rsplit("/", 1)[-1]
        if digest in live or obj.mtime > now - grace:
            report.kept_blobs += 1
            continue
        report.removed_blobs.append(digest)
        report.removed_bytes += obj.size
    for name in repositories(session):
        for child in store.listdir(f"repos/{name}/referrers"):
            if "sha256:" + child not in live:
                report.removed_referrers.append(f"repos/{name}/referrers/{child}")
    if not dry_run:
        for digest in report.removed_blobs:
            store.delete(blob_key(digest))
        for key in report.removed_referrers:
            store.delete_tree(key)
        for key in report.removed_uploads:
            store.delete_tree(key)
    return report


def _targets(session: Session, name: str, tag: str) -> list[tuple[str, str | None]]:
    """(document digest, target manifest or None when unreadable) for every stored version of a tag."""
    out: list[tuple[str, str | None]] = []
    for _, raw in sorted(read_raw_history(session, name, tag).items()):
        target: str | None
        try:
            target = str(Statement.from_bytes(Envelope.from_bytes(raw).payload).predicate["target"])
        except (EnvelopeFormatError, ValueError, KeyError, TypeError):
            target = None
        out.append((digest_bytes(raw), target))
    return out


@dataclass
class FsckReport:
    """Problems found in a store."""

    blobs: int = 0
    tags: int = 0
    corrupt: list[str] = field(default_factory=list)
    dangling: list[str] = field(default_factory=list)
    broken_tags: list[str] = field(default_factory=list)
    stale_uploads: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is corrupt, dangling or broken (stale uploads are only reported)."""
        return not (self.corrupt or self.dangling or self.broken_tags)

    def to_json(self) -> dict[str, object]:
        """The ``--json`` form."""
        return {
            "ok": self.ok,
            "blobs": self.blobs,
            "tags": self.tags,
            "corrupt": self.corrupt,
            "dangling": self.dangling,
            "broken_tags": self.broken_tags,
            "stale_uploads": self.stale_uploads,
        }


def fsck(session: Session) -> FsckReport:
    """Check every blob's hash, every tag chain, and that everything referenced exists."""
    store = session.store
    report = FsckReport()
    present: set[str] = set()
    for obj in store.walk("blobs/sha256"):
        digest = "sha256:" + obj.key.rsplit("/", 1)[-1]
        report.blobs += 1
        present.add(digest)
        try:
            got, _ = _stream_digest(session, digest)
        except RegistryError as exc:  # not a regular file (StoreObjectError), unreadable
            report.corrupt.append(f"{digest}: {exc}")
            continue
        if got != digest:
            report.corrupt.append(f"{digest}: content hashes to {got}")
    for name in repositories(session):
        for tag in store.listdir(f"repos/{name}/tags"):
            report.tags += 1
            try:
                entries = _chain(session, name, tag)
            except VerificationError as exc:
                report.broken_tags.append(f"{name}:{tag}: {exc}")
                continue
            for e in entries:
                where = f"{name}:{tag} version {e.doc.version}"
                if e.doc.target not in present:
                    report.dangling.append(f"{where}: target manifest {e.doc.target} is missing")
                    continue
                try:
                    manifest = Manifest.from_bytes(store.read_blob(e.doc.target))
                except VerificationError as exc:
                    report.dangling.append(f"{where}: target manifest unreadable: {exc}")
                    continue
                report.dangling.extend(
                    f"{where}: file {f.path} blob {f.digest} is missing"
                    for f in manifest.files
                    if f.digest not in present
                )
                if manifest.tile_index is not None and manifest.tile_index.digest not in present:
                    report.dangling.append(f"{where}: tile index {manifest.tile_index.digest} is missing")
        for child in store.listdir(f"repos/{name}/referrers"):
            for blob in store.listdir(f"repos/{name}/referrers/{child}"):
                if "sha256:" + blob not in present:
                    report.dangling.append(f"{name}: attachment sha256:{blob} of sha256:{child} is missing")
    report.stale_uploads = sorted({o.key.split("/")[1] for o in store.walk("uploads") if "/" in o.key})
    return report
