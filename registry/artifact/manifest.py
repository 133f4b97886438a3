"""The artifact manifest: a pydantic v2 model, canonical JSON, digest = sha256 of the exact bytes.

Each section carries its own ``version``. A section whose version is newer than this shardport
understands is rejected (:class:`SchemaVersionError`); unknown optional fields are kept and written
back unchanged (``extra="allow"``), so a manifest made by a newer producer round-trips.
The ``tensors`` (where each tensor's bytes are) and ``weights`` (per logical weight: numeric contract,
graph binding, planes, decode witness — :mod:`shardport.registry.contracts`) sections are filled at
push from the container gates and contract inference; they follow ``schema.version``. ``notes``
lists what the gates found in fields no consumer reads (:mod:`shardport.registry.formats.notes`).

The manifest names content, not a moment: nothing in it depends on when, where (store, repository,
tag, folder, host) or by whom it was pushed, so the same files with the same declarations give the same
digest everywhere. ``provenance.created_at`` is empty unless ``SOURCE_DATE_EPOCH`` asks for it; push
time lives in the signed tag document (``issued_at``).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import rfc8785
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shardport.registry.artifact.digests import ERROR_TYPE as DIGEST_ERROR
from shardport.registry.artifact.digests import Digest
from shardport.registry.artifact.hashing import digest_bytes
from shardport.registry.artifact.tokenizer_record import TokenizerRecord
from shardport.registry.contracts.graph import GraphContract
from shardport.registry.contracts.model import LogicalWeight, QuantError
from shardport.registry.errors import MalformedDigestError, SchemaVersionError, UsageError, VerificationError
from shardport.registry.formats.notes import Note

SCHEMA_ID = "shardport.manifest"
SCHEMA_VERSION = 1
MEDIA_TYPE = "application/vnd.shardport.manifest.v1+json"


class Section(BaseModel):
    """A manifest section: frozen, keeps unknown fields, versioned on its own."""

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)
    max_version: ClassVar[int] = 1
    section: ClassVar[str] = "section"
    version: int = 1

    @model_validator(mode="after")
    def _known_version(self) -> Section:
        if self.version > self.max_version or self.version < 1:
            raise SchemaVersionError(
                f"manifest section {self.section!r}: version {self.version} is not supported "
                f"(this shardport understands 1..{self.max_version}); upgrade shardport"
            )
        return self


class SchemaInfo(Section):
    """Artifact schema id and version."""

    section = "schema"

    id: str = SCHEMA_ID


class ContainerInfo(Section):
    """Where the bytes live: ``safetensors`` | ``gguf`` | ``shardport-tiled`` | ``other``.

    ``spec_revision``: the revision of the container format the files follow, as push read it: the GGUF
    header version (``"3"``; several files of different versions: ``"2,3"``), ``"1"`` for safetensors
    (the format has one revision: u64 header length, JSON header, data), the tiled layout's version for
    ``shardport-tiled``; None in manifests made before it was recorded, and for ``other``.
    """

    section = "container"

    kind: str
    profile_version: int = 1
    spec_revision: str | None = None


class ModelInfo(Section):
    """What the model is: architecture, revision, the parameters a runtime needs.

    ``graph``: the graph contract push derived from ``params`` and the tensor shapes
    (:mod:`shardport.registry.checkpoint.model_graph`); ``tokenizer``: the digests of the tokenizer the
    checkpoint carries (:mod:`shardport.registry.artifact.tokenizer_record`). Both are left out of the
    JSON when absent, so manifests without them keep their bytes. A ``graph`` this shardport cannot read
    (a newer contract version) is kept as a plain object and written back unchanged;
    :func:`shardport.registry.checkpoint.model_graph.graph_of` refuses it.
    """

    section = "model"

    architecture: str | None = None
    revision: str | None = None
    tokenizer_digest: Digest | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    graph: GraphContract | dict[str, Any] | None = Field(default=None, exclude_if=lambda v: v is None)
    tokenizer: TokenizerRecord | None = Field(default=None, exclude_if=lambda v: v is None)


class QuantizationInfo(Section):
    """Quantization family and the digest of its configuration, read from the checkpoint itself.

    ``family``: ``gguf`` for GGUF files; the ``quant_method`` of a safetensors checkpoint's quantization
    config (``gptq``, ``awq``, ``compressed-tensors``…); ``none`` for a float checkpoint.
    ``producer``/``producer_version``: the tool the checkpoint names (``meta.quantizer``,
    ``quantization_config.producer``, compressed-tensors' own ``version``; GGUF's
    ``general.quantized_by``), else the quant method; ``calibration_digest``: where the producer records one.
    ``tensor_types`` (GGUF): stored tensors per ggml type; ``quantization_version`` (GGUF):
    ``general.quantization_version``. ``quant_error``: with ``push --reference``, each referenced
    weight's distance from its float weight, E_quant included, by weight name
    (:class:`~shardport.registry.contracts.model.QuantError`). All three are left out of the JSON when
    absent (older manifests, and pushes without a reference, keep their bytes).
    """

    section = "quantization"

    family: str = "none"
    config_digest: Digest | None = None
    producer: str | None = None
    producer_version: str | None = None
    calibration_digest: Digest | None = None
    tensor_types: dict[str, int] | None = Field(default=None, exclude_if=lambda v: v is None)
    quantization_version: int | None = Field(default=None, exclude_if=lambda v: v is None)
    quant_error: dict[str, QuantError] | None = Field(default=None, exclude_if=lambda v: v is None)


class PackingInfo(Section):
    """Layout of the stored bytes.

    ``layout``: ``row_major`` (the producer's bytes as its container stores them) or ``shardport-tiled``
    (``convert --layout tiled``); ``encoding``: the weights' representations, sorted and comma-joined
    (``gguf:Q4_0,gguf:Q8_0``, ``affine:u4:slots32,float:F16``); ``packer``: who laid the bytes out as
    recorded (push: the producer, as :class:`QuantizationInfo` names it, or the container kind for a float
    checkpoint; convert: ``shardport.convert``).
    """

    section = "packing"

    layout: str | None = None
    layout_version: int | None = None
    encoding: str | None = None
    packer: str | None = None
    packer_version: str | None = None


class ExpectedKernel(BaseModel):
    """The kernel admission over the catalogue expects for a class of weights on a class of devices.

    ``weight_class``: the representation the kernels see
    (:func:`shardport.kernels.expectations.weight_class`);
    ``device``: ``cpu/float32``, ``cpu/bfloat16`` or ``cuda-sm80/bfloat16``; ``kernel``: ``id@version``
    (None: nothing in the catalogue admits it under the default fallback policy); ``activations``: the
    dtype it runs (float32 where bring-up falls back from the device class's dtype); ``weights``: how many
    weights; ``weight``: set when the weights of one class expect different kernels (one entry each).
    """

    model_config = ConfigDict(frozen=True, extra="allow")
    weight_class: str
    device: str
    kernel: str | None
    activations: str
    weights: int = Field(ge=1)
    weight: str | None = Field(default=None, exclude_if=lambda v: v is None)


class RuntimeInfo(Section):
    """Runtime tested with, and kernels required or preferred.

    ``name``/``tested_version``: the runtime admission ran against at push (``shardport`` and its
    version); ``catalogue``: its kernels (``id@version``, priority order); ``expected_kernels``: per
    weight class and device class, what admission over that catalogue selects for the whole weight (tp=1;
    :mod:`shardport.kernels.expectations`). The last two are left out of the JSON when absent.
    """

    section = "runtime"

    name: str | None = None
    tested_version: str | None = None
    kernels_required: list[str] = Field(default_factory=list)
    kernels_preferred: list[str] = Field(default_factory=list)
    catalogue: list[str] | None = Field(default=None, exclude_if=lambda v: v is None)
    expected_kernels: list[ExpectedKernel] | None = Field(default=None, exclude_if=lambda v: v is None)


class TopologyHints(Section):
    """Parallel degrees the artifact can be placed at, each axis with the others at 1.

    Written at push by ``registry push`` (:mod:`shardport.deploy.topology_check`: the degrees bring-up's
    plan-time checks accept, among the candidates it tries); ``None`` when not computed.
    """

    section = "topology"

    tp: list[int] = Field(default_factory=list)
    ep: list[int] = Field(default_factory=list)
    pp: list[int] = Field(default_factory=list)


class GgufHeaderDigest(BaseModel):
    """The digest of a GGUF file's header bytes ``[0, end)``: magic, version, counts, every KV pair.

    ``end`` is the offset just past the last key/value pair (tokenizer arrays included), so a consumer
    that range-reads the header (one read of ``end`` bytes) can check it against ``digest`` without the
    tensor data (:mod:`shardport.registry.artifact.gguf_header`).
    """

    model_config = ConfigDict(frozen=True, extra="allow")
    end: int = Field(ge=0)
    digest: Digest


class FileEntry(BaseModel):
    """One checkpoint file (path relative to the checkpoint root; untrusted on the way in).

    ``gguf_header``: for a GGUF file, the digest of its header's key/value bytes; absent otherwise
    (and left out of the JSON when absent, so manifests without GGUF files keep their bytes).
    """

    model_config = ConfigDict(frozen=True, extra="allow")
    path: str
    size: int = Field(ge=0)
    digest: Digest
    gguf_header: GgufHeaderDigest | None = Field(default=None, exclude_if=lambda v: v is None)


class TensorEntry(BaseModel):
    """One stored tensor: where its bytes are (absolute offsets in a file) and what it belongs to.

    ``dtype`` is the container's spelling (safetensors ``F16``/``I32``…, or the ggml type name for
    GGUF); ``shape`` is row-major (for GGUF, ggml ``ne`` reversed). ``weight`` names the logical weight
    this tensor is a plane of, and ``role`` its role there (codes, scale, zero, g_idx, perm, float).
    ``layout`` is ``row_major`` (as the source container stores it) or ``shardport-tiled`` (tiles of
    ``tile_rows`` rows x ``tile_cols`` bytes stored contiguously: :mod:`shardport.registry.tiles.layout`).
    """

    model_config = ConfigDict(frozen=True, extra="allow")
    name: str
    file: str
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    dtype: str
    shape: tuple[int, ...]
    weight: str | None = None
    role: str | None = None
    layout: str = "row_major"
    tile_rows: int | None = None
    tile_cols: int | None = None


class TileIndexRef(BaseModel):
    """The tile index blob of the artifact (per-tile BLAKE3 hashes; :mod:`shardport.registry.tiles`)."""

    model_config = ConfigDict(frozen=True, extra="allow")
    digest: Digest
    hash: str = "blake3"
    version: int = 2


class WitnessFileRef(BaseModel):
    """The producer's own witness (``push --witness``): a blob of rows and their values.

    Checked against the decode at push, pull, verify and rank load
    (:mod:`shardport.registry.artifact.witness_file`). ``exact``: every value equalled our decode bit for bit.
    """

    model_config = ConfigDict(frozen=True, extra="allow")
    digest: Digest
    size: int = Field(ge=0)
    weights: int = Field(ge=0)
    rows: int = Field(ge=0)
    exact: bool


class ProvenanceInfo(Section):
    """Where the artifact came from.

    ``converter_version`` names the shardport that made the contracts and witnesses recorded here (so
    another shardport version may give another digest for the same files). ``created_at`` is set only
    from an explicit ``SOURCE_DATE_EPOCH``: the time of a push lives in its tag document.
    """

    section = "provenance"

    source_digest: Digest | None = None
    converter: str | None = None
    converter_version: str | None = None
    source_manifest: Digest | None = None
    parent: Digest | None = None
    created_at: str | None = None


class Manifest(BaseModel):
    """The signed description of one artifact."""

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)
    media_type: str = Field(default=MEDIA_TYPE, alias="mediaType")
    schema_: SchemaInfo = Field(default_factory=SchemaInfo, alias="schema")
    container: ContainerInfo
    model: ModelInfo = Field(default_factory=ModelInfo)
    quantization: QuantizationInfo = Field(default_factory=QuantizationInfo)
    packing: PackingInfo = Field(default_factory=PackingInfo)
    runtime: RuntimeInfo = Field(default_factory=RuntimeInfo)
    topology: TopologyHints | None = None
    files: list[FileEntry]
    tensors: list[TensorEntry] | None = None
    weights: list[LogicalWeight] | None = None
    tile_index: TileIndexRef | None = None
    producer_witness: WitnessFileRef | None = None
    provenance: ProvenanceInfo = Field(default_factory=ProvenanceInfo)
    notes: list[Note] = Field(default_factory=list)

    @model_validator(mode="after")
    def _known_schema(self) -> Manifest:
        if self.schema_.id != SCHEMA_ID:
            raise SchemaVersionError(f"manifest schema id: expected {SCHEMA_ID!r}, found {self.schema_.id!r}")
        return self

    def to_bytes(self) -> bytes:
        """Canonical JSON (RFC 8785: sorted keys, no insignificant whitespace)."""
        try:
            return rfc8785.dumps(self.model_dump(mode="json", by_alias=True))
        except rfc8785.CanonicalizationError as exc:
            raise UsageError(
                f"manifest cannot be canonicalized (RFC 8785): {exc}; integers must stay within "
                "±(2**53 - 1) and floats must be finite — fix the value in config.json"
            ) from exc

    def digest(self) -> str:
        """``sha256:<hex>`` of :meth:`to_bytes`."""
        return digest_bytes(self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "manifest") -> Manifest:
        """Parse and validate; errors name ``source`` and the failing field.

        A valid document is parsed once; a failing one is parsed again to name the error.
        """
        try:
            return cls.model_validate_json(data)
        except SchemaVersionError:
            raise
        except ValidationError:
            pass
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep, a huge number
            raise VerificationError(f"{source}: not valid JSON ({exc})") from exc
        try:
            return cls.model_validate(doc)
        except SchemaVersionError:
            raise
        except ValidationError as exc:
            for err in exc.errors():
                inner = (err.get("ctx") or {}).get("error")
                if isinstance(inner, SchemaVersionError):
                    raise SchemaVersionError(f"{source}: {inner}") from exc
            for err in exc.errors():
                if err["type"] == DIGEST_ERROR:
                    where = ".".join(str(p) for p in err["loc"])
                    raise MalformedDigestError(f"{source}: field {where!r}: {err['msg']}") from exc
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise VerificationError(f"{source}: field {where!r}: {first['msg']}") from exc
