"""Reading an HTTP request body no larger than a limit, without ever holding more of it."""

from __future__ import annotations

from starlette.requests import Request


class BodyTooLarge(Exception):
    """The body is (or says it is) over the limit; the message says which limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body over {limit} bytes")


async def read_body(request: Request, limit: int) -> bytes:
    """The body; BodyTooLarge from its Content-Length, or as soon as a chunked or
    understated body passes ``limit``. The rest is left unread (the server drops it)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    body = bytearray()
    async for chunk in request.stream():
        if len(body) + len(chunk) > limit:
            raise BodyTooLarge(limit)
        body += chunk
    return bytes(body)
