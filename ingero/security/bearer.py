"""Bearer tokens on every link that carries one: read from a file, sent, and checked.

fleet-push reads its token file (:class:`TokenFile`, re-read when it changes) and sends
``Authorization: Bearer <token>`` (HTTP header or gRPC metadata); Fleet and Echo check
presented tokens against a :class:`Keyring`: several named tokens valid at once, replaced
as a whole on SIGHUP, the ones a reload removed still valid for a grace window so a
rotation never needs a restart. Fleet's keyring comes from token files
(:func:`load_token_files`), Echo's from its token table of scoped tokens (``ingero.echo.auth``).

Tokens are looked up by their SHA-256 digest: the time a lookup takes depends on the
digest of what was presented, never on how much of a real token it matched. Only a
token's name and :func:`token_id` (a 12-hex-digit prefix of its SHA-256) are ever logged.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from ingero.runtime.clock import Clock, SystemClock
from ingero.runtime.errors import ConfigError

log = logging.getLogger(__name__)

T = TypeVar("T")

# A token file is one line; anything past this is not a token file (and is not read whole).
MAX_TOKEN_FILE_BYTES = 64 * 1024
# A token directory holds a token per file; past this many, it is a configuration error.
MAX_TOKEN_FILES = 1000
TOKEN_ID_HEX = 12

# Why a presented token was refused (counted and audited by these names).
MISSING = "missing_token"
NOT_BEARER = "not_bearer"
UNKNOWN = "unknown_token"
RETIRED = "retired_token"


def authorization(token: str) -> str:
    """The ``Authorization`` value (HTTP header, gRPC metadata) that presents ``token``."""
    return f"Bearer {token}"


# Authorization values a keyring remembers as accepted (each token, as its senders spell
# the header); beyond that, the rest are hashed on every request, as all were before.
MAX_ACCEPTED_VALUES = 256


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "replace")).digest()


def token_id(token_digest: bytes) -> str:
    """What the audit log shows of a token: the first hex digits of its SHA-256."""
    return token_digest.hex()[:TOKEN_ID_HEX]


def parse_token_text(data: bytes, where: str) -> str:
    """The token a file holds: its one line that is neither blank nor a ``#`` comment,
    whitespace (CR of CRLF too) stripped; a ConfigError naming ``where`` otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    lines = [s.strip() for s in text.splitlines()]
    tokens = [s for s in lines if s and not s.startswith("#")]
    if not tokens:
        raise ConfigError(f"{where}: holds no token")
    if len(tokens) > 1:
        raise ConfigError(f"{where}: holds {len(tokens)} lines; a token file holds one token")
    token = tokens[0]
    # An HTTP header value is visible ASCII; anything else could never be presented.
    if not all("!" <= c <= "~" for c in token):
        raise ConfigError(f"{where}: the token has a character that is not visible ASCII")
    return token


def read_token_file(path: str, key: str) -> str:
    """The token in the file at ``path``, read at most MAX_TOKEN_FILE_BYTES; a one-line
    ConfigError naming the setting ``key`` when it cannot be read or holds no token."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise ConfigError(f"{key}: {path} is over {MAX_TOKEN_FILE_BYTES} bytes; not a token file")
    return parse_token_text(data, f"{key}: {path}")


class TokenFile:
    """A sender's token file, re-read when it changes (one ``stat`` per use), so a node
    picks up a rotated token without a restart. A changed file that cannot be read keeps
    the token read before (logged once per change)."""

    def __init__(self, path: str, key: str) -> None:
        self._path, self._key = path, key
        self._stamp = self._stat()
        self._token = read_token_file(path, key)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def __call__(self) -> str:
        stamp = self._stat()
        if stamp != self._stamp and stamp is not None:
            self._stamp = stamp
            try:
                self._token = read_token_file(self._path, self._key)
            except ConfigError as exc:
                log.warning("%s; still sending the token read before", exc)
        return self._token


TokenSource = str | Callable[[], str] | None
"""A token as senders take it: fixed, read on each use (a :class:`TokenFile`), or none."""


def current_token(source: TokenSource) -> str | None:
    return source() if callable(source) else source


def token_source(path: str | None, key: str) -> TokenFile | None:
    return TokenFile(path, key) if path else None


# ---- the receiving side ---------------------------------------------------------------


@dataclass(frozen=True)
class Identity(Generic[T]):
    """A token that was accepted: its name, :func:`token_id` and what its owner attaches
    (Echo: the clusters it covers)."""

    name: str
    token_id: str
    payload: T


@dataclass(frozen=True)
class Check(Generic[T]):
    """The outcome of checking one presented ``Authorization`` value: ``identity`` when
    accepted, else ``reason``; ``token_id`` of what was presented (None when nothing was)."""

    identity: Identity[T] | None
    reason: str | None = None
    token_id: str | None = None


@dataclass(frozen=True)
class NamedToken(Generic[T]):
    name: str
    digest: bytes
    payload: T


class Keyring(Generic[T]):
    """The tokens a listener accepts, replaced as a whole by :meth:`replace`; an empty
    keyring means authentication is off. A token that a replacement drops stays valid for
    ``grace`` seconds, then is refused as ``retired_token``. Lookups read one immutable
    snapshot, so they need no lock while a reload swaps it."""

    def __init__(
        self, tokens: list[NamedToken[T]], grace: float = 300.0, clock: Clock | None = None
    ) -> None:
        self._grace = grace
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()  # serialises replacements only
        # digest -> the Check that accepts it, made once per load, not per request
        self._current: Mapping[bytes, Check[T]] = self._accepting(tokens)
        # Authorization value -> its Check, for values ``_current`` accepted: every push
        # presents one of a few such values, so most requests skip the hash. A new dict
        # comes with every replacement (see check for the order of the two reads).
        self._accepted: dict[str, Check[T]] = {}
        # digest -> (its Check, monotonic time its grace ends)
        self._retired: Mapping[bytes, tuple[Check[T], float]] = {}

    @staticmethod
    def _accepting(tokens: list[NamedToken[T]]) -> dict[bytes, Check[T]]:
        return {
            t.digest: Check(
                Identity(t.name, token_id(t.digest), t.payload), None, token_id(t.digest)
            )
            for t in tokens
        }

    @property
    def enabled(self) -> bool:
        return bool(self._current)

    def names(self) -> list[str]:
        return sorted(c.identity.name for c in self._current.values() if c.identity)

    def replace(self, tokens: list[NamedToken[T]]) -> tuple[int, int]:
        """Accept ``tokens`` from now on; those dropped stay valid for the grace window.
        Returns (tokens now current, tokens in their grace window)."""
        with self._lock:
            now = self._clock.monotonic()
            new = self._accepting(tokens)
            retired = {d: r for d, r in self._retired.items() if r[1] > now and d not in new}
            for d, c in self._current.items():
                if d not in new:
                    retired[d] = (c, now + self._grace)
            self._retired, self._current = retired, new
            self._accepted = {}
            return len(new), len(retired)

    def check(self, authorization: str | None) -> Check[T]:
        """Who presents ``authorization`` (the header or metadata value), or why not."""
        if not authorization:
            return Check(None, MISSING)
        # Read before _current: a replacement swaps _current first, so a value accepted by
        # the tokens before it lands in the dict it also discards, never in the new one.
        accepted = self._accepted
        hit = accepted.get(authorization)
        if hit is not None:
            return hit
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:  # RFC 7235: the scheme is case-insensitive
            return Check(None, NOT_BEARER)
        presented = digest(token)
        found = self._current.get(presented)
        if found is not None:
            if len(accepted) < MAX_ACCEPTED_VALUES:
                accepted[authorization] = found
            return found
        retired = self._retired.get(presented)
        if retired is None:
            return Check(None, UNKNOWN, token_id(presented))
        if retired[1] <= self._clock.monotonic():
            return Check(None, RETIRED, token_id(presented))
        return retired[0]


def load_token_files(files: Mapping[str, str], directory: str | None) -> list[NamedToken[None]]:
    """Named tokens from ``files`` (setting name -> path; the token's name is the file's
    name) and every file of ``directory`` not starting with a dot. Any file that cannot be
    read is one ConfigError, so a reload never half-applies."""
    paths: list[tuple[str, str]] = [(key, path) for key, path in files.items() if path]
    if directory:
        try:
            entries = sorted(
                (e for e in os.scandir(directory) if not e.name.startswith(".") and e.is_file()),
                key=lambda e: e.name,
            )
        except OSError as exc:
            raise ConfigError(
                f"auth.token_dir: cannot read {directory}: {exc.strerror or exc}"
            ) from None
        if len(entries) > MAX_TOKEN_FILES:
            raise ConfigError(f"auth.token_dir: {directory} holds over {MAX_TOKEN_FILES} files")
        paths.extend(("auth.token_dir", e.path) for e in entries)
    tokens: dict[bytes, NamedToken[None]] = {}
    for key, path in paths:
        token = read_token_file(path, key)
        d = digest(token)
        name = Path(path).name
        if d in tokens and tokens[d].name != name:
            log.warning("%s: the same token as %s", path, tokens[d].name)
        tokens.setdefault(d, NamedToken(name, d, None))
    return list(tokens.values())
