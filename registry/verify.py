"""``registry verify``: signatures, tag chain and every hash, for a stored reference or a pulled folder."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from shardport import ShardportError
from shardport.registry.analysis import analyze, check_stored
from shardport.registry.describe import METADATA_DIR, scan
from shardport.registry.errors import NotFoundError, RegistryError, UsageError, VerificationError
from shardport.registry.formats import ContainerError
from shardport.registry.hashing import digest_file, digest_stream
from shardport.registry.manifest import Manifest
from shardport.registry.paths import check_paths
from shardport.registry.refs import Ref
from shardport.registry.resolve import resolve
from shardport.registry.session import Session
from shardport.registry.signatures import check_envelope


@dataclass
class Report:
    """Findings of a verification; ``ok`` when there are none."""

    subject: str
    digest: str | None = None
    checked_files: int = 0
    checked_bytes: int = 0
    signers: list[str] = field(default_factory=list)
    findings: list[dict[str, str]] = field(default_factory=list)
    weights_checked: int = 0
    parse_error: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing was found wrong."""
        return not self.findings

    def add(self, kind: str, obj: str, message: str) -> None:
        """Record a finding."""
        self.findings.append({"kind": kind, "object": obj, "message": message})

    def to_json(self) -> dict[str, object]:
        """The ``--json`` form."""
        return {
            "subject": self.subject,
            "digest": self.digest,
            "ok": self.ok,
            "checked_files": self.checked_files,
            "checked_bytes": self.checked_bytes,
            "signers": self.signers,
            "weights_checked": self.weights_checked,
            "notes": self.notes,
            "findings": self.findings,
        }

    @property
    def exit_code(self) -> int:
        """0 clean, 4 when a container could not be parsed, 1 for any other finding."""
        if self.ok:
            return 0
        return 4 if self.parse_error else 1

    def add_error(self, obj: str, exc: ShardportError) -> None:
        """Record a raised error as a finding."""
        self.add(type(exc).__name__, obj, str(exc))
        if isinstance(exc, ContainerError):
            self.parse_error = True


def _stream_digest(session: Session, digest: str, max_size: int | None = None) -> tuple[str, int]:
    """Digest and size of a stored blob, reading at most ``max_size`` + 1 bytes of it."""
    with session.store.open_blob(digest, max_size=max_size) as fh:
        return digest_stream(fh, limit=max_size)


def verify_ref(session: Session, ref: Ref) -> Report:
    """Verify a stored reference: tag history, signature, manifest, and every file blob's hash."""
    report = Report(subject=str(ref))
    try:
        resolved = resolve(session, ref)
    except NotFoundError:
        raise
    except VerificationError as exc:
        report.add(type(exc).__name__, str(ref), str(exc))
        return report
    report.digest = resolved.digest
    report.signers = list(resolved.signers)
    try:
        check_paths([f.path for f in resolved.manifest.files], source=f"manifest {resolved.digest}")
    except VerificationError as exc:
        report.add(type(exc).__name__, resolved.digest, str(exc))
    for entry in resolved.manifest.files:
        try:
            got, size = _stream_digest(session, entry.digest, entry.size)
        except NotFoundError:
            report.add("MissingBlob", entry.path, f"blob {entry.digest} is missing from the store")
            continue
        except VerificationError as exc:  # not a regular file, or too large (StoreObjectError)
            report.add(type(exc).__name__, entry.path, str(exc))
            continue
        report.checked_files += 1
        report.checked_bytes += size
        if got != entry.digest or size != entry.size:
            report.add(
                "DigestMismatch",
                entry.path,
                f"blob {entry.digest}: expected {entry.size} bytes hashing to {entry.digest}, "
                f"found {size} bytes hashing to {got}",
            )
    return report


def verify_checkpoint(path: Path, *, strict: bool = False) -> Report:
    """Run the container gates, contract inference and semantic gates on a plain local checkpoint."""
    report = Report(subject=str(path))
    root, paths = (path.parent, [path.name]) if path.is_file() else (path, [r for r, _ in scan(path)])
    report.checked_files = len(paths)
    try:
        analysis = analyze(root, paths, witnesses=False, strict=strict)
    except ShardportError as exc:
        report.add_error(str(path), exc)
        return report
    if analysis is None:
        report.add("NoContainer", str(path), "no safetensors or GGUF file to check")
        return report
    report.weights_checked = len(analysis.weights)
    report.notes = list(analysis.notes)
    report.checked_bytes = sum(t.end - t.start for t in analysis.tensors)
    return report


def verify_dir(session: Session, folder: Path, *, strict: bool = False) -> Report:
    """Verify a pulled folder against the manifest and signatures recorded in ``.shardport/``.

    A path without ``.shardport/`` (a plain checkpoint folder or file) is checked with
    :func:`verify_checkpoint` instead.
    """
    meta = folder / METADATA_DIR
    if not (meta / "manifest.json").exists():
        return verify_checkpoint(folder, strict=strict)
    report = Report(subject=str(folder))
    try:
        raw = (meta / "manifest.json").read_bytes()
        ref = json.loads((meta / "ref.json").read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{folder}: no shardport metadata ({METADATA_DIR}/manifest.json, ref.json); "
            "verify takes a folder written by `registry pull` or a stored reference"
        ) from exc
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    report.digest = digest
    if ref.get("digest") != digest:
        report.add(
            "DigestMismatch",
            "manifest.json",
            f"manifest hashes to {digest}, ref.json says {ref.get('digest')}",
        )
    try:
        manifest = Manifest.from_bytes(raw, source=f"{folder}/{METADATA_DIR}/manifest.json")
        paths = check_paths([f.path for f in manifest.files], source=f"manifest {digest}")
    except RegistryError as exc:
        report.add(type(exc).__name__, "manifest.json", str(exc))
        return report
    signers: list[str] = []
    errors: list[str] = []
    for sig in sorted((meta / "signatures").glob("*.json")):
        try:
            signers += check_envelope(
                session, sig.read_bytes(), str(ref.get("repository", "")), digest, str(sig)
            )
        except VerificationError as exc:
            errors.append(str(exc))
    report.signers = sorted(set(signers))
    if not signers and not session.allow_unsigned:
        report.add("Signature", "manifest.json", errors[0] if errors else "manifest is unsigned")
    expected = {str(p) for p in paths}
    for entry in manifest.files:
        path = folder / entry.path
        if not path.is_file() or path.is_symlink():
            report.add(
                "MissingFile", entry.path, "listed in the manifest but missing (or not a regular file)"
            )
            continue
        got, size = digest_file(path, limit=entry.size)
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
    if report.ok and manifest.tensors and manifest.weights:
        try:
            report.weights_checked = check_stored(folder, manifest.tensors, manifest.weights)
        except ShardportError as exc:
            report.add_error("weights", exc)
    return report
