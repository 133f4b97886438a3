"""The manifest's model section at push: the graph contract and the tokenizer record; and ``graph_of``.

Push calls :func:`model_section` once the files are hashed and the containers analysed. It adds to
``model``:

* ``graph``: :func:`~shardport.registry.contracts.graph.graph_contract` of the model's architecture and
  parameters (config.json keys, or the GGUF's ``<arch>.*`` keys) and the tensor shapes. A checkpoint the
  runtime graph cannot run (an unsupported architecture or operator, a missing parameter) is still
  pushed: the refusal becomes a note (``notes``; never raised, not even under ``--strict``: it says what
  the runtime lacks, not what is wrong with the files), and ``graph`` stays absent;
* ``tokenizer``: :func:`~shardport.registry.artifact.tokenizer_record.tokenizer_record`.

A checkpoint that names no architecture and has no parameters (not a model) gets neither a graph nor a
note. :func:`graph_of` is what a bring-up calls: the recorded contract, or (for a manifest pushed before
contracts were recorded) the contract re-derived from the same inputs, raising the typed refusal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shardport.registry.artifact.manifest import FileEntry, Manifest, ModelInfo, TensorEntry
from shardport.registry.artifact.tokenizer_record import tokenizer_record
from shardport.registry.checkpoint.analysis import Analysis
from shardport.registry.contracts.errors import GraphContractError
from shardport.registry.contracts.graph import GraphContract, graph_contract
from shardport.registry.contracts.model import LogicalWeight
from shardport.registry.formats.gguf_gate import GGUFArray
from shardport.registry.formats.notes import Note, Notes

TOKENS_KEY = "tokenizer.ggml.tokens"


def _shapes(
    tensors: Iterable[TensorEntry] | None, weights: Iterable[LogicalWeight] | None
) -> dict[str, Sequence[int]] | None:
    if tensors is None and weights is None:
        return None
    shapes: dict[str, Sequence[int]] = {t.name: t.shape for t in tensors or ()}
    for w in weights or ():  # a quantized weight's logical shape, under its own name
        shapes.setdefault(w.name, tuple(w.shape.extents))
    return shapes


def derive_graph(
    model: ModelInfo,
    tensors: Iterable[TensorEntry] | None,
    weights: Iterable[LogicalWeight] | None = None,
    *,
    vocab_size: int | None = None,
) -> GraphContract:
    """The graph contract of ``model`` (its architecture and params) with the stored tensor shapes.

    ``weights``: the logical weights; their logical shapes stand in for tensors of the same name that
    are not stored under it (a quantized embedding's planes).

    Raises :class:`~shardport.registry.contracts.errors.GraphContractError` (or its subclasses
    ``UnsupportedArchitectureError`` / ``UnsupportedOperatorError``).
    """
    return graph_contract(
        model.architecture, model.params, tensor_shapes=_shapes(tensors, weights), vocab_size=vocab_size
    )


def gguf_vocab_size(meta: Mapping[str, Any]) -> int | None:
    """The GGUF tokenizer's token count (``tokenizer.ggml.tokens``' length), or None."""
    tokens = meta.get(TOKENS_KEY)
    return tokens.length if isinstance(tokens, GGUFArray) and tokens.length > 0 else None


def model_section(
    model: ModelInfo, entries: Sequence[FileEntry], analysis: Analysis | None
) -> tuple[ModelInfo, tuple[Note, ...]]:
    """``model`` with its graph contract and tokenizer record, and the note of a refused contract."""
    gguf_meta: Mapping[str, Any] = analysis.gguf_meta if analysis is not None else {}
    record = tokenizer_record(
        {e.path: e.digest for e in entries},
        {p: (h.end, h.digest) for p, h in analysis.gguf_headers.items()} if analysis is not None else {},
        gguf_vocab_size(gguf_meta) is not None,
    )
    update: dict[str, Any] = {"tokenizer": record} if record is not None else {}
    notes: tuple[Note, ...] = ()
    if model.architecture is not None or model.params:
        try:
            update["graph"] = derive_graph(
                model,
                analysis.tensors if analysis is not None else None,
                analysis.weights if analysis is not None else None,
                vocab_size=gguf_vocab_size(gguf_meta),
            )
        except GraphContractError as exc:
            collected = Notes(strict=False)  # a runtime's limit, not a defect: never raised at push
            collected.add(exc)
            notes = collected.items
    return (model.model_copy(update=update) if update else model), notes


def graph_of(manifest: Manifest) -> GraphContract:
    """The graph contract a bring-up runs ``manifest`` with.

    The contract recorded at push when there is one; otherwise re-derived from ``model`` and the
    tensor list, which raises the typed refusal (``UnsupportedArchitectureError``,
    ``UnsupportedOperatorError``, ``GraphContractError``; all exit 5) the push recorded as a note.
    A recorded contract of a newer version is refused (``GraphContractError`` naming the version).
    """
    recorded = manifest.model.graph
    if isinstance(recorded, GraphContract):
        return recorded
    if recorded is not None:
        version = recorded.get("version")
        if isinstance(version, int) and not isinstance(version, bool) and version > 1:
            raise GraphContractError(
                "manifest model.graph",
                "version",
                "1",
                version,
                "the manifest was pushed by a newer shardport; upgrade shardport to bring it up",
            )
        try:
            return GraphContract.model_validate(recorded)
        except ValueError as exc:  # pydantic's ValidationError
            raise GraphContractError(
                "manifest model.graph", "graph", "a valid graph contract", str(exc).splitlines()[0]
            ) from exc
    return derive_graph(manifest.model, manifest.tensors, manifest.weights)
