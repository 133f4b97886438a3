"""Retries of S3 reads: the policy (attempts, backoff) and which failures are worth another attempt.

Pure: no I/O, no botocore import (exceptions are recognised by their class names and the HTTP status
they carry), so the decision is the same whichever HTTP backend raised them.

Retryable (a transfer failed; the next attempt may well succeed): a connection reset or refused, a
timeout, a body cut short (fewer bytes than asked, or than the response promised), HTTP 5xx, 429 and
S3's throttling codes. Final: every other answer (403, 404, 416, ...), and anything about the *content*
of a complete body — a digest mismatch is decided by verification, above this layer, and is never
retried into acceptance.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass

from shardport.registry.errors import UsageError

_TRANSIENT_CLASSES = frozenset(
    {
        # botocore / aiobotocore
        "HTTPClientError",
        "ConnectionError",
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "ResponseStreamingError",
        "IncompleteReadError",
        "ProxyConnectionError",
        # aiohttp
        "ClientConnectionError",
        "ClientPayloadError",
        "ServerDisconnectedError",
        "ClientOSError",
        "ContentLengthError",
        "TransferEncodingError",
        # ours
        "TruncatedBodyError",
    }
)
_THROTTLING_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "RequestLimitExceeded",
        "TooManyRequestsException",
    }
)


class TruncatedBodyError(Exception):
    """A response body ended before the bytes asked for (or promised by its headers) arrived."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """At most ``attempts`` tries of one request; between them a random sleep ("equal jitter").

    The n-th retry (n = 0, 1, ...) sleeps between half and all of ``min(max_delay, base_delay * 2**n)``
    seconds. ``attempts=1`` turns retries off. Defaults: 10 attempts, 50 ms base, 1 s cap: a request that
    keeps failing gives up after 2.8-5.6 s of sleeping; with 30% of requests failing independently one
    range fails all 10 with probability 0.3^10 = 6e-6 (a column-split rank pull of ~750 ranged GETs:
    ~0.4%). 5 attempts (0.24% per range) failed half of such pulls in a measurement.
    """

    attempts: int = 10
    base_delay: float = 0.05
    max_delay: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or not 1 <= self.attempts <= 100:
            raise UsageError(f"retry attempts: expected an integer in 1..100, got {self.attempts!r}")
        for name in ("base_delay", "max_delay"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value <= 600:
                raise UsageError(f"retry {name}: expected seconds in 0..600, got {value!r}")

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to sleep before retry number ``retry`` (0 for the first)."""
        cap = min(self.max_delay, self.base_delay * 2.0 ** min(retry, 30))
        return (rng or random).uniform(cap / 2, cap)


NO_RETRIES = RetryPolicy(attempts=1)


def _status(exc: BaseException) -> tuple[int | None, str]:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None, ""
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    code = str(response.get("Error", {}).get("Code", ""))
    return (int(status) if isinstance(status, int) else None), code


def retryable(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a transient transfer failure.

    The first exception in the chain that carries an HTTP answer decides by its status; otherwise a
    connection-level failure anywhere in the chain makes it retryable.
    """
    seen: BaseException | None = exc
    transient = False
    depth = 0
    while seen is not None and depth < 16:
        status, code = _status(seen)
        if status is not None or code:
            return code in _THROTTLING_CODES or (status is not None and (status >= 500 or status == 429))
        if isinstance(seen, FileNotFoundError | PermissionError):
            return False
        names = {cls.__name__ for cls in type(seen).__mro__}
        if names & _TRANSIENT_CLASSES or isinstance(
            seen, ConnectionError | TimeoutError | asyncio.TimeoutError
        ):
            transient = True
        seen = seen.__cause__ or seen.__context__
        depth += 1
    return transient
