"""S3 object reads: bounded bodies and one retry layer (:class:`~.retry.RetryPolicy`).

Which layer retries what (reads of object bodies — blobs, manifests, tag documents, referrer links, the
loader's ranged reads — all go through :class:`S3Reader`):

- botocore: off (``total_max_attempts = 1`` in the reader's client configuration);
- s3fs: not involved (the reader calls the aiobotocore client itself, not s3fs's retry wrapper);
- :class:`S3Reader`: every GET (and the HEAD that sizes a streamed blob) is tried at most
  ``policy.attempts`` times, with exponential backoff and jitter, when it fails in a retryable way
  (:func:`~.retry.retryable`: resets, timeouts, truncated bodies, 5xx, throttling). A retry re-requests
  only the range that failed. 403/404/416 and any other answer are final; so is whatever is wrong with a
  complete body: this layer never looks at content, verification above it decides.

Listings, ``exists``/``info`` and writes keep the store's ordinary s3fs filesystem (botocore's default
retries plus s3fs's own).

Bodies are never read past what is expected + 1 byte: a ranged GET reads at most its length + 1, a
whole object at most its limit + 1, so a server (or something in front of it) that answers with more
than asked cannot make us read, hold or write it.
"""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from fsspec.asyn import sync

from shardport import ShardportError
from shardport.registry.errors import DigestMismatchError, NotFoundError, StoreError, StoreObjectError
from shardport.registry.store.retry import RetryPolicy, TruncatedBodyError, retryable

READER_CONFIG: dict[str, Any] = {"retries": {"total_max_attempts": 1, "mode": "standard"}}
"""botocore configuration of the reader's client: no retries of its own (this module retries)."""

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_NOT_FOUND = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404"})


def _not_found(exc: BaseException) -> bool:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status == 404 or str(response.get("Error", {}).get("Code", "")) in _NOT_FOUND


def as_store_error(path: str, exc: BaseException) -> ShardportError:
    """``exc`` as one of our errors (a stream's reads happen outside the store's wrapping)."""
    if isinstance(exc, ShardportError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return NotFoundError(f"{path}: not found in the store")
    return StoreError(f"{path}: storage error: {type(exc).__name__}: {exc}")


def _total(resp: dict[str, Any]) -> int | None:
    """The object's size from a ranged answer's ``Content-Range`` (None when not given)."""
    found = _CONTENT_RANGE.fullmatch(str(resp.get("ContentRange") or ""))
    return int(found.group(3)) if found and found.group(3) != "*" else None


class S3Reader:
    """GETs of one S3 filesystem's objects with bounded bodies and :class:`RetryPolicy` retries.

    ``fs`` must be an s3fs filesystem whose botocore client does not retry (:data:`READER_CONFIG`).
    Paths are ``bucket/key``. Thread-safe: every call runs on ``fs``'s event loop.
    """

    def __init__(self, fs: Any, policy: RetryPolicy) -> None:
        self._fs = fs
        self.policy = policy

    async def _client(self, bucket: str) -> Any:
        await self._fs.set_session()
        return await self._fs.get_s3(bucket)

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        bucket, _, key = path.partition("/")
        client = await self._client(bucket)
        try:
            resp: dict[str, Any] = await getattr(client, method)(Bucket=bucket, Key=key, **kwargs)
        except Exception as exc:
            if _not_found(exc):
                raise FileNotFoundError(f"{path}: not found") from exc
            raise
        return resp

    async def _get_once(
        self, path: str, start: int | None, end: int | None, limit: int, size: int | None = None
    ) -> bytes:
        """One GET of ``[start, end)`` (whole object when ``start`` is None), at most ``limit`` + 1 bytes.

        Returns fewer bytes than asked only where the object itself ends there (``Content-Range``).
        """
        ranged = start is not None and end is not None
        kwargs = {"Range": f"bytes={start}-{end - 1}"} if start is not None and end is not None else {}
        resp = await self._call("get_object", path, **kwargs)
        body = resp["Body"]
        data = bytearray()
        try:
            while len(data) <= limit:
                chunk = await body.read(limit + 1 - len(data))
                if not chunk:
                    break
                data += chunk
        except Exception as exc:
            if type(exc).__name__ == "FlexibleChecksumError":  # a complete body, wrong bytes: final
                raise DigestMismatchError(
                    f"{path}: the body does not match the checksum the server sent with it ({exc})"
                ) from exc
            raise
        finally:
            body.close()
        n = len(data)
        if n > limit:
            what = f"a range of {limit} bytes" if ranged else f"an object of at most {limit} bytes"
            raise StoreObjectError(f"{path}: the server answered {what} with more bytes")
        promised = resp.get("ContentLength")
        if isinstance(promised, int) and n < promised:
            raise TruncatedBodyError(f"{path}: the body ended after {n} of {promised} bytes")
        if ranged and size is not None:
            found = _total(resp)
            if found is not None and found != size:  # final: the object itself is not the signed one
                raise DigestMismatchError(
                    f"{path}: the object is {found} bytes, the manifest says {size} "
                    "(bytes appended or cut; run fsck)"
                )
        if ranged and n < limit:
            total = _total(resp)
            if total is None or (start or 0) + n < total:
                raise TruncatedBodyError(f"{path}: a range of {limit} bytes ended after {n}")
        return bytes(data)

    async def _retrying(
        self, what: str, attempt: Callable[[], Awaitable[Any]], policy: RetryPolicy, counted: list[int]
    ) -> Any:
        for n in range(policy.attempts):
            try:
                return await attempt()
            except Exception as exc:
                if not retryable(exc):
                    raise
                if n + 1 == policy.attempts:
                    tries = "1 attempt" if n == 0 else f"{policy.attempts} attempts"
                    raise StoreError(
                        f"{what}: failed {tries} (the last: {type(exc).__name__}: {exc}); "
                        "the storage or the network is failing, try again later"
                    ) from exc
                counted[0] += 1
                await asyncio.sleep(policy.delay(n))
        raise AssertionError("unreachable")  # pragma: no cover

    def get(self, path: str, limit: int, policy: RetryPolicy | None = None) -> bytes:
        """The whole object at ``path``; :class:`~.errors.StoreObjectError` when over ``limit`` bytes."""
        pol = policy or self.policy

        async def run() -> bytes:
            data: bytes = await self._retrying(
                f"GET {path}", lambda: self._get_once(path, None, None, limit), pol, [0]
            )
            return data

        result: bytes = sync(self._fs.loop, run)
        return result

    def size(self, path: str, policy: RetryPolicy | None = None) -> int:
        """The object's size (HEAD), retried like a GET."""
        pol = policy or self.policy

        async def run() -> int:
            resp = await self._retrying(f"HEAD {path}", lambda: self._call("head_object", path), pol, [0])
            return int(resp.get("ContentLength") or 0)

        result: int = sync(self._fs.loop, run)
        return result

    def get_ranges(
        self,
        requests: Sequence[tuple[str, int, int]],
        *,
        concurrency: int,
        policy: RetryPolicy | None = None,
        sizes: Mapping[str, int] | None = None,
    ) -> tuple[list[bytes | BaseException], int]:
        """``(path, start, end)`` ranges, at most ``concurrency`` in flight; each retried on its own.

        Returns each range's bytes (fewer only where the object ends) or its final exception, in order,
        and how many retries were made.
        """
        pol = policy or self.policy
        counted = [0]

        async def one(sem: asyncio.Semaphore, path: str, start: int, end: int) -> bytes | BaseException:
            async with sem:
                try:
                    data: bytes = await self._retrying(
                        f"GET {path} bytes [{start}, {end})",
                        lambda: self._get_once(path, start, end, end - start, (sizes or {}).get(path)),
                        pol,
                        counted,
                    )
                    return data
                except Exception as exc:
                    return exc

        async def run() -> list[bytes | BaseException]:
            sem = asyncio.Semaphore(max(1, concurrency))
            return list(await asyncio.gather(*(one(sem, p, s, e) for p, s, e in requests)))

        results: list[bytes | BaseException] = sync(self._fs.loop, run)
        return results, counted[0]

    def open(self, path: str, limit: int | None) -> S3BlobStream:
        """A stream of the object's first ``limit`` bytes (None: all), read by ranged, retried GETs."""
        return S3BlobStream(self, path, limit)


class S3BlobStream(io.RawIOBase):
    """A read-only stream of an S3 object: one ranged GET per read call, each retried on its own.

    The object's size comes from a HEAD at the first read; the stream ends at ``limit`` bytes (readers
    that must see "too large" pass the expected size + 1) or where the object ends, whichever is first.
    """

    def __init__(self, reader: S3Reader, path: str, limit: int | None) -> None:
        super().__init__()
        self._reader = reader
        self._path = path
        self._limit = limit
        self._end: int | None = None
        self._pos = 0

    def readable(self) -> bool:
        """Always: a read-only stream."""
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        """Fill ``buffer`` from the next bytes of the object (0 at the end)."""
        if self._end is None:
            try:
                size = self._reader.size(self._path)
            except Exception as exc:
                raise as_store_error(self._path, exc) from exc
            self._end = size if self._limit is None else min(size, self._limit)
        view = memoryview(buffer).cast("B")
        stop = min(self._end, self._pos + len(view))
        if stop <= self._pos:
            return 0
        [data], _ = self._reader.get_ranges([(self._path, self._pos, stop)], concurrency=1)
        if isinstance(data, BaseException):
            raise as_store_error(self._path, data) from data
        view[: len(data)] = data
        asked, self._pos = stop - self._pos, self._pos + len(data)
        if len(data) < asked:  # the object ends here (shorter than its HEAD said): nothing more to read
            self._end = self._pos
        return len(data)
