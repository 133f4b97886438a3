"""A conversion's budget: how far a layout may be from the reference decode, never from its measured error.

A layout that changes a stored number (``conversion``: a scale or zero point cast to the activation
dtype, a product the decode law rounds and the kernel does not; ``full-dequant``: the weight cast to the
activation dtype) is held, element by element, to the rounding that change can cause, computed from the
weight's own terms as the registry's unpacking gives them -- never from the error the preparation
measured (a packer that mis-scales the layout would otherwise set its own tolerance):

``bound = eps_terms·T + (eps_value + eps_law)·(1 + eps_law)·(|w| + eps_terms·T) + ARITH·(T + |w|) + 16·tiny``

- ``T``: the magnitude of the terms the layout rounds, per element (int4pack and tinygemm hold
  ``w = (u - 8)·scale + zero``: ``T = |u - 8|·|scale| + |zero|``; int8 holds ``q·scale``:
  ``T = |q|·|scale|``);
- ``eps_terms``: the unit roundoff of the format the layout holds those terms in (:data:`EPS`);
- ``eps_value``: the unit roundoff of a format the layout rounds each weight value to (tinygemm's
  bfloat16 fma, a full-dequant copy in the activation dtype), 0 where it keeps binary32;
- ``eps_law``: the unit roundoff of the scale format where the decode law rounds each product to it
  (``affine_round_to_scale_format``) and the kernel does not;
- ``ARITH``: binary32 evaluation of both sides (a few roundings of 2^-24 each); ``tiny``: half the
  subnormal spacing of the held format (:data:`TINY`), for terms too small to round relatively (a
  float16 zero point below 2^-14), once per term of an element (at most 16).

The value a layout rounds is ``w`` moved by its rounded terms (hence ``|w| + eps_terms·T``), and a law
that rounds the reference leaves ``|w|`` up to ``1 + eps_law`` short of the exact product.

A layout scaled by 1 + 1e-2 is outside it wherever ``|w|`` dominates the terms (every element of a
symmetric group whose code is not the centre): 1e-2 > 2^-8 + 2^-22.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardport.registry.contracts.model import AffineIntContract

from .weight import AnyContract

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]

#: Unit roundoff of each activation dtype a layout may hold its terms or values in (IEEE 754 binary32 and
#: binary16: 2^-24, 2^-11; bfloat16, 8 significand bits: 2^-8).
EPS = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
#: Half the subnormal spacing of each activation dtype (float16 2^-24 / 2; bfloat16 and float32 share
#: binary32's exponent range: 2^-133 / 2 and 2^-149 / 2).
TINY = {"float32": 2.0**-150, "bfloat16": 2.0**-134, "float16": 2.0**-25}
#: Unit roundoff of each scale format a decode law may round its products to.
SCALE_FORMAT_EPS = {"binary32": 2.0**-24, "binary16": 2.0**-11, "bfloat16": 2.0**-8}
#: binary32 evaluation of the layout and of the reference decode, relative to the terms and the value.
ARITH = 2.0**-22


@dataclass(frozen=True)
class Budget:
    """Per element ``[n_local, k_local]``: the largest ``|W_layout - W_reference|`` allowed, and why."""

    bound: F64
    source: str


def law_eps(contract: AnyContract) -> float:
    """``eps_law``: the scale format's unit roundoff where the decode law rounds each product to it."""
    if isinstance(contract, AffineIntContract) and contract.decode_law == "affine_round_to_scale_format":
        return SCALE_FORMAT_EPS.get(contract.scales.format, 0.0)
    return 0.0


def _power(eps: float) -> str:
    return "0" if eps == 0 else f"2^{int(np.log2(eps))}"


def rounding_budget(
    terms: F64 | None,
    reference: F32,
    *,
    held_in: str,
    eps_terms: float,
    eps_value: float = 0.0,
    eps_law: float = 0.0,
    tiny: float = 0.0,
    what: str,
) -> Budget:
    """The module's bound on every element; ``terms`` None: no terms rounded (``T = 0``).

    ``held_in``: the format the layout holds its terms or values in (named in the source); ``what``:
    the terms, in words.
    """
    w = np.abs(reference.astype(np.float64))
    t = np.zeros_like(w) if terms is None else np.abs(terms)
    rounded = (eps_value + eps_law) * (1.0 + eps_law) * (w + eps_terms * t)
    bound = eps_terms * t + rounded + ARITH * (t + w) + 16.0 * tiny
    source = (
        f"rounding to {held_in}: {_power(eps_terms)}·T + ({_power(eps_value)} + {_power(eps_law)})·|w| "
        f"+ 2^-22·(T + |w|) (and second-order terms) per element, T = {what} from the registry's "
        "unpacking of the planes (kernels/budget.py); not the measured error"
    )
    return Budget(bound=bound, source=source)


def affine_terms_magnitude(u: npt.NDArray[np.integer[Any]], scale: F64, zero: F64, group: int) -> F64:
    """``|u - 8|·|scale| + |zero|`` per element, ``scale``/``zero`` ``[G, N]`` over groups of ``group``."""
    g = np.arange(u.shape[1]) // group
    s = np.abs(scale[g, :].T)
    z = np.abs(zero[g, :].T)
    out: F64 = np.abs(u.astype(np.float64) - 8.0) * s + z
    return out
