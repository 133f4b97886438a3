"""Fallback policy: per transformation class, ``forbid``, ``warn`` or ``allow``.

``none`` and ``repack`` (codes and scales only permuted) are never fallbacks. ``conversion`` (a change
of representation with a recorded reconstruction error) is allowed by default; ``generic`` (a portable
kernel where a specialised one was wanted) warns by default; ``full-dequant`` (a full-size float copy)
is forbidden by default. The CLI's ``--fallback forbid|warn|allow`` sets ``generic`` and
``full_dequant`` together, and ``forbid`` forbids ``conversion`` too (:meth:`FallbackPolicy.from_cli`):
a user who forbids fallbacks gets only kernels that run the stored codes and scales as they are or
permuted (``none``/``repack``), never a layout that changed a number.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from .capability import Transformation

Mode = Literal["forbid", "warn", "allow"]


class FallbackPolicy(BaseModel):
    """The mode of each fallback class (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    conversion: Mode = "allow"
    generic: Mode = "warn"
    full_dequant: Mode = "forbid"

    @classmethod
    def from_cli(cls, mode: Mode, *, conversion: Mode | None = None) -> FallbackPolicy:
        """The policy of ``--fallback MODE``: generic and full dequant both ``mode``.

        ``conversion``: ``forbid`` under ``--fallback forbid``, else ``allow`` (a conversion's error is
        held to its own budget by parity L2/L3 and recorded), unless given.
        """
        if conversion is None:
            conversion = "forbid" if mode == "forbid" else "allow"
        return cls(conversion=conversion, generic=mode, full_dequant=mode)

    def mode(self, transformation: Transformation) -> Mode:
        """The mode that applies to a transformation class."""
        if transformation == "conversion":
            return self.conversion
        if transformation == "generic":
            return self.generic
        if transformation == "full-dequant":
            return self.full_dequant
        return "allow"
