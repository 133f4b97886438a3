"""``registry gc`` and ``registry fsck``.

gc marks from every retained tag version (so rollback targets survive), every manifest's files and
attachments, every live upload lease, and a grace window on blob age; then sweeps the rest.
fsck reports corrupt blobs (content not hashing to the name), dangling references, broken tags, damaged
referrer links and tag versions whose manifest lost every signature (what a pull would refuse).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shardport.provenance.dsse import Envelope
from shardport.provenance.errors import EnvelopeFormatError
from shardport.provenance.keys import VerifyingKey
from shardport.provenance.statement import Statement
from shardport.registry import _failpoints
from shardport.registry.artifact.digests import Digest
from shardport.registry.artifact.hashing import digest_bytes, digest_of_hex, hex_of, is_digest
from shardport.registry.artifact.manifest import Manifest
from shardport.registry.artifact.manifest_check import check_manifest
from shardport.registry.errors import NotFoundError, RegistryError, VerificationError
from shardport.registry.results import result_json
from shardport.registry.session import Session
from shardport.registry.store.keys import blob_key
from shardport.registry.trust.policy import TrustPolicy
from shardport.registry.trust.signatures import SIGNATURE_ARTIFACT, SIGNATURE_PREDICATE, SIGSTORE_ARTIFACT
from shardport.registry.trust.tagging import read_raw_history, repositories
from shardport.registry.trust.tags import TagEntry, parse_time, verify_history

GRACE = timedelta(hours=1)
MAX_SIGNATURE = 16 << 20
"""Bytes a signature envelope or bundle may have; a larger blob linked as one is not read."""


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
        return result_json(self)


def _mark_manifest(session: Session, name: str, digest: Digest, live: set[str]) -> None:
    live.add(digest)
    try:
        manifest = Manifest.from_bytes(session.store.read_blob(digest), source=f"manifest {digest}")
    except (RegistryError, ValueError):  # a missing or corrupt manifest marks nothing more
        return
    live.update(f.digest for f in manifest.files)
    if manifest.tile_index is not None:
        live.add(manifest.tile_index.digest)
    if manifest.producer_witness is not None:
        live.add(manifest.producer_witness.digest)
    folder = f"repos/{name}/referrers/{hex_of(digest)}"
    live.update(d for child in session.store.listdir(folder) if (d := digest_of_hex(child)) is not None)


def _mark(session: Session, now: datetime, grace: timedelta) -> tuple[set[str], set[str], list[str]]:
    """(live digests, folders of live leases, expired lease folders): the mark phase of gc."""
    store = session.store
    live: set[str] = set()
    leased: set[str] = set()  # folders of live leases: everything in them is in use (a push, a convert)
    expired: list[str] = []
    for obj in store.walk("uploads"):
        if obj.key.endswith("/lease.json"):
            folder = obj.key.rsplit("/", 1)[0]
            try:
                lease = json.loads(store.read(obj.key))
                expires = parse_time(lease["expires"])
                digests = [d for d in lease["digests"] if is_digest(d)]
            except (ValueError, RecursionError, KeyError, TypeError):
                expires, digests = obj.mtime + grace, []
            except NotFoundError:  # the command finished (its lease removed) between walk and read
                continue
            if expires > now:
                live.update(digests)
                leased.add(folder + "/")
            else:
                expired.append(folder)
    for name in repositories(session):
        for tag in store.listdir(f"repos/{name}/tags"):
            for doc_digest, target in _targets(session, name, tag):
                live.add(doc_digest)
                if target:
                    _mark_manifest(session, name, target, live)
    return live, leased, expired


def gc(session: Session, *, dry_run: bool = False, grace: timedelta = GRACE) -> GcReport:
    """Collect unreferenced blobs, expired uploads and attachments of collected manifests.

    Marks twice: once to choose what to remove, and again (leases and tags re-read) just before
    removing it, sparing whatever a push, convert or tag made live in between (a push that found a
    garbage blob already present, and so did not upload it, names it in its lease or its tag).
    Attachments go before blobs, so a gc killed half-way leaves no link to a removed manifest.
    """
    store = session.store
    now = session.clock()
    report = GcReport(dry_run=dry_run)
    uploads = list(store.walk("uploads"))
    live, leased, expired = _mark(session, now, grace)
    report.removed_uploads.extend(expired)
    for obj in uploads:
        if (
            not obj.key.endswith("/lease.json")
            and obj.mtime < now - grace
            and not any(obj.key.startswith(folder) for folder in leased)
        ):
            report.removed_uploads.append(obj.key)
    sizes: dict[str, int] = {}
    for obj in store.walk("blobs/sha256"):
        digest = digest_of_hex(obj.key.rsplit("/", 1)[-1])
        if digest is None or digest in live or obj.mtime > now - grace:  # None: not a blob, not ours
            report.kept_blobs += 1
            continue
        sizes[digest] = obj.size
    referrers = [
        (f"repos/{name}/referrers/{child}", digest_of_hex(child))
        for name in repositories(session)
        for child in store.listdir(f"repos/{name}/referrers")
        if digest_of_hex(child) not in live
    ]
    if not dry_run:
        _failpoints.hit("gc-marked")
        again, leased_now, _ = _mark(session, now, grace)
        report.kept_blobs += len(sizes.keys() & again)
        sizes = {d: n for d, n in sizes.items() if d not in again}
        referrers = [(key, d) for key, d in referrers if d is None or d not in again]
        report.removed_uploads = [
            k for k in report.removed_uploads if not any(k.startswith(f) for f in leased_now)
        ]
    report.removed_blobs = list(sizes)
    report.removed_bytes = sum(sizes.values())
    report.removed_referrers = [key for key, _ in referrers]
    if not dry_run:
        for key in report.removed_referrers:
            store.delete_tree(key)
        _sweep_blobs(session, report, sizes, now, grace)
        for key in report.removed_uploads:
            store.delete_tree(key)
    return report


SWEEP_BATCH = 256
"""Blobs deleted between two marks: a push that leased, reused and tagged one of them since the last mark
is seen by the next (and a push re-checks what it reused once it tagged: :mod:`.push`)."""


def _sweep_blobs(
    session: Session, report: GcReport, sizes: dict[str, int], now: datetime, grace: timedelta
) -> None:
    """Delete ``report.removed_blobs`` in batches, marking again before each and sparing what is live."""
    removed: list[str] = []
    pending = list(report.removed_blobs)
    while pending:
        batch, pending = pending[:SWEEP_BATCH], pending[SWEEP_BATCH:]
        live, _, _ = _mark(session, now, grace)
        for digest in batch:
            if digest in live:
                report.kept_blobs += 1
                report.removed_bytes -= sizes.get(digest, 0)
                continue
            session.store.delete(blob_key(digest))
            removed.append(digest)
            _failpoints.hit("gc-blob-removed")
    report.removed_blobs = removed


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
    referrers: int = 0
    corrupt: list[str] = field(default_factory=list)
    dangling: list[str] = field(default_factory=list)
    broken_tags: list[str] = field(default_factory=list)
    bad_referrers: list[str] = field(default_factory=list)
    unsigned: list[str] = field(default_factory=list)
    stale_uploads: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is corrupt, dangling, broken or unsigned (stale uploads are only reported)."""
        return not (self.corrupt or self.dangling or self.broken_tags or self.bad_referrers or self.unsigned)

    def to_json(self) -> dict[str, object]:
        """The ``--json`` form."""
        return result_json(self, ok=self.ok)


def _known_keys(session: Session, env: Envelope) -> list[VerifyingKey]:
    """The policy's keys among those that say they signed ``env`` (these can be checked)."""
    ids = {s.keyid for s in env.signatures}
    return [k.key for k in session.policy.keys if k.key.keyid in ids]


def _signature_problem(session: Session, manifest: str, raw: bytes, artifact: str) -> str | None:
    """Why a signature blob attached to ``manifest`` could not make a pull accept it, or None.

    Structure only (fsck makes no trust decisions), plus the cryptographic check for every key the
    trust policy knows.
    """
    if artifact == SIGSTORE_ARTIFACT:
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            return f"Sigstore bundle is not JSON ({exc})"
        return None if isinstance(doc, dict) else "Sigstore bundle is not a JSON object"
    try:
        env = Envelope.from_bytes(raw, source="signature")
        st = Statement.from_bytes(env.payload)
    except (EnvelopeFormatError, ValueError) as exc:
        return f"not a DSSE signature envelope ({exc})"
    if st.predicate_type != SIGNATURE_PREDICATE or [x.sha256 for x in st.subjects] != [hex_of(manifest)]:
        return f"does not sign manifest {manifest}"
    if not env.signatures:
        return "the envelope holds no signature"
    known = _known_keys(session, env)
    if known and not env.signed_by(known):
        return f"signature by {', '.join(k.keyid for k in known)} does not verify"
    return None


def _check_referrers(
    session: Session, name: str, present: dict[str, int], corrupt: set[str], report: FsckReport
) -> set[str]:
    """Check every referrer link of repository ``name``; return the manifests with an intact signature.

    A link must be a JSON document ``{artifactType, digest}`` naming the blob of its own key, that blob
    must be present, and a signature must be a well-formed envelope (or bundle) of that manifest.
    """
    store = session.store
    signed: set[str] = set()
    folder = f"repos/{name}/referrers"
    for child in store.listdir(folder):
        manifest = digest_of_hex(child)
        if manifest is None:
            report.bad_referrers.append(f"{name}: {folder}/{child}: not named by a manifest digest")
            continue
        links = store.listdir(f"{folder}/{child}")
        if not links:  # an empty folder: nothing attached (SeaweedFS lists the folders deletes leave)
            continue
        if manifest not in present:
            report.dangling.append(f"{name}: attachments of manifest {manifest}, which is missing")
        for link in links:
            report.referrers += 1
            where = f"{name}: attachment sha256:{link} of {manifest}"
            blob = digest_of_hex(link)
            if blob is None:
                report.bad_referrers.append(f"{where}: the link is not named by a blob digest")
                continue
            if blob not in present:
                report.dangling.append(f"{name}: attachment {blob} of {manifest} is missing")
                continue
            try:
                doc = json.loads(store.read(f"{folder}/{child}/{link}"))
            except (ValueError, RecursionError) as exc:
                report.bad_referrers.append(f"{where}: the link is not a JSON document ({exc})")
                continue
            artifact = doc.get("artifactType") if isinstance(doc, dict) else None
            if not isinstance(doc, dict) or doc.get("digest") != blob or not isinstance(artifact, str):
                report.bad_referrers.append(
                    f"{where}: the link is not {{artifactType, digest}} naming its own blob: {str(doc)[:200]}"
                )
                continue
            if artifact not in (SIGNATURE_ARTIFACT, SIGSTORE_ARTIFACT) or blob in corrupt:
                continue  # a corrupt blob is already reported; evidence is checked by verify REF
            if present[blob] > MAX_SIGNATURE:
                report.bad_referrers.append(f"{where}: {present[blob]} bytes, too large for a signature")
                continue
            problem = _signature_problem(session, manifest, store.read_blob(blob), artifact)
            if problem:
                report.bad_referrers.append(f"{where}: {problem}")
            else:
                signed.add(manifest)
    return signed


def _check_tag(
    session: Session, name: str, tag: str, present: dict[str, int], signed: set[str], report: FsckReport
) -> None:
    """A tag's chain, its documents' signatures by known keys, and what each version points at."""
    store = session.store
    try:
        entries = _chain(session, name, tag)
    except VerificationError as exc:
        report.broken_tags.append(f"{name}:{tag}: {exc}")
        return
    for e in entries:
        where = f"{name}:{tag} version {e.doc.version}"
        env = Envelope.from_bytes(e.raw, source=where)
        known = _known_keys(session, env)
        if known and not env.signed_by(known):
            report.broken_tags.append(f"{where}: signature by {known[0].keyid} does not verify")
        if e.doc.target not in present:
            report.dangling.append(f"{where}: target manifest {e.doc.target} is missing")
            continue
        if e.doc.signer is not None and e.doc.target not in signed:
            report.unsigned.append(
                f"{where}: manifest {e.doc.target} has no intact signature attached in {name} "
                "(a pull fails with UnsignedError)"
            )
        try:
            manifest = Manifest.from_bytes(store.read_blob(e.doc.target))
        except VerificationError as exc:
            report.dangling.append(f"{where}: target manifest unreadable: {exc}")
            continue
        try:  # what resolve() refuses, so a pull of this version would fail
            check_manifest(manifest, source=f"manifest {e.doc.target}")
        except VerificationError as exc:
            report.broken_tags.append(f"{where}: {exc}")
        report.dangling.extend(
            f"{where}: file {f.path} blob {f.digest} is missing"
            for f in manifest.files
            if f.digest not in present
        )
        if manifest.tile_index is not None and manifest.tile_index.digest not in present:
            report.dangling.append(f"{where}: tile index {manifest.tile_index.digest} is missing")
        witness = manifest.producer_witness
        if witness is not None and witness.digest not in present:
            report.dangling.append(f"{where}: producer witness {witness.digest} is missing")


def fsck(session: Session) -> FsckReport:
    """Check every blob's hash, every tag chain, every referrer link, and that everything referenced exists.

    A tag version signed by a key whose manifest has no intact signature link in its repository is
    reported as unsigned: pulling it fails with ``UnsignedError``.
    """
    store = session.store
    report = FsckReport()
    present: dict[str, int] = {}  # digest -> size listed
    corrupt: set[str] = set()
    for obj in store.walk("blobs/sha256"):
        digest = digest_of_hex(obj.key.rsplit("/", 1)[-1])
        report.blobs += 1
        if digest is None:
            report.corrupt.append(f"{obj.key}: not a blob name (expected 64 lowercase hex digits)")
            continue
        present[digest] = obj.size
        try:
            got, _ = store.digest_blob(digest, max_size=obj.size)  # never more than listed + 1 byte
        except RegistryError as exc:  # not a regular file (StoreObjectError), unreadable
            corrupt.add(digest)
            report.corrupt.append(f"{digest}: {exc}")
            continue
        if got != digest:
            corrupt.add(digest)
            report.corrupt.append(f"{digest}: content hashes to {got}")
    for name in repositories(session):
        signed = _check_referrers(session, name, present, corrupt, report)
        for tag in store.listdir(f"repos/{name}/tags"):
            report.tags += 1
            _check_tag(session, name, tag, present, signed, report)
    report.stale_uploads = sorted({o.key.split("/")[1] for o in store.walk("uploads") if "/" in o.key})
    return report
