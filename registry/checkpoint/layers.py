"""The manifest layers push reads from the checkpoint itself: container revision, quantization, packing.

Pure: the quantization config (already read from ``config.json`` / ``quantize_config.json``) and the
:class:`~shardport.registry.checkpoint.analysis.Analysis` in, sections out. The ``runtime`` expectations
and the ``topology`` degrees need the kernel catalogue and the placement planner, which sit above the
registry: the CLI's push computes them (:mod:`shardport.kernels.expectations`,
:mod:`shardport.deploy.topology_check`) and hands them to :func:`shardport.registry.push.push`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import rfc8785

from shardport.registry.artifact.hashing import digest_bytes
from shardport.registry.artifact.manifest import ContainerInfo, PackingInfo, QuantizationInfo
from shardport.registry.checkpoint.analysis import Analysis
from shardport.registry.contracts.model import (
    AffineIntContract,
    FloatContract,
    GgufBlockContract,
    LogicalWeight,
    MicroscaleContract,
)

SAFETENSORS_REVISION = "1"
"""safetensors has one format revision (u64 little-endian header length, JSON header, data)."""
ROW_MAJOR = "row_major"
ROW_MAJOR_VERSION = 1


def container_layer(container: ContainerInfo, analysis: Analysis | None) -> ContainerInfo:
    """``container`` with ``spec_revision``: the GGUF header version(s), or safetensors' revision."""
    if container.kind == "gguf" and analysis is not None and analysis.gguf_versions:
        revision = ",".join(str(v) for v in sorted(set(analysis.gguf_versions.values())))
    elif container.kind == "safetensors":
        revision = SAFETENSORS_REVISION
    else:
        return container
    return container.model_copy(update={"spec_revision": revision})


def _split_tool(text: str) -> tuple[str, str | None]:
    """``gptqmodel:2.2.0`` -> (``gptqmodel``, ``2.2.0``); a bare name has no version."""
    name, sep, version = text.partition(":")
    return name.strip(), (version.strip() or None) if sep else None


def _producer(qc: Mapping[str, Any], family: str) -> tuple[str, str | None]:
    """The producer the quantization config names, and its version; else the quant method."""
    meta = qc.get("meta")
    quantizer = meta.get("quantizer") if isinstance(meta, Mapping) else None
    if isinstance(quantizer, list) and quantizer and isinstance(quantizer[0], str):
        return _split_tool(quantizer[0])
    if isinstance(quantizer, str) and quantizer:
        return _split_tool(quantizer)
    producer = qc.get("producer")
    if isinstance(producer, Mapping) and isinstance(producer.get("name"), str):
        version = producer.get("version")
        return str(producer["name"]), str(version) if version is not None else None
    if isinstance(producer, str) and producer:
        return _split_tool(producer)
    if family == "compressed-tensors":
        version = qc.get("version")
        return family, str(version) if isinstance(version, str) and version else None
    return family, None


def _calibration(qc: Mapping[str, Any]) -> str | None:
    """A calibration digest the producer recorded (``calibration_digest``, ``meta.calibration_digest``)."""
    meta = qc.get("meta")
    for where in (qc, meta if isinstance(meta, Mapping) else {}):
        value = where.get("calibration_digest")
        if isinstance(value, str) and value.startswith("sha256:") and len(value) == 71:
            return value
    return None


def config_quantization(qc: Mapping[str, Any] | None) -> QuantizationInfo:
    """The quantization layer of a safetensors checkpoint from its quantization config (None: float)."""
    if qc is None:
        return QuantizationInfo(family="none")
    family = str(qc.get("quant_method") or qc.get("format") or "unknown")
    producer, version = _producer(qc, family)
    return QuantizationInfo(
        family=family,
        config_digest=digest_bytes(rfc8785.dumps(dict(qc))),
        producer=producer,
        producer_version=version,
        calibration_digest=_calibration(qc),
    )


def gguf_quantization(analysis: Analysis) -> QuantizationInfo:
    """The quantization layer of a GGUF checkpoint: stored tensors per ggml type, the quantization version.

    ``config_digest``: of the canonical JSON of ``general.file_type``, the quantization version and the
    type counts (what a GGUF says about its quantization).
    """
    gguf_files = set(analysis.gguf_versions)
    types = dict(sorted(Counter(t.dtype for t in analysis.tensors if t.file in gguf_files).items()))
    meta = analysis.gguf_meta
    qv = meta.get("general.quantization_version")
    by = meta.get("general.quantized_by")
    summary = {"file_type": meta.get("general.file_type"), "quantization_version": qv, "tensor_types": types}
    return QuantizationInfo(
        family="gguf",
        config_digest=digest_bytes(rfc8785.dumps(summary)),
        producer=by if isinstance(by, str) and by else None,
        tensor_types=types,
        quantization_version=qv if isinstance(qv, int) and not isinstance(qv, bool) else None,
    )


def quantization_layer(qc: Mapping[str, Any] | None, analysis: Analysis | None) -> QuantizationInfo:
    """GGUF-only checkpoints from their headers, the others from their quantization config.

    With ``push --reference``, each referenced weight's measured distance from it (``quant_error``).
    """
    if analysis is not None and analysis.kind == "gguf":
        layer = gguf_quantization(analysis)
    else:
        layer = config_quantization(qc)
    if analysis is None or not analysis.quant_errors:
        return layer
    return layer.model_copy(update={"quant_error": dict(sorted(analysis.quant_errors.items()))})


def encoding_of(weight: LogicalWeight) -> str:
    """A weight's representation, as the packing layer lists it (``gguf:Q4_0``, ``affine:u4:slots32``…)."""
    c = weight.contract
    if isinstance(c, GgufBlockContract):
        return f"gguf:{c.ggml_type}"
    if isinstance(c, FloatContract):
        return f"float:{c.physical_dtype}"
    if isinstance(c, MicroscaleContract):
        return f"mx:{c.scheme}"
    if isinstance(c, AffineIntContract):
        pack = c.codes.packing
        return f"affine:{c.codes.encoding}:{pack.scheme}{pack.container_bits}"
    return str(getattr(c, "family", "unknown"))


def packing_layer(
    weights: Iterable[LogicalWeight], quantization: QuantizationInfo, container: ContainerInfo
) -> PackingInfo:
    """The packing layer of a pushed checkpoint: its bytes as the producer laid them out (row major)."""
    encodings = sorted({encoding_of(w) for w in weights})
    if quantization.family != "none" and quantization.producer:
        packer, version = quantization.producer, quantization.producer_version
    else:
        packer, version = container.kind, container.spec_revision
    return PackingInfo(
        layout=ROW_MAJOR,
        layout_version=ROW_MAJOR_VERSION,
        encoding=",".join(encodings) if encodings else None,
        packer=packer,
        packer_version=version,
    )
