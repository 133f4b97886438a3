"""The one digest type of every pydantic model parsed from the store: ``sha256:`` + 64 lowercase hex.

Use :data:`Digest` (or ``Digest | None``) for every field that holds a blob or document digest. A value
of any other form fails validation with the error type :data:`ERROR_TYPE`, which
:meth:`shardport.registry.artifact.manifest.Manifest.from_bytes` turns into :class:`MalformedDigestError`
naming
the field. The rule itself lives in :func:`shardport.registry.artifact.hashing.is_digest` (also behind
:func:`shardport.registry.artifact.refs.validate_digest` and every store key built from a digest).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

from shardport.registry.artifact.hashing import DIGEST_FORM, is_digest

ERROR_TYPE = "shardport_digest"


def _digest(value: str) -> str:
    if not is_digest(value):
        raise PydanticCustomError(
            ERROR_TYPE, "{shown} is not a digest; expected " + DIGEST_FORM, {"shown": repr(value)}
        )
    return value


Digest = Annotated[str, AfterValidator(_digest)]
"""A field holding ``sha256:<64 lowercase hex>``; nothing else validates."""
