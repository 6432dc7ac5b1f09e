"""Reading an HTTP request body no larger than a limit, without ever holding more of it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect, Request

from ingero.otlp.receiver import DISCARD_MAX_BYTES, DISCARD_TIMEOUT_S


class BodyTooLarge(Exception):
    """The body is (or says it is) over the limit; the message says which limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body over {limit} bytes")


def _declared(request: Request) -> int | None:
    declared = request.headers.get("content-length", "")
    return int(declared) if declared.isdigit() else None


async def _discard(stream: AsyncIterator[bytes], seen: int = 0) -> None:
    """Read and drop the rest of a refused body, up to DISCARD_MAX_BYTES in all and for at
    most DISCARD_TIMEOUT_S, so that uvicorn does not close the connection on unread data
    (a TCP reset the sender sees instead of the refusal). Holds one chunk at a time."""

    async def drain() -> None:
        nonlocal seen
        async for chunk in stream:
            seen += len(chunk)
            if seen > DISCARD_MAX_BYTES:
                return

    with contextlib.suppress(TimeoutError, ClientDisconnect):
        await asyncio.wait_for(drain(), DISCARD_TIMEOUT_S)


async def discard_body(request: Request) -> None:
    """Drop the body of a request refused before any of it was read (the caller knows:
    a body read already cannot be streamed again), within the bounds of ``_discard``;
    nothing if it is declared empty or too large."""
    declared = _declared(request)
    if declared == 0 or (declared is not None and declared > DISCARD_MAX_BYTES):
        return
    await _discard(request.stream())


async def read_body(request: Request, limit: int) -> bytes:
    """The body; BodyTooLarge from its Content-Length, or as soon as a chunked or
    understated body passes ``limit``. What is refused is read and dropped (bounded, see
    ``_discard``) before the answer, so the sender reads the 413."""
    declared = _declared(request)
    if declared is not None and declared > limit:
        if declared <= DISCARD_MAX_BYTES:
            await _discard(request.stream())
        raise BodyTooLarge(limit)
    body = bytearray()
    stream = request.stream()
    async for chunk in stream:
        if len(body) + len(chunk) > limit:
            await _discard(stream, len(body) + len(chunk))
            raise BodyTooLarge(limit)
        body += chunk
    return bytes(body)
