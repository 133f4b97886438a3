"""The root of every error shardport raises, and the CLI exit codes."""

#: Each process exit status of the ``registry`` CLI and the one thing it means.
EXIT_CODES: dict[int, str] = {
    0: "ok",
    1: "verification failed: the store or a file lied (hash, signature, tag history, witness)",
    2: "usage: a bad command line, reference, name, option or input path",
    3: "not found: a tag, manifest, blob or key does not exist",
    4: "conflict: another writer moved the tag first; retry (--retry N)",
    5: "refused input: a container or contract gate refused the checkpoint",
    6: "unavailable: the store or a signing service failed or could not be reached (cause in the message)",
    70: "internal error: a bug; the message names the file holding the traceback",
}


class ShardportError(Exception):
    """Base class of all shardport errors.

    ``exit_code`` is the process exit status the CLI uses for it; :data:`EXIT_CODES` says what each
    status means (each means one thing).
    """

    exit_code: int = 1
