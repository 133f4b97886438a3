"""The GGUF types the direct block kernel takes, without torch (its capability is read at push).

:mod:`.gguf_direct` decodes :data:`NATIVE_TYPES` with its own torch tile decoders (it checks that its
decoder table names exactly these) and :data:`VIA_GGUF` through ``gguf.quants.dequantize``.
"""

from __future__ import annotations

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

NATIVE_TYPES: frozenset[str] = frozenset(
    ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
)
"""The types decoded by :mod:`.gguf_direct`'s own torch tile decoders."""

VIA_GGUF: tuple[str, ...] = tuple(
    name
    for name in (
        "IQ1_S",
        "IQ1_M",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ2_S",
        "IQ3_XXS",
        "IQ3_S",
        "IQ4_NL",
        "IQ4_XS",
        "TQ1_0",
        "TQ2_0",
        "MXFP4",
        "NVFP4",
    )
    if name in GGMLQuantizationType.__members__ and GGMLQuantizationType[name] in GGML_QUANT_SIZES
)
"""Types decoded tile by tile through ``gguf.quants.dequantize`` (those this gguf has)."""

GGUF_DIRECT_TYPES: frozenset[str] = NATIVE_TYPES | frozenset(VIA_GGUF)
"""The GGUF types the direct block kernel handles (native torch decoders plus gguf.quants ones)."""
