"""The names callers import from the store, in one place.

:class:`~.protocol.Store` and :func:`~.protocol.open_store` (``Store(url)`` too), its value types, the key
layout and :func:`~.copies.file_identity`.

The protocol is :mod:`.protocol`; the backends :mod:`.local` and :mod:`.s3`; the key layout :mod:`.keys`.
"""

from __future__ import annotations

from shardport.registry.store.copies import Progress, file_identity
from shardport.registry.store.keys import (
    BLOB_READ_MAX,
    DOCUMENT_MAX,
    blob_key,
    referrer_key,
    tag_dir,
    tag_key,
)
from shardport.registry.store.protocol import AlreadyExists, ObjectInfo, ReadProfile, Store, open_store

__all__ = [
    "BLOB_READ_MAX",
    "DOCUMENT_MAX",
    "AlreadyExists",
    "ObjectInfo",
    "Progress",
    "ReadProfile",
    "Store",
    "blob_key",
    "file_identity",
    "open_store",
    "referrer_key",
    "tag_dir",
    "tag_key",
]
