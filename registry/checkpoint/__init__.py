"""What is this checkpoint: a folder of files read into the parts of its manifest.

Consumes a checkpoint folder (safetensors, sharded safetensors, GGUF, anything else as opaque files),
its ``config.json`` / quantization config and optional declarations and float reference; produces what
push records about it. Pure reading: nothing here writes, uploads or touches a store.

- :mod:`.describe` — the folder's files, container kind, model info and quantization config
  (:func:`scan`, :func:`model_of`);
- :mod:`.analysis` — every container gated, the tensor inventory, numeric contracts, value gates and
  decode witnesses (:func:`analyze` → :class:`Analysis`; :func:`check_stored` re-checks stored bytes);
- :mod:`.layers` — the manifest layers read from the checkpoint (container revision, quantization,
  packing);
- :mod:`.model_graph` — the model section's graph contract and tokenizer record (:func:`model_section`,
  :func:`graph_of`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardport._lazy import lazy_exports

if TYPE_CHECKING:
    from .analysis import Analysis, analyze, check_stored
    from .describe import model_of, scan
    from .model_graph import graph_of, model_section

#: Where each exported name lives; imported on first use (PEP 562).
_HOME = {
    **dict.fromkeys(("Analysis", "analyze", "check_stored"), "analysis"),
    **dict.fromkeys(("model_of", "scan"), "describe"),
    **dict.fromkeys(("graph_of", "model_section"), "model_graph"),
}

__getattr__ = lazy_exports(__name__, globals(), _HOME)

__all__ = ["Analysis", "analyze", "check_stored", "graph_of", "model_of", "model_section", "scan"]
