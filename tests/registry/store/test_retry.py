"""The retry policy and which S3 read failures are retried (pure logic)."""

from __future__ import annotations

import random

import pytest
from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

from shardport.registry.errors import DigestMismatchError, StoreObjectError, UsageError
from shardport.registry.store.retry import RetryPolicy, TruncatedBodyError, retryable


def _client_error(status: int, code: str) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject"
    )


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (_client_error(500, "InternalError"), True),
        (_client_error(503, "SlowDown"), True),
        (_client_error(429, "TooManyRequests"), True),
        (_client_error(400, "RequestTimeout"), True),
        (_client_error(404, "NoSuchKey"), False),
        (_client_error(403, "AccessDenied"), False),
        (_client_error(416, "InvalidRange"), False),
        (ConnectionResetError(104, "reset"), True),
        (ConnectionClosedError(endpoint_url="http://x"), True),
        (ReadTimeoutError(endpoint_url="http://x"), True),
        (TruncatedBodyError("cut"), True),
        (FileNotFoundError("gone"), False),
        (PermissionError("no"), False),
        (DigestMismatchError("wrong bytes"), False),
        (StoreObjectError("too large"), False),
        (ValueError("other"), False),
    ],
)
def test_what_is_retried(exc: BaseException, expected: bool) -> None:
    assert retryable(exc) is expected


def test_the_first_http_answer_in_the_chain_decides() -> None:
    outer = OSError(5, "wrapped")
    outer.__cause__ = _client_error(500, "InternalError")
    assert retryable(outer)
    outer.__cause__ = _client_error(404, "NoSuchKey")
    assert not retryable(outer)
    reset = OSError("wrapped")
    reset.__cause__ = ConnectionResetError()
    assert retryable(reset)


def test_policy_backoff_and_validation() -> None:
    policy = RetryPolicy(attempts=4, base_delay=0.1, max_delay=0.3)
    rng = random.Random(0)
    for retry, cap in ((0, 0.1), (1, 0.2), (2, 0.3), (9, 0.3)):
        for _ in range(20):
            assert cap / 2 <= policy.delay(retry, rng) <= cap
    assert (RetryPolicy().attempts, RetryPolicy().base_delay, RetryPolicy().max_delay) == (10, 0.05, 1.0)
    for bad in (
        {"attempts": 0},
        {"attempts": 1.5},
        {"base_delay": float("nan")},
        {"max_delay": float("inf")},
    ):
        with pytest.raises(UsageError):
            RetryPolicy(**bad)  # type: ignore[arg-type]
