"""shardport: ship quantized model checkpoints to GPU clusters, signed and verified end to end.

The root package holds only the version, the root error class and the CLI entry point
(:mod:`shardport.cli`). The work happens in the subpackages, in data-flow order:
``registry`` → ``placement`` → ``loader`` → ``kernels`` → ``deploy``; ``provenance`` is used by all.
"""

from shardport._errors import EXIT_CODES, ShardportError

__version__ = "0.1.0"

__all__ = ["EXIT_CODES", "ShardportError", "__version__"]
