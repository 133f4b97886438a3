"""``registry verify``: signatures, tag chain and every hash, for a stored reference or a pulled folder."""

from __future__ import annotations

import json
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardport import ShardportError
from shardport.registry import _failpoints
from shardport.registry import verify_content as content
from shardport.registry.artifact.hashing import digest_bytes, digest_file
from shardport.registry.artifact.manifest import FileEntry, Manifest
from shardport.registry.artifact.manifest_check import check_manifest
from shardport.registry.artifact.paths import check_paths
from shardport.registry.artifact.refs import Ref
from shardport.registry.artifact.witness_file import FOLDER_NAME as WITNESS_FILE
from shardport.registry.checkpoint.analysis import analyze
from shardport.registry.checkpoint.describe import METADATA_DIR, scan
from shardport.registry.errors import (
    NotFoundError,
    RefusedError,
    RegistryError,
    UsageError,
    VerificationError,
)
from shardport.registry.output.staging import block_stopping_signals, stop_on_signals
from shardport.registry.results import result_json
from shardport.registry.session import Session
from shardport.registry.tiles.model import TileIndex
from shardport.registry.trust.signatures import check_envelope, referrers, verify_manifest
from shardport.registry.trust.tagging import history

if TYPE_CHECKING:
    from shardport.registry.artifact.digests import Digest

WORKERS = 4
"""Blobs streamed from the store at once by ``verify REF``."""
MAX_ATTACHMENT = 64 << 20
"""Bytes hashed at most of one attachment (signature, evidence) before it counts as oversized."""


@dataclass
class Report:
    """Findings of a verification; ``ok`` when there are none."""

    subject: str
    digest: Digest | None = None
    checked_files: int = 0
    checked_bytes: int = 0
    checked_tiles: int = 0
    signers: list[str] = field(default_factory=list)
    findings: list[dict[str, str]] = field(default_factory=list)
    weights_checked: int = 0
    parse_error: bool = False
    notes: list[str] = field(default_factory=list)
    evidence_verified: int = 0

    @property
    def ok(self) -> bool:
        """True when nothing was found wrong."""
        return not self.findings

    def add(self, kind: str, obj: str, message: str) -> None:
        """Record a finding."""
        self.findings.append({"kind": kind, "object": obj, "message": message})

    def to_json(self) -> dict[str, object]:
        """The ``--json`` form."""
        return result_json(self, skip=("parse_error",), ok=self.ok)

    @property
    def exit_code(self) -> int:
        """0 clean, 5 when a container or contract gate refused the checkpoint, 1 for any other finding."""
        if self.ok:
            return 0
        return 5 if self.parse_error else 1

    def add_error(self, obj: str, exc: ShardportError) -> None:
        """Record a raised error as a finding."""
        self.add(type(exc).__name__, obj, str(exc))
        if exc.exit_code == RefusedError.exit_code:  # a gate refused it (a witness mismatch is a lie: 1)
            self.parse_error = True


def _manifest_of(session: Session, ref: Ref, report: Report) -> Manifest | None:
    """Resolve ``ref`` stage by stage as :func:`resolve` does, recording failures as findings.

    A tag history that does not verify or a manifest that cannot be read ends the check; a manifest
    whose signatures do not verify is still checked further, so one run reports every finding.
    """
    if ref.tag is not None:
        try:
            entries = history(session, ref.name, ref.tag)
        except VerificationError as exc:
            report.add(type(exc).__name__, str(ref), str(exc))
            return None
        if not entries:
            raise NotFoundError(f"tag {ref}: not found in store {session.store.url}")
        digest = entries[-1].doc.target
    else:
        assert ref.digest is not None
        digest = ref.digest
    report.digest = digest
    try:
        raw = session.store.read_blob(digest)
    except NotFoundError as exc:
        raise NotFoundError(f"manifest {digest} ({ref}): not found in store {session.store.url}") from exc
    except VerificationError as exc:
        report.add(type(exc).__name__, digest, str(exc))
        return None
    try:
        manifest = Manifest.from_bytes(raw, source=f"manifest {digest}")
    except VerificationError as exc:
        report.add(type(exc).__name__, digest, str(exc))
        return None
    try:
        report.signers = verify_manifest(session, ref.name, digest, ref.tag)
    except VerificationError as exc:
        report.add(type(exc).__name__, digest, str(exc))
    try:
        check_paths([f.path for f in manifest.files], source=f"manifest {digest}")
        check_manifest(manifest, source=f"manifest {digest}")  # what resolve() refuses for a pull
    except VerificationError as exc:
        report.add(type(exc).__name__, digest, str(exc))
        return None  # nothing is written under paths that could escape the work folder
    return manifest


def _attachments(session: Session, ref: Ref, digest: Digest, report: Report) -> None:
    """Every blob attached to the manifest (signatures, evidence) is present and hashes to its name."""
    for blob in referrers(session, ref.name, digest):
        try:
            got, size = session.store.digest_blob(blob, max_size=MAX_ATTACHMENT)
        except NotFoundError:
            report.add(
                "MissingBlob", f"attachment {blob}", "attached to the manifest but missing from the store"
            )
            continue
        except VerificationError as exc:  # not a regular file (StoreObjectError)
            report.add(type(exc).__name__, f"attachment {blob}", str(exc))
            continue
        if size > MAX_ATTACHMENT:
            report.add("DigestMismatch", f"attachment {blob}", f"larger than {MAX_ATTACHMENT} bytes")
        elif got != blob:
            report.add("DigestMismatch", f"attachment {blob}", f"content hashes to {got}")


def _evidence(session: Session, ref: Ref, digest: str, report: Report) -> None:
    """Every bring-up evidence statement verifies and agrees with itself.

    Signer trusted, subject and predicate this manifest; its ``passed`` recomputed from its parity rows
    (:func:`~shardport.registry.artifact.evidence_rows.verdict_findings`: a statement whose verdict or a row's
    status disagrees is an ``EvidenceVerdict`` finding naming the row); its ladder attachment, where it
    names one, present, trusted and matching the digest it names.
    """
    from shardport.registry.artifact.evidence_rows import verdict_findings
    from shardport.registry.evidence import read_attachment, read_evidence

    found = read_evidence(session, ref.name, digest)
    report.evidence_verified = len(found.verified)
    reported = {f["object"] for f in report.findings}
    for blob, kind, message in found.failures:
        if f"attachment {blob}" not in reported:  # a missing or altered blob is already a finding
            report.add(kind, f"evidence {blob}", message)
    for ev in found.verified:
        for problem in verdict_findings(ev.predicate):
            report.add("EvidenceVerdict", f"evidence {ev.digest}", problem)
        values = ev.predicate.get("ladder_values")
        if not isinstance(values, dict) or values.get("blob") is None:
            continue
        try:
            read_attachment(session, ref.name, digest, str(values["blob"]), str(values.get("sha256")))
        except (NotFoundError, VerificationError) as exc:
            report.add(type(exc).__name__, f"evidence {ev.digest}", str(exc))


def _fetch(
    session: Session, entry: FileEntry, root: Path | None
) -> tuple[FileEntry, str, int] | VerificationError | None:
    """Stream one file blob once: into ``root`` (a verified copy) or only through the hash.

    None: the blob is missing; a :class:`VerificationError`: the store's file is not a regular file.
    """
    try:
        if root is None:
            got, size = session.store.digest_blob(entry.digest, max_size=entry.size)
        else:
            target = root / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            got, size = session.store.fetch_blob(entry.digest, target, max_size=entry.size)
    except NotFoundError:
        return None
    except VerificationError as exc:  # a link, pipe or device in the blob's place (StoreObjectError)
        return exc
    return entry, got, size


def _check_room(workdir: Path | None, needed: int) -> None:
    """Refuse before copying anything when the temporary folder cannot hold ``needed`` bytes."""
    where = Path(workdir or tempfile.gettempdir())
    free = shutil.disk_usage(where).free
    if needed > free:
        raise UsageError(
            f"verify needs {needed} bytes of temporary space for a checked copy of the tensor files, "
            f"{where} has {free} free; set TMPDIR to a folder with room"
        )


def verify_ref(session: Session, ref: Ref, *, workdir: Path | None = None) -> Report:
    """Verify a stored reference as pull and rank pulls would: every stage, every byte, every witness.

    Tag history and signatures; every file blob's sha256 and size; the tile index blob against its
    digest, against the tensor table, and every tile's BLAKE3 against the bytes; the safetensors/GGUF
    headers against the tensor table; the semantic gates and every witness re-decoded; every attached
    blob present and intact. Blobs holding tensors are streamed once into a temporary folder under
    ``workdir`` (default: the system's temporary folder; disk: the size of those files; removed at the
    end), other blobs only through the hash. Every failing thing is a finding.
    """
    with stop_on_signals():  # SIGTERM/SIGHUP remove the temporary copy too
        return _verify_ref(session, ref, workdir)


def _tile_index(session: Session, manifest: Manifest, report: Report) -> TileIndex | None:
    """The manifest's tile index, read and parsed (None, with a finding or note, when it cannot be)."""
    if manifest.tile_index is None:
        if manifest.tensors:
            report.notes.append("no tile index: rank pulls of this artifact are refused (re-push to add one)")
        return None
    where = f"tile index {manifest.tile_index.digest}"
    try:
        return TileIndex.from_bytes(session.store.read_blob(manifest.tile_index.digest), source=where)
    except NotFoundError:
        report.add("MissingBlob", "tile index", f"{where} is missing from the store")
    except VerificationError as exc:
        report.add(type(exc).__name__, "tile index", str(exc))
    return None


Fetched = tuple[FileEntry, "tuple[FileEntry, str, int] | VerificationError | None"]


def _file_findings(done: list[Fetched], report: Report) -> tuple[set[str], set[str]]:
    """Findings of each file blob streamed; the files of the right size, and of the right bytes."""
    intact: set[str] = set()  # the right size: tiles and headers can be read
    exact: set[str] = set()  # the right bytes: what pull would accept
    for entry, fetched in done:
        if fetched is None:
            report.add("MissingBlob", entry.path, f"blob {entry.digest} is missing from the store")
            continue
        if isinstance(fetched, VerificationError):
            report.add(type(fetched).__name__, entry.path, str(fetched))
            continue
        _, got, size = fetched
        report.checked_files += 1
        report.checked_bytes += size
        if got != entry.digest or size != entry.size:
            found = (
                f"more than {entry.size} bytes (read no further)"
                if size > entry.size
                else f"{size} bytes hashing to {got}"
            )
            report.add(
                "DigestMismatch",
                entry.path,
                f"blob {entry.digest}: expected {entry.size} bytes hashing to {entry.digest}, found {found}",
            )
        if size == entry.size:
            intact.add(entry.path)
            if got == entry.digest:
                exact.add(entry.path)
    return intact, exact


def _verify_ref(session: Session, ref: Ref, workdir: Path | None) -> Report:
    report = Report(subject=str(ref))
    manifest = _manifest_of(session, ref, report)
    if manifest is None or report.digest is None:
        return report
    _attachments(session, ref, report.digest, report)
    _evidence(session, ref, report.digest, report)
    index = _tile_index(session, manifest, report)
    tiled: set[str] = set()
    if index is not None:
        problems, tiled = content.index_findings(manifest, index)
        for kind, obj, message in problems:
            report.add(kind, obj, message)
    table = content.table_findings(manifest)
    for kind, obj, message in table:
        report.add(kind, obj, message)
    paths = {f.path for f in manifest.files}
    copied = {e.file for e in manifest.tensors or [] if e.file in paths}
    copied |= {p for p in paths if p.endswith((".safetensors", ".gguf"))}
    _check_room(workdir, sum(f.size for f in manifest.files if f.path in copied))
    with tempfile.TemporaryDirectory(prefix="shardport-verify-", dir=workdir) as tmp:
        root = Path(tmp)
        with ThreadPoolExecutor(max_workers=WORKERS, initializer=block_stopping_signals) as pool:
            done = list(
                pool.map(
                    lambda f: (f, _fetch(session, f, root if f.path in copied else None)), manifest.files
                )
            )
        _failpoints.hit("verify-blobs-fetched")
        intact, exact = _file_findings(done, report)
        if index is not None:
            names = {n for n in tiled if index.tensors[n].file in intact}
            report.checked_tiles, problems = content.tile_findings(root, index, names)
            for kind, obj, message in problems:
                report.add(kind, obj, message)
        for kind, obj, message in content.header_findings(root, manifest, intact):
            report.add(kind, obj, message)
        if table or not copied <= exact:
            if manifest.weights:
                report.notes.append(
                    "witnesses not re-decoded: the stored bytes or tensor table already failed"
                )
            return report
        report.weights_checked, problems = content.check_weights(
            root, manifest, session.store.read_blob, source="producer witness"
        )
        for kind, obj, message in problems:
            report.add(kind, obj, message)
    return report


def verify_checkpoint(path: Path, *, strict: bool = False, allow_nonfinite: bool = False) -> Report:
    """Run the container gates, contract inference and semantic gates on a plain local checkpoint.

    As push: a float tensor holding NaN or inf fails it, unless ``allow_nonfinite`` (then a note).
    """
    report = Report(subject=str(path))
    root, paths = (path.parent, [path.name]) if path.is_file() else (path, [r for r, _ in scan(path)])
    report.checked_files = len(paths)
    try:
        analysis = analyze(root, paths, witnesses=False, strict=strict, allow_nonfinite=allow_nonfinite)
    except ShardportError as exc:
        report.add_error(str(path), exc)
        return report
    if analysis is None:
        report.add("NoContainer", str(path), "no safetensors or GGUF file to check")
        return report
    report.weights_checked = len(analysis.weights)
    report.notes = [*analysis.remarks, *(n.message for n in analysis.notes)]
    report.checked_bytes = sum(t.end - t.start for t in analysis.tensors)
    return report


def _pulled_signatures(
    session: Session, meta: Path, ref: dict[str, Any], digest: str, report: Report
) -> None:
    """The signatures a pull saved beside the files: at least one trusted, unless unsigned is allowed."""
    signers: list[str] = []
    errors: list[str] = []
    pulled = str(ref.get("ref", ""))  # the tag a pull went through vouches for tag-scoped keys
    pulled_tag = pulled.rpartition(":")[2] if "@" not in pulled and ":" in pulled else None
    for sig in sorted((meta / "signatures").glob("*.json")):
        try:
            signers += check_envelope(
                session, sig.read_bytes(), str(ref.get("repository", "")), digest, str(sig), pulled_tag
            )
        except VerificationError as exc:
            errors.append(str(exc))
    report.signers = sorted(set(signers))
    if not signers and not session.allow_unsigned:
        report.add("Signature", "manifest.json", errors[0] if errors else "manifest is unsigned")


def verify_dir(
    session: Session, folder: Path, *, strict: bool = False, allow_nonfinite: bool = False
) -> Report:
    """Verify a pulled folder against the manifest and signatures recorded in ``.shardport/``.

    A path without ``.shardport/`` (a plain checkpoint folder or file) is checked with
    :func:`verify_checkpoint` instead.
    """
    meta = folder / METADATA_DIR
    if not (meta / "manifest.json").exists():
        return verify_checkpoint(folder, strict=strict, allow_nonfinite=allow_nonfinite)
    report = Report(subject=str(folder))
    try:
        raw = (meta / "manifest.json").read_bytes()
        ref = json.loads((meta / "ref.json").read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise UsageError(
            f"{folder}: no shardport metadata ({METADATA_DIR}/manifest.json, ref.json); "
            "verify takes a folder written by `registry pull` or a stored reference"
        ) from exc
    digest = digest_bytes(raw)
    report.digest = digest
    if ref.get("digest") != digest:
        report.add(
            "DigestMismatch",
            "manifest.json",
            f"manifest hashes to {digest}, ref.json says {ref.get('digest')}",
        )
    try:
        manifest = Manifest.from_bytes(raw, source=f"{folder}/{METADATA_DIR}/manifest.json")
        check_manifest(manifest, source=f"manifest {digest}")
        paths = check_paths([f.path for f in manifest.files], source=f"manifest {digest}")
    except RegistryError as exc:
        report.add(type(exc).__name__, "manifest.json", str(exc))
        return report
    _pulled_signatures(session, meta, ref, digest, report)
    expected = {str(p) for p in paths}
    for entry in manifest.files:
        path = folder / entry.path
        if not path.is_file() or path.is_symlink():
            report.add(
                "MissingFile", entry.path, "listed in the manifest but missing (or not a regular file)"
            )
            continue
        got, size = digest_file(path, limit=entry.size)  # never more than listed + 1 byte
        report.checked_files += 1
        report.checked_bytes += size
        if got != entry.digest or size != entry.size:
            report.add(
                "DigestMismatch",
                entry.path,
                f"expected {entry.size} bytes hashing to {entry.digest}, found {size} bytes hashing to {got}",
            )
    for rel, _ in scan(folder):
        if rel not in expected:
            report.add("ExtraFile", rel, "present in the folder but not in the manifest")
    present = {
        e.path for e in manifest.files if (folder / e.path).is_file() and not (folder / e.path).is_symlink()
    }
    for kind, obj, message in content.gguf_header_findings(folder, manifest, present):
        report.add(kind, obj, message)
    if report.ok:
        report.weights_checked, problems = content.check_weights(
            folder,
            manifest,
            lambda _: (meta / WITNESS_FILE).read_bytes(),
            source=f"{METADATA_DIR}/{WITNESS_FILE}",
        )
        for kind, obj, message in problems:
            report.add(kind, obj, message)
    return report
