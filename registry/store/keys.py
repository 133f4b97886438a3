"""Where things live in a store: the key layout and the read limits of objects of unknown size.

Layout (see DESIGN.md)::

    blobs/sha256/<hex>                               immutable, content-addressed
    repos/<name>/tags/<tag>/<version:012d>.json      signed tag documents, create-only
    repos/<name>/referrers/<manifest-hex>/<blob-hex> attachments (signatures, evidence)
    uploads/<id>/                                    staging and leases of pushes in flight
"""

from __future__ import annotations

from shardport.registry.artifact.hashing import hex_of

DOCUMENT_MAX = 16 << 20
"""Most bytes read of a store object that is not a blob (tag documents, referrer links, leases)."""
BLOB_READ_MAX = 1 << 30
"""Most bytes of a blob read whole into memory without a known size (manifests, tile indexes,
signatures): :meth:`~.protocol.Store.read_blob` refuses a larger one."""


def blob_key(digest: str) -> str:
    """Key of the blob named ``digest``."""
    return f"blobs/sha256/{hex_of(digest)}"


def tag_dir(name: str, tag: str) -> str:
    """Folder holding a tag's documents."""
    return f"repos/{name}/tags/{tag}"


def tag_key(name: str, tag: str, version: int) -> str:
    """Key of one tag document."""
    return f"{tag_dir(name, tag)}/{version:012d}.json"


def referrer_key(name: str, manifest: str, blob: str) -> str:
    """Key that attaches ``blob`` to ``manifest`` in repository ``name``."""
    return f"repos/{name}/referrers/{hex_of(manifest)}/{hex_of(blob)}"


def read_limit(key: str, max_size: int | None) -> int:
    """The most bytes :meth:`~.protocol.Store.read` takes of ``key``.

    ``max_size``, or by default :data:`BLOB_READ_MAX` for blobs and :data:`DOCUMENT_MAX` for the rest.
    """
    if max_size is not None:
        return max_size
    return BLOB_READ_MAX if key.startswith("blobs/") else DOCUMENT_MAX
