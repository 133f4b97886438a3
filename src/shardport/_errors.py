"""The root of every error shardport raises."""


class ShardportError(Exception):
    """Base class of all shardport errors.

    ``exit_code`` is the process exit status the CLI uses for it: 0 ok, 1 verification or contract
    failure, 2 usage, 3 not found, 4 conflict (or, for container parsers, a parse error).
    """

    exit_code: int = 1
