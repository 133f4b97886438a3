"""E_quant at push: how far a quantized weight is from its float reference, as an operator and per element.

``push --reference`` gates every element of the decode against the float weight (:mod:`.rounding`);
:func:`measure_quant_error` runs that gate once and, on the way, sums the operator error on golden
activations: ``E_quant = ‖X·(W_q - W_fp)^T‖/‖X·W_fp^T‖``, ``X`` ``[TOKENS, K]`` standard normal from a
seed recorded beside it. The tolerance is the rounding bound's own aggregate, ``‖B‖/‖W_fp‖`` (``B``
each element's half quantization step plus scale rounding, from the stored scales, never from the
measured error). For isotropic ``X``, ``E[‖X·Δ^T‖²] = T·‖Δ‖²``, so E_quant estimates ``‖Δ‖/‖W_fp‖``; an
honest round-to-nearest decode sits near ``0.58·‖B‖`` (a uniform error over ±half a step), and only
clipped elements (beyond their bound at an edge code, which the element gate lets through) or a bound
met everywhere at once bring it to the tolerance.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .model import LogicalWeight, QuantError
from .rounding import F32, Planes, ReferenceSums, reference_sums

#: Golden activation rows per weight: enough that E_quant's sampling spread (about
#: ``sqrt(2 / (T·min(N, K)))`` relative) is far below the gap to its tolerance.
TOKENS = 16
#: Significant digits kept in the manifest, so that the same files give the same bytes on any BLAS.
DIGITS = 6


def golden_activations(k: int, seed: int, tokens: int = TOKENS) -> npt.NDArray[np.float64]:
    """``[tokens, k]`` standard-normal activations from ``seed`` (numpy's PCG64: the same on any machine)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((tokens, k), dtype=np.float32).astype(np.float64)


def _ratio(num2: float, den2: float) -> float:
    """``sqrt(num2 / den2)``; the absolute ``sqrt(num2)`` when the denominator is zero."""
    return float(np.sqrt(num2 / den2)) if den2 > 0 else float(np.sqrt(num2))


def _kept(x: float) -> float:
    return float(f"{x:.{DIGITS}g}")


def summarize(sums: ReferenceSums, *, seed: int, tokens: int = TOKENS) -> QuantError:
    """The manifest's record of ``sums`` (:func:`.rounding.reference_sums` run with golden activations)."""
    return QuantError(
        max_abs=_kept(sums.max_abs),
        rel_frobenius=_kept(sums.rel_frobenius),
        e_quant=_kept(_ratio(sums.y_err2, sums.y_norm2)),
        tolerance=_kept(_ratio(sums.bound2, sums.norm2)),
        tokens=tokens,
        seed=seed,
        clipped=sums.clipped,
    )


def measure_quant_error(
    weight: LogicalWeight, planes: Planes, reference: F32, *, seed: int
) -> tuple[ReferenceSums, QuantError]:
    """Gate ``weight``'s decode against ``reference`` (logical shape) and measure its errors.

    Raises as :func:`.rounding.reference_sums` does. Returns the raw sums (the witness records their
    ``rel_frobenius``) and the summary for the manifest.
    """
    x = golden_activations(weight.shape.columns, seed)
    sums = reference_sums(weight, planes, reference, x)
    return sums, summarize(sums, seed=seed)
