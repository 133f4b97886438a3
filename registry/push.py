"""Push a checkpoint folder: hash once, upload only missing blobs, then manifest, signature, tag.

Write order (each step only after the previous is durable): blobs → manifest → signature → tag
document. A crash at any point leaves no tag pointing at incomplete content; re-running the push
finds the blobs already stored and uploads only what is missing. A lease under ``uploads/<id>/``
names every blob the push will reference, so a concurrent ``gc`` keeps them.

Manifest layers: ``container`` (spec revision), ``quantization`` and ``packing`` are read from the
checkpoint here (:mod:`.checkpoint.layers`). ``runtime``'s expected kernels and ``topology`` need
the kernel catalogue and the placement planner, above the registry: :func:`push`'s ``layers`` argument (a
pure, deterministic function of the manifest draft) adds them — the CLI passes one. Without it
``runtime`` holds only the kernel ids given and ``topology`` is None.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import shardport
from shardport.registry import _failpoints
from shardport.registry.artifact.hashing import digest_bytes, digest_file
from shardport.registry.artifact.manifest import FileEntry, Manifest, ProvenanceInfo, TileIndexRef
from shardport.registry.artifact.manifest_check import check_manifest
from shardport.registry.artifact.paths import check_paths
from shardport.registry.checkpoint.analysis import Analysis, analyze, producer_witness
from shardport.registry.checkpoint.describe import (
    container_of,
    model_of,
    quantization_config,
    scan,
    source_digest,
)
from shardport.registry.checkpoint.layers import container_layer, packing_layer, quantization_layer
from shardport.registry.checkpoint.model_graph import model_section
from shardport.registry.errors import UnsignedError, UsageError
from shardport.registry.progress import Quiet, Reporter
from shardport.registry.results import result_json
from shardport.registry.session import Session
from shardport.registry.store.copies import file_identity
from shardport.registry.tiles.build import CheckpointReader, build_tile_index
from shardport.registry.tiles.splits import plane_cuts
from shardport.registry.trust.signatures import attach_sigstore_bundle, manifest_statement, sign_manifest
from shardport.registry.trust.tagging import DEFAULT_VALIDITY, history, move_tag, require_signing_scope
from shardport.registry.trust.tags import format_time

if TYPE_CHECKING:
    from shardport.registry.artifact.digests import Digest
    from shardport.registry.store.protocol import Store

LEASE_TIME = timedelta(hours=6)
WORKERS = 4


@dataclass(frozen=True)
class PushResult:
    """What a push did."""

    name: str
    tag: str
    digest: Digest
    version: int
    files: int
    uploaded_bytes: int
    reused_bytes: int
    uploaded_files: int
    signed_by: str | None
    unchanged: bool = False
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        """The ``--json`` form."""
        return result_json(self)


def source_date(environ: Mapping[str, str] | None = None) -> str | None:
    """``SOURCE_DATE_EPOCH`` (whole seconds since 1970 UTC) as RFC 3339, or None when it is not set.

    The one way a time enters a manifest: push time lives in the tag document, so that the same files
    give the same manifest digest whenever and wherever they are pushed.
    """
    text = (os.environ if environ is None else environ).get("SOURCE_DATE_EPOCH")
    if text is None or text == "":
        return None
    if not text.isascii() or not text.isdigit() or int(text) > 253402300799:  # 9999-12-31T23:59:59Z
        raise UsageError(
            f"SOURCE_DATE_EPOCH={text!r}: expected whole seconds since 1970-01-01 UTC "
            "(a non-negative integer up to 253402300799); unset it to leave the time out of the manifest"
        )
    return format_time(datetime.fromtimestamp(int(text), tz=timezone.utc))


def _plan_params(src: Path, entries: list[FileEntry], analysis: Analysis) -> Mapping[str, Any]:
    """The model parameters placement will plan with: the manifest's (as :func:`build_manifest` picks)."""
    return model_of(src, {e.path: e for e in entries}).params or analysis.params


def build_manifest(
    src: Path,
    entries: list[FileEntry],
    created_at: str | None,
    analysis: Analysis | None = None,
    tile_index: str | None = None,
) -> Manifest:
    """The manifest of a checkpoint folder whose files were hashed into ``entries``.

    Deterministic: the same files, declarations and ``created_at`` give the same bytes.
    """
    by_path = {e.path: e for e in entries}
    model = model_of(src, by_path)
    if analysis is not None and analysis.params and not model.params:
        model = model.model_copy(
            update={"architecture": analysis.architecture, "params": dict(analysis.params)}
        )
    model, graph_notes = model_section(model, entries, analysis)
    container = container_layer(container_of([e.path for e in entries]), analysis)
    quantization = quantization_layer(quantization_config(src), analysis)
    return Manifest(
        container=container,
        tensors=list(analysis.tensors) if analysis else None,
        weights=list(analysis.weights) if analysis else None,
        tile_index=TileIndexRef(digest=tile_index) if tile_index else None,
        model=model,
        quantization=quantization,
        packing=packing_layer(analysis.weights if analysis else (), quantization, container),
        files=[
            e.model_copy(update={"gguf_header": analysis.gguf_headers[e.path]})
            if analysis is not None and e.path in analysis.gguf_headers
            else e
            for e in entries
        ],
        provenance=ProvenanceInfo(
            source_digest=source_digest(entries),
            converter="shardport.push",
            converter_version=shardport.__version__,
            created_at=created_at,
        ),
        notes=(list(analysis.notes) if analysis else []) + list(graph_notes),
    )


def unchanged_head(session: Session, name: str, tag: str, manifest: Manifest) -> bool:
    """Whether the tag already points at exactly this manifest (an idempotent re-push)."""
    entries = history(session, name, tag)
    return bool(entries) and entries[-1].doc.target == manifest.digest()


def push(
    session: Session,
    src: Path,
    name: str,
    tag: str,
    *,
    reporter: Reporter | None = None,
    retries: int = 0,
    valid_for: timedelta = DEFAULT_VALIDITY,
    declare: str | Mapping[str, Any] | None = None,
    reference: Path | None = None,
    strict: bool = False,
    allow_nonfinite: bool = False,
    sign: str = "ed25519",
    tile_target: int = 1 << 20,
    tile_minimum: int = 64 << 10,
    witness: Path | None = None,
    kernels_required: Sequence[str] = (),
    kernels_preferred: Sequence[str] = (),
    layers: Callable[[Manifest], Manifest] | None = None,
) -> PushResult:
    """Push folder ``src`` as ``name:tag``.

    Before anything is hashed or written, every safetensors/GGUF file passes the container gates, each
    logical weight gets its numeric contract (inferred, or ``declare``d), the semantic gates run on its
    planes, a float tensor holding NaN or inf is refused (a note with ``allow_nonfinite``), and quantized
    weights get a decode witness (with ``reference``, a float checkpoint, the measured error is recorded
    and a push far beyond the bit width's error is refused). ``witness``: the producer's own rows
    (:mod:`shardport.registry.artifact.witness_file`), checked the same way and stored as a blob the
    manifest names. ``kernels_required`` / ``kernels_preferred``: kernel ids (``cpu.int4pack`` or
    ``cpu.int4pack@1``) recorded in ``runtime`` for bring-up's dispatch. ``layers``: finishes the
    manifest draft before its digest (see the module docstring).
    """
    if session.key is None and not session.allow_unsigned:
        raise UnsignedError(
            f"push {name}:{tag}: no signing key; run `registry keygen`, pass --key FILE, or --allow-unsigned"
        )
    require_signing_scope(session, name, tag)
    created_at = source_date()  # a bad SOURCE_DATE_EPOCH fails before anything is read
    reporter = reporter or Quiet()
    files = scan(src)
    check_paths([rel for rel, _ in files], source=f"push {src}", error=UsageError)  # before any work
    total = sum(p.stat().st_size for _, p in files)
    analysis = analyze(
        src,
        [rel for rel, _ in files],
        declare=declare,
        reference=reference,
        strict=strict,
        allow_nonfinite=allow_nonfinite,
    )
    producer = _checked_witness(src, analysis, witness)

    identities = [file_identity(p) for _, p in files]
    entries = _hash_files(files, reporter.task("hashing", total))
    index_bytes = _tile_index(src, entries, analysis, tile_target, tile_minimum)
    index_digest = digest_bytes(index_bytes) if index_bytes else None
    manifest = build_manifest(src, entries, created_at, analysis, index_digest)
    if producer is not None:
        manifest = manifest.model_copy(update={"producer_witness": producer[1]})
    manifest = _with_kernels(manifest, kernels_required, kernels_preferred, layers)
    unchanged = unchanged_head(session, name, tag, manifest)
    manifest_digest = manifest.digest()

    bundle = _sigstore_bundle(sign, name, manifest_digest)
    return publish(
        session,
        name,
        tag,
        [(path, entry, ident) for (_, path), entry, ident in zip(files, entries, identities, strict=True)],
        manifest,
        extra_blobs=([index_bytes] if index_bytes is not None else []) + ([producer[0]] if producer else []),
        reporter=reporter,
        retries=retries,
        valid_for=valid_for,
        bundle=bundle,
        unchanged=unchanged,
    )


def _restore_reused(
    store: Store,
    files: list[tuple[Path, FileEntry, tuple[int, int, int, int] | None]],
    present: list[bool],
    blobs: list[bytes],
) -> None:
    """Once tagged (the lease still held), upload again any reused blob a concurrent gc removed.

    A blob found present was not uploaded; a gc that marked before this push's lease existed may have
    deleted it since. Checked again now, each missing one is uploaded from the source (or from memory),
    so the new tag never points at a missing blob (:mod:`.housekeeping` marks again between batches).
    A reused blob's source was not moved (only missing ones are), so it is still there to upload.
    """
    for (path, entry, ident), had in zip(files, present, strict=True):
        if had and not store.has_blob(entry.digest):
            store.upload_blob(path, entry.digest, None, identity=ident, move=False)
    for blob in blobs:
        if not store.has_blob(digest_bytes(blob)):
            store.put_blob(blob)


def _sigstore_bundle(sign: str, name: str, manifest_digest: str) -> Any:
    """With ``--sign sigstore``, the keyless bundle, made before anything is written (needs the network)."""
    if sign != "sigstore":
        return None
    from shardport.provenance.sigstore_signing import sign_statement_sigstore

    return sign_statement_sigstore(manifest_statement(name, manifest_digest).to_bytes())


def _checked_witness(src: Path, analysis: Any, witness: Path | None) -> Any:
    """The producer's witness (``--witness``) checked against the decode: (its blob, its manifest ref)."""
    if witness is None:
        return None
    if analysis is None:
        raise UsageError(f"--witness {witness}: {src} holds no safetensors or GGUF weights to check it with")
    return producer_witness(src, analysis, witness)


def _with_kernels(
    manifest: Manifest,
    required: Sequence[str],
    preferred: Sequence[str],
    layers: Callable[[Manifest], Manifest] | None = None,
) -> Manifest:
    """The manifest with the kernel ids dispatch must use / should prefer (``runtime``), then ``layers``.

    ``layers`` (above the registry) runs after the ids are recorded: they steer its expected kernels.
    """
    if required or preferred:
        runtime = manifest.runtime.model_copy(
            update={"kernels_required": list(required), "kernels_preferred": list(preferred)}
        )
        manifest = manifest.model_copy(update={"runtime": runtime})
    return layers(manifest) if layers is not None else manifest


def _hash_files(files: list[tuple[str, Path]], advance: Callable[[int], None]) -> list[FileEntry]:
    """Each file's entry (path, size, sha256), hashed once, ``WORKERS`` at a time."""
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        hashed = list(pool.map(lambda f: digest_file(f[1], advance), files))
    return [
        FileEntry(path=rel, size=size, digest=d) for (rel, _), (d, size) in zip(files, hashed, strict=True)
    ]


def _tile_index(
    src: Path, entries: list[FileEntry], analysis: Analysis | None, target: int, minimum: int
) -> bytes | None:
    """The tile index blob: every tensor cut at the split points placement can produce (None: no tensors)."""
    if analysis is None or not analysis.tensors:
        return None
    with CheckpointReader(src) as read:
        cuts = plane_cuts(analysis.weights, analysis.tensors, _plan_params(src, entries, analysis))
        index = build_tile_index(analysis.tensors, read, target=target, minimum=minimum, cuts=cuts)
        return index.to_bytes()


def publish(
    session: Session,
    name: str,
    tag: str,
    files: list[tuple[Path, FileEntry, tuple[int, int, int, int] | None]],
    manifest: Manifest,
    *,
    extra_blobs: list[bytes],
    reporter: Reporter,
    retries: int = 0,
    valid_for: timedelta = DEFAULT_VALIDITY,
    bundle: bytes | None = None,
    unchanged: bool = False,
    move: bool = False,
) -> PushResult:
    """Store an artifact whose files are hashed and whose manifest is built, then tag it.

    Order: lease, missing file blobs (verified), ``extra_blobs`` (e.g. the tile index), manifest,
    signature(s), tag document. ``unchanged``: the tag already points at ``manifest`` (no new version).
    ``move``: the files are the caller's work files; a local store may rename them into place.
    """
    check_manifest(manifest, source=f"manifest of {name}:{tag}")  # before anything is written
    store = session.store
    now = session.clock()
    manifest_bytes = manifest.to_bytes()
    manifest_digest = manifest.digest()
    entries = [e for _, e, _ in files]
    lease_dir = f"uploads/{uuid.uuid4().hex}"
    extra = {digest_bytes(b) for b in extra_blobs}
    lease = {
        "expires": format_time(now + LEASE_TIME),
        "digests": sorted({e.digest for e in entries} | {manifest_digest} | extra),
    }
    store.put(f"{lease_dir}/lease.json", json.dumps(lease).encode())
    try:
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            present = list(pool.map(lambda e: store.has_blob(e.digest), entries))
        unique_missing: dict[str, tuple[Path, int, tuple[int, int, int, int] | None]] = {}
        for (path, entry, ident), have in zip(files, present, strict=True):
            if not have:
                unique_missing.setdefault(entry.digest, (path, entry.size, ident))
        up_total = sum(v[1] for v in unique_missing.values())
        advance = reporter.task("uploading", up_total)
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            moved = list(
                pool.map(
                    lambda kv: store.upload_blob(kv[1][0], kv[0], advance, identity=kv[1][2], move=move),
                    unique_missing.items(),
                )
            )
        for blob in extra_blobs:
            store.put_blob(blob)
        _failpoints.hit("blobs-done")
        store.put_blob(manifest_bytes)
        _failpoints.hit("manifest-written")
        sign_manifest(session, name, manifest_digest)
        if bundle is not None:
            attach_sigstore_bundle(session, name, manifest_digest, bundle)
        _failpoints.hit("signature-written")
        if unchanged:
            tag_entry = history(session, name, tag)[-1]
        else:
            tag_entry = move_tag(session, name, tag, manifest_digest, retries=retries, valid_for=valid_for)
        _restore_reused(store, files, present, [manifest_bytes, *extra_blobs])
    finally:
        store.delete_tree(lease_dir)
    return PushResult(
        name=name,
        tag=tag,
        digest=manifest_digest,
        version=tag_entry.doc.version,
        files=len(entries),
        uploaded_bytes=sum(moved),
        reused_bytes=sum(e.size for e in entries) - sum(v[1] for v in unique_missing.values()),
        uploaded_files=len(unique_missing),
        signed_by=session.key.keyid if session.key else None,
        unchanged=unchanged,
        notes=tuple(n.message for n in manifest.notes),
    )
