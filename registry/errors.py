"""Errors of the registry package.

Every error names the object it is about and what was expected vs found, and carries the CLI exit
code (the table is :data:`shardport.EXIT_CODES`): 1 verification failed, 2 usage, 3 not found,
4 conflict (retry), 5 refused input (a container or contract gate), 6 unavailable (the store or a
signing service), 70 internal error.

Tree::

    ShardportError
    └── RegistryError                      (1)
        ├── UsageError                     (2)  bad reference, name, option or input path
        ├── NotFoundError                  (3)  blob, manifest, tag, key
        ├── ConflictError                  (4)
        │   └── TagMovedError                   another writer took the version first
        ├── RefusedError                   (5)  a checkpoint refused by a gate: the container
        │                                       errors (``formats.errors``) and contract errors
        │                                       (``contracts.errors``, also VerificationErrors)
        ├── StoreError                     (6)  the storage backend failed (cause chained)
        ├── StateFileError                 (1)  this client's trust state file is unreadable
        ├── InternalError                 (70)  an unexpected exception (a bug): the CLI wraps it
        │                                       and writes its traceback to a file
        └── VerificationError              (1)  the store or a file lied
            ├── DigestMismatchError
            │   └── HeaderDigestMismatchError   a GGUF header's KV bytes differ from the manifest's digest
            ├── MalformedDigestError            a digest that is not sha256:<64 lowercase hex>
            ├── ManifestInconsistentError       a manifest names what it does not have
            ├── SchemaVersionError
            ├── UnsafePathError
            ├── StoreObjectError                a store file is a link, pipe, device or folder, or too large
            ├── SignatureError
            │   ├── UnsignedError
            │   └── UntrustedSignerError
            └── TagHistoryError
                ├── TagChainError
                ├── RollbackAttackError
                ├── EquivocationError
                └── TagExpiredError
"""

from __future__ import annotations

from shardport import ShardportError


class RegistryError(ShardportError):
    """Base of every registry error."""

    exit_code = 1


class UsageError(RegistryError):
    """The command was called wrongly (bad reference, name, option or input path)."""

    exit_code = 2


class NotFoundError(RegistryError):
    """A blob, manifest, tag or key does not exist."""

    exit_code = 3


class ConflictError(RegistryError):
    """A concurrent writer got there first."""

    exit_code = 4


class TagMovedError(ConflictError):
    """Another writer created the tag version this writer wanted; re-read the tag and retry."""


class RefusedError(RegistryError):
    """A gate refused a checkpoint: its container is malformed or its numeric contract does not hold."""

    exit_code = 5


class FieldRefusedError(RefusedError):
    """A refused input named part by part: which tensor, which field, what was expected, what was found.

    Attributes ``tensor``, ``field``, ``expected``, ``found`` and ``remedy`` hold the parts of the message
    ``"{tensor}: {field}: expected {expected}, found {found}[ — remedy]"``.
    """

    def __init__(self, tensor: str, field: str, expected: object, found: object, remedy: str = "") -> None:
        self.tensor = tensor
        self.field = field
        self.expected = expected
        self.found = found
        self.remedy = remedy
        message = f"{tensor}: {field}: expected {expected}, found {found}"
        if remedy:
            message += f" — {remedy}"
        super().__init__(message)


class StoreError(RegistryError):
    """The storage backend failed (the original exception is chained)."""

    exit_code = 6


class InternalError(RegistryError):
    """An exception nobody anticipated (a bug in shardport or a library); the CLI reports it as this.

    ``traceback_file`` names the file holding the original traceback (None when none could be written).
    """

    exit_code = 70
    traceback_file: str | None = None


class StateFileError(RegistryError):
    """The client's trust state file (``$SHARDPORT_HOME/state/``) is corrupt or unreadable."""


class VerificationError(RegistryError):
    """Content failed verification: a hash, a signature, a tag history or a path is not as it must be."""


class DigestMismatchError(VerificationError):
    """Bytes do not hash to the digest that names them."""


class HeaderDigestMismatchError(DigestMismatchError):
    """A GGUF file's header bytes (through its last key/value pair) do not hash to the manifest's digest."""


class MalformedDigestError(VerificationError):
    """A digest read from the store or a manifest is not ``sha256:`` + 64 lowercase hex digits."""


class ManifestInconsistentError(VerificationError):
    """A manifest contradicts itself (the error names the manifest, the field and the value).

    For example a tensor in a file ``files`` does not list, a byte range outside its file, or a plane
    naming a tensor the tensor table does not have.
    """


class SchemaVersionError(VerificationError):
    """A document uses a mandatory schema version this shardport does not understand."""


class UnsafePathError(VerificationError):
    """A path from a manifest would escape its destination (absolute, ``..``, symlink, duplicate)."""


class StoreObjectError(VerificationError):
    """A store object is not a regular file (a link, pipe, device, socket, folder), or is too large.

    Too large: more bytes than its expected size, or than the documented maximum for its kind.
    """


class SignatureError(VerificationError):
    """A signature is missing, malformed or does not verify."""


class UnsignedError(SignatureError):
    """Content carries no signature and ``--allow-unsigned`` was not given."""


class UntrustedSignerError(SignatureError):
    """The signature verifies, but the trust policy does not allow that key for this repository/tag."""


class TagHistoryError(VerificationError):
    """The tag's document history is not acceptable."""


class TagChainError(TagHistoryError):
    """A tag document does not link to its predecessor (or names the wrong tag or version)."""


class RollbackAttackError(TagHistoryError):
    """The store offers a lower tag version than this client has already seen."""


class EquivocationError(TagHistoryError):
    """The store offers a different document for a version this client has already seen."""


class TagExpiredError(TagHistoryError):
    """The newest tag document has expired (a freeze attack, or the tag needs re-signing)."""
