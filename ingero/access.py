"""The door of every Fleet and Echo listener: bearer token, rate limits, audit, in one place.

:meth:`Gate.admit` checks a request's ``Authorization`` against the daemon's
:class:`~ingero.bearer.Keyring`, spends from the token's (or, for a refused request, the
source address's) bucket (``ingero.ratelimit``) and records the
outcome in the audit log (:mod:`ingero.audit`). It answers the caller's identity or a
:class:`Refusal` (HTTP status, reason, message, Retry-After) that each listener words in
its own protocol (OTLP ``google.rpc.Status``, Fleet's and Echo's JSON, gRPC status).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ingero.audit import ACCEPTED, REFUSED, AuditKey, AuditLog
from ingero.bearer import Identity, Keyring, NamedToken
from ingero.clock import Clock
from ingero.errors import ConfigError
from ingero.ratelimit import RateLimitConfig, RateLimiter
from ingero.tls import ServerTls

log = logging.getLogger(__name__)

T = TypeVar("T")

RATE_LIMITED = "rate_limited"  # a token over its rate
SOURCE_RATE_LIMITED = "source_rate_limited"  # an address over its rate of refusals


@dataclass(frozen=True)
class Refusal:
    """Why a request was not let in: 401 (``reason``: which check failed) or 429."""

    status: int
    reason: str
    message: str
    retry_after: float | None = None


def _over_source_rate(wait: float) -> Refusal:
    return Refusal(
        429, SOURCE_RATE_LIMITED, "too many refused requests from this address; retry later", wait
    )


class Gate(Generic[T]):
    """One per daemon, shared by its listeners (the rate limits count across them)."""

    def __init__(
        self,
        keyring: Keyring[T],
        open_payload: T,
        limits: RateLimitConfig,
        audit: AuditLog | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.keyring = keyring
        self.audit = audit
        self._open = Identity("", "", open_payload)
        self._tokens = RateLimiter(limits.per_token, limits.token_burst, limits.max_keys, clock)
        self._sources = RateLimiter(
            limits.refusals_per_source, limits.refusal_burst, limits.max_keys, clock
        )

    @property
    def enabled(self) -> bool:
        return self.keyring.enabled

    def admit(
        self, listener: str, authorization: str | None, source: str, unauthorized: str
    ) -> Identity[T] | Refusal:
        """The identity of the request's token (with authentication off: an anonymous
        one, not audited), or the refusal to answer; ``unauthorized`` is the message of
        a 401."""
        if not self.keyring.enabled:
            return self._open
        check = self.keyring.check(authorization)
        identity = check.identity
        if identity is None:
            wait = self._sources.take(source)
            refusal = (
                Refusal(401, check.reason or "unauthorized", unauthorized)
                if not wait
                else _over_source_rate(wait)
            )
            self._record(
                AuditKey(listener, REFUSED, "", check.token_id or "", refusal.reason, source)
            )
            return refusal
        wait = self._tokens.take(identity.token_id)
        if wait:
            self._record(
                AuditKey(listener, REFUSED, identity.name, identity.token_id, RATE_LIMITED, source)
            )
            return Refusal(
                429, RATE_LIMITED, f"this token is over its rate limit; retry in {wait:.2f} s", wait
            )
        self._record(AuditKey(listener, ACCEPTED, identity.name, identity.token_id))
        return identity

    def deny(self, listener: str, identity: Identity[T] | None, source: str, reason: str) -> None:
        """Audit a request the gate let in that its listener then refused for what it held
        (Fleet: a cluster outside the token's scope); with authentication off, nothing."""
        if identity is not None and identity.name:
            self._record(
                AuditKey(listener, REFUSED, identity.name, identity.token_id, reason, source)
            )

    def deny_limited(
        self, listener: str, identity: Identity[T] | None, source: str, reason: str
    ) -> Refusal | None:
        """:meth:`deny`, spending from ``source``'s bucket of refusals as a 401 does: None
        (the listener answers its own refusal), or the 429 to answer instead once that
        address is over its rate (audited as such), so probing with a valid token is held
        back like probing with wrong ones."""
        wait = self._sources.take(source)
        self.deny(listener, identity, source, SOURCE_RATE_LIMITED if wait else reason)
        return _over_source_rate(wait) if wait else None

    def _record(self, key: AuditKey) -> None:
        if self.audit is not None:
            self.audit.record(key)


def reload_material(
    daemon: str,
    keyring: Keyring[T],
    read_tokens: Callable[[], list[NamedToken[T]]],
    tls: ServerTls | None,
) -> bool:
    """SIGHUP: the tokens and the TLS certificate and key read again. What cannot be read
    keeps what was loaded before, with one log line saying why; a reload never turns
    authentication off (no token left). True when everything was reloaded."""
    ok = True
    try:
        tokens = read_tokens()
        if keyring.enabled and not tokens:
            raise ConfigError("no token left; a reload cannot turn authentication off")
        current, grace = keyring.replace(tokens)
        log.info("%s: reloaded %d token(s), %d more in their grace window", daemon, current, grace)
    except ConfigError as exc:
        ok = False
        log.error("%s: token reload failed, keeping the tokens loaded before: %s", daemon, exc)
    if tls is not None:
        try:
            tls.reload()
            log.info("%s: reloaded the TLS certificate %s", daemon, tls.cert)
        except ConfigError as exc:
            ok = False
            log.error(
                "%s: TLS reload failed, keeping the certificate loaded before: %s", daemon, exc
            )
    return ok
