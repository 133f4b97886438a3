"""Faults injected on purpose, so that the evidence's own tests can make a bring-up wrong and watch it fail.

``SHARDPORT_FAULT=rank<R>:<kind>`` arms one fault on rank ``R`` (unset: nothing happens, at the cost of
one environment lookup per seam). Each kind is a defect the parity ladder exists to catch, made for real
inside the rank, after the step it corrupts, so the rows measure it as they would measure a real bug:

- ``misscale``: the first quantized operator (by weight name) computes and decodes 1 % too large, as a
  packer that mis-scales its layout would: L2 (layout decode vs reference decode) and L3 (operator
  error) fail on that weight, with the numbers;
- ``codes``: one stored code of the first quantized operator's own integer layout is flipped (its
  lowest bit), as a repack that misplaced a nibble would: L1 (codes read back out of the layout vs the
  planes' codes) fails, with the place; a layout that runs the loaded planes in place has no bytes of
  its own to flip, and is left alone (its planes are the witness's business, L2);
- ``leak``: the first quantized operator keeps a full float32 decode of its weight alive, as a
  "temporary" dequant nobody freed: L5 "no persistent full dequant (measured)" fails with its bytes;
- ``kv-cache``: after the prefill, the first layer's cached keys are shifted by 0.5, as a cache written
  at the wrong positions would be: the decode steps no longer equal a fresh prefill (L4 "KV cache") and
  the decode logits leave the reference's (L4 max |Δ|).

NaN logits have their own test through a NaN weight (:mod:`tests.deploy.test_up_nonfinite`), and an
unexpected kernel through the manifest's pins (:mod:`tests.deploy.test_up_l5`).
"""

from __future__ import annotations

import os
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from shardport.kernels import PreparedLinear
from shardport.kernels.weight import RankWeight

FAULT_ENV = "SHARDPORT_FAULT"
Kind = Literal["misscale", "codes", "leak", "kv-cache"]
KINDS: tuple[Kind, ...] = ("misscale", "codes", "leak", "kv-cache")
#: The ``misscale`` factor: inside no kernel's tolerance, far inside a logit's top-1 margin.
SCALE = 1.01
#: The ``kv-cache`` shift added to the first layer's cached keys.
KV_SHIFT = 0.5


def armed(rank: int) -> Kind | None:
    """The fault armed for ``rank``, or None; a malformed value is refused (never silently ignored)."""
    value = os.environ.get(FAULT_ENV)
    if not value:
        return None
    who, _, kind = value.partition(":")
    if not who.startswith("rank") or not who[4:].isdigit() or kind not in KINDS:
        raise ValueError(f"{FAULT_ENV}={value!r}: expected rank<R>:<{'|'.join(KINDS)}>")
    return kind if int(who[4:]) == rank else None


class _Misscaled(PreparedLinear):
    """``inner`` with its output and its decode multiplied by :data:`SCALE`; the codes untouched."""

    def __init__(self, inner: PreparedLinear) -> None:
        super().__init__(
            inner.kernel,
            inner.op,
            inner.transformation,
            isa=inner.isa,
            conversion_error=inner.conversion_error,
        )
        self.inner = inner

    def _run(self, x: Any) -> Any:
        return self.inner._run(x) * SCALE

    @property
    def resident_bytes(self) -> int:
        return self.inner.resident_bytes

    def decode_rows(self, start: int, stop: int) -> npt.NDArray[np.float32]:
        return (self.inner.decode_rows(start, stop) * np.float32(SCALE)).astype(np.float32)

    def code_check(self, weight: RankWeight) -> Any:
        return self.inner.code_check(weight)

    def column_check(self, weight: RankWeight, columns: Any, reference: Any = None, rows: Any = None) -> Any:
        return self.inner.column_check(weight, columns, reference, rows)

    def conversion_budget(self, weight: RankWeight, reference: Any) -> Any:
        return self.inner.conversion_budget(weight, reference)

    def map_codes(self) -> Any:
        return self.inner.map_codes()

    def map_check(self, weight: RankWeight) -> Any:
        return self.inner.map_check(weight)

    def kernel_columns(self, columns: Any) -> Any:
        return self.inner.kernel_columns(columns)

    def read_back(self, weight: RankWeight) -> Any:
        return self.decode(), self.inner.code_check(weight)


def after_prepare(kind: Kind | None, ops: dict[str, dict[str, PreparedLinear]]) -> str | None:
    """Apply ``misscale`` or ``leak`` to the first quantized operator of ``ops``; the weight hit."""
    if kind not in ("misscale", "codes", "leak") or not ops:
        return None
    name = sorted(ops)[0]
    phases = ops[name]
    if kind == "codes":
        return name if _flip_a_code(next(iter(phases.values()))) else None
    if kind == "misscale":
        wrapped: dict[int, PreparedLinear] = {}
        for phase, op in phases.items():  # one wrapper per operator (the phases may share one)
            phases[phase] = wrapped.setdefault(id(op), _Misscaled(op))
    else:
        first = next(iter(phases.values()))
        first.leaked_decode = first.decode()  # type: ignore[attr-defined]
    return name


def _flip_a_code(op: PreparedLinear) -> bool:
    """Flip the lowest bit of the first element of ``op``'s own integer tensor (its packed codes)."""
    import torch

    if op.transformation not in ("repack", "conversion"):  # the loaded planes in place: no bytes of its own
        return False
    for value in vars(op).values():
        if isinstance(value, torch.Tensor) and not value.is_floating_point() and value.numel():
            value.view(-1)[0] ^= 1
            return True
    return False


def after_prefill(kind: Kind | None, keys: dict[Any, Any]) -> bool:
    """Apply ``kv-cache`` to the first layer's cached keys (a dict of torch tensors); whether it did."""
    if kind != "kv-cache" or not keys:
        return False
    first = sorted(keys)[0]
    keys[first] = keys[first] + KV_SHIFT
    return True
