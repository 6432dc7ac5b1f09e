"""Fleet's threshold reply: one type and one codec for all three ways it travels.

Fleet answers every accepted health push with the pushing node's peer-group threshold, in
the HTTP response headers (``X-Ingero-Threshold``, ``X-Ingero-Quorum-Met``,
``X-Ingero-Panic``) or the gRPC **initial** metadata (``ingero-threshold``, …), and serves
the whole view as JSON at ``GET /api/v1/threshold`` (docs/design.md, "Contracts").
Added later, and sent only when they have a value: the group's peer medians of the raw
rates (``X-Ingero-Peer-Rates: kernel_launch_rate=3484.2``), the pushing node's ratio to
them (``X-Ingero-Rate-Ratios``) and Fleet's open straggler episode of that node
(``X-Ingero-Episode-Id``), so the node and Fleet tell one episode by one id.

Every field is declared once, in :class:`ThresholdView`, with its kind and, for the few a
push reply carries, its metadata key (the header name is derived from it). The encoders
and decoders walk those declarations, so a later field (added, never renamed) is one line
there, and a decoder returns everything its encoder wrote. Decoders refuse what is not
sane (a threshold that is not a finite number in [0, 1], a flag that is not
``true|false``, a count that is negative, …) with ValueError: such a value is never used.
The text fields are bounded too: an episode id is an event id (hex digits and '-', at most
64), an NCCL episode's type one this node knows, its op a short NCCL name. The fields of
an episode (a ``part``) are taken together: one that fails leaves the episode out and the
rest of the reply stands, said in the decoder's ``rejected`` list; encoders never write a
value their decoder refuses. Unknown JSON keys and unknown headers are ignored, so an older
node reads a newer Fleet; a refusal quotes at most ``MAX_QUOTED`` characters of a value.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any
from urllib.parse import quote, unquote

from ingero.otlp.collectives import MAX_OP_CHARS

API_PATH = "/api/v1/threshold"
# The enter rule Fleet and fleet-push both apply, so they agree on who straggles: an episode
# starts once the score was below the threshold in ENTER_INTERVALS of the last ENTER_WINDOW
# intervals (ticks). At a 1 s push interval a node 10% slower sits about one interval's
# noise below the threshold: in a group of 8, two of three took 7 to 8 intervals at p95;
# three of five take 5 to 6 with min_margin 0.04, and a healthy node, below in one interval
# of 400 to 800, collects three far more rarely than two
# (docs/decisions/0034-min-margin-004-three-of-five.md).
ENTER_INTERVALS = 3
ENTER_WINDOW = 5
# Fleet keeps the window (and the count, in a row) as bits of one integer per node.
MAX_ENTER_WINDOW = 32
# The exit rule both apply: an episode ends by measurement once the score was at or above
# threshold + hysteresis in EXIT_INTERVALS classified intervals in a row. A node 10% slow
# sits about one interval's noise below the threshold, so one noisy interval above it
# ended the episode and the next three below opened another
# (docs/decisions/0045-exit-intervals-two.md). Ends that are not measurements (job ended,
# node inactive, quorum lost) stay immediate.
EXIT_INTERVALS = 2
# An episode waits at most this long for its end: as long as the enter window.
MAX_EXIT_INTERVALS = MAX_ENTER_WINDOW


# At most this much of a refused value is quoted in its error: a spoofed reply's 60,000
# characters must not become a 110 KB journal line.
MAX_QUOTED = 40


def _short(value: object) -> str:
    text = repr(value)
    if len(text) <= MAX_QUOTED:
        return text
    return f"{text[:MAX_QUOTED]}... ({len(text)} characters)"


class _Kind(ABC):
    """One kind of field value: how it is checked, and written as text for push replies."""

    @abstractmethod
    def check(self, value: object, label: str) -> Any:
        """The value as the field holds it (from JSON, or parsed text); ValueError if insane."""

    def parse(self, text: str, label: str) -> object:
        """A push reply's non-empty text as the JSON value it stands for."""
        return text

    def to_text(self, value: Any) -> str:
        """The value in a push reply; empty for none."""
        return "" if value is None else str(value)

    def from_text(self, text: str, label: str) -> Any:
        return self.check(None if text == "" else self.parse(text, label), label)


class _Number(_Kind):
    """A finite number, or none."""

    def check(self, value: object, label: str) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{label} {_short(value)} is not a number")
        if not math.isfinite(value):
            raise ValueError(f"{label} {_short(value)} is not finite")
        return float(value)

    def parse(self, text: str, label: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{label} {_short(text)} is not a number") from None

    def to_text(self, value: Any) -> str:
        return "" if value is None else repr(float(value))


class _Unit(_Number):
    """A number in [0, 1], or none."""

    def check(self, value: object, label: str) -> float | None:
        number = super().check(value, label)
        if number is not None and not 0.0 <= number <= 1.0:
            raise ValueError(f"{label} {_short(value)} is outside [0, 1]")
        return number


class _Flag(_Kind):
    """``true`` or ``false``."""

    def check(self, value: object, label: str) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"{label} {_short(value)} is not true or false")
        return value

    def parse(self, text: str, label: str) -> object:
        word = text.strip().lower()
        return word == "true" if word in ("true", "false") else text

    def to_text(self, value: Any) -> str:
        return "true" if value else "false"


class _Count(_Kind):
    """A whole number >= 0, or none."""

    def check(self, value: object, label: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{label} {_short(value)} is not a count")
        return value

    def parse(self, text: str, label: str) -> object:
        return int(text) if text.isdigit() else text


class _RateMap(_Kind):
    """Rate name -> finite number >= 0 (at most 16 names of at most 64 characters), or none;
    in a push reply ``name=value,name=value``."""

    MAX_ENTRIES = 16
    MAX_NAME = 64

    def check(self, value: object, label: str) -> dict[str, float] | None:
        if value is None:
            return None
        if not isinstance(value, dict) or len(value) > self.MAX_ENTRIES:
            raise ValueError(f"{label} is not a map of at most {self.MAX_ENTRIES} rates")
        out: dict[str, float] = {}
        for name, number in value.items():
            if not isinstance(name, str) or not 0 < len(name) <= self.MAX_NAME:
                raise ValueError(f"{label}: rate name {_short(name)} is not a short string")
            if "=" in name or "," in name:
                raise ValueError(f"{label}: rate name {_short(name)} holds '=' or ','")
            checked = NUMBER.check(number, f"{label}.{_short(name)}")
            if checked is None or checked < 0:
                raise ValueError(f"{label}.{_short(name)} {_short(number)} is not a number >= 0")
            out[name] = checked
        return out

    def parse(self, text: str, label: str) -> object:
        out: dict[str, object] = {}
        for item in text.split(","):
            name, sep, number = item.strip().partition("=")
            if not sep:
                raise ValueError(f"{label} item {_short(item)} is not name=value")
            out[name] = NUMBER.parse(number, f"{label}.{name}")
        return out

    def to_text(self, value: Any) -> str:
        if not value:
            return ""
        return ",".join(f"{name}={float(number)!r}" for name, number in value.items())


class _Text(_Kind):
    """A string, or none."""

    def check(self, value: object, label: str) -> str | None:
        if value is None or isinstance(value, str):
            return value
        raise ValueError(f"{label} {_short(value)} is not a string")


class _Word(_Text):
    """A string of ``pattern`` (which bounds its alphabet and length), or none."""

    def __init__(self, pattern: str, what: str) -> None:
        self.pattern = re.compile(pattern)
        self.what = what

    def check(self, value: object, label: str) -> str | None:
        text = super().check(value, label)
        if text is not None and not self.pattern.fullmatch(text):
            raise ValueError(f"{label} {_short(text)} is not {self.what}")
        return text


class _WaitFor(_Kind):
    """Whom a node's NCCL rank waits for: ``{"event_id", "comm_hash", "op", "seq", "since",
    "ranks", "nodes"}`` (the communicator, the collective the node's rank is inside or past,
    when the wait began on Fleet's clock, and the ranks and nodes that have not entered it,
    at most :data:`MAX_NAMED` each: empty when none is missing and every rank waits), or
    none. In a push reply ``event_id=…,comm_hash=…,op=…,seq=…,since=…,ranks=3 5,nodes=a b``
    (nodes percent-encoded)."""

    MAX_NAMED = 64
    _TEXT_KEYS = ("event_id", "comm_hash", "op")

    def check(self, value: object, label: str) -> dict[str, Any] | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ValueError(f"{label} is not an object")
        out: dict[str, Any] = {}
        for key in self._TEXT_KEYS:
            text = value.get(key)
            if not isinstance(text, str) or not 0 < len(text) <= 256:
                raise ValueError(f"{label}.{key} {_short(text)} is not a short string")
            out[key] = text
        out["seq"] = COUNT.check(value.get("seq"), f"{label}.seq")
        out["since"] = NUMBER.check(value.get("since"), f"{label}.since")
        if out["seq"] is None or out["since"] is None:
            raise ValueError(f"{label} needs seq and since")
        ranks, nodes = value.get("ranks", []), value.get("nodes", [])
        if not isinstance(ranks, list) or len(ranks) > self.MAX_NAMED:
            raise ValueError(f"{label}.ranks is not a list of at most {self.MAX_NAMED}")
        if not isinstance(nodes, list) or len(nodes) > self.MAX_NAMED:
            raise ValueError(f"{label}.nodes is not a list of at most {self.MAX_NAMED}")
        out["ranks"] = [COUNT.check(r, f"{label}.ranks") for r in ranks]
        if any(r is None for r in out["ranks"]):
            raise ValueError(f"{label}.ranks holds a null")
        for node in nodes:
            if not isinstance(node, str) or not 0 < len(node) <= 256:
                raise ValueError(f"{label}.nodes: {_short(node)} is not a short string")
        out["nodes"] = list(nodes)
        return out

    def parse(self, text: str, label: str) -> object:
        out: dict[str, object] = {}
        for item in text.split(","):
            key, sep, raw = item.strip().partition("=")
            if not sep:
                raise ValueError(f"{label} item {_short(item)} is not name=value")
            if key in ("ranks", "nodes"):
                words = [unquote(w) for w in raw.split(" ") if w]
                out[key] = (
                    [int(w) if w.isdigit() else w for w in words] if key == "ranks" else words
                )
            elif key == "seq":
                out[key] = int(raw) if raw.isdigit() else raw
            elif key == "since":
                out[key] = NUMBER.parse(raw, f"{label}.since")
            else:
                out[key] = unquote(raw)
        return out

    def to_text(self, value: Any) -> str:
        if not value:
            return ""
        words = [f"{key}={quote(str(value[key]), safe='')}" for key in self._TEXT_KEYS]
        words.append(f"seq={int(value['seq'])}")
        words.append(f"since={float(value['since'])!r}")
        words.append("ranks=" + " ".join(str(int(r)) for r in value.get("ranks", ())))
        words.append("nodes=" + " ".join(quote(n, safe="") for n in value.get("nodes", ())))
        return ",".join(words)


UNIT, FLAG, NUMBER, COUNT, TEXT = _Unit(), _Flag(), _Number(), _Count(), _Text()
RATES = _RateMap()
# Fleet's event ids are UUIDs (ingero.schema.events.new_event_id): 36 of these characters.
EVENT_ID = _Word(r"[0-9A-Fa-f-]{1,64}", "an event id (hex digits and '-', at most 64)")
# The NCCL episodes Fleet names a node in, and the op of the collective they are about
# (an NCCL function name, at most MAX_OP_CHARS as its collectives codec bounds it).
NCCL_EPISODE_TYPES = ("collective_hang", "peer_lag")
NCCL_EPISODE_TYPE = _Word("|".join(NCCL_EPISODE_TYPES), "an NCCL episode type")
NCCL_OP = _Word(rf"[A-Za-z0-9_.:-]{{1,{MAX_OP_CHARS}}}", "a collective's op name")
WAIT_FOR = _WaitFor()


def _wire(
    kind: _Kind, push_key: str | None = None, *, optional: bool = False, part: str | None = None
) -> dict[str, Any]:
    """Field metadata: the value's kind, and its gRPC metadata key if push replies carry it;
    ``optional`` push fields are left out of a reply while they have no value (fields added
    after the first three: an older node never sees them, a newer one reads none). Fields
    of one ``part`` (an episode the reply names) are taken together or not at all: one
    that fails its check leaves the part out and the rest of the reply stands (a later
    Fleet's new episode type costs an older node the episode, not its threshold)."""
    return {"kind": kind, "push_key": push_key, "optional": optional, "part": part}


NCCL = "nccl_episode"


@dataclass(frozen=True, kw_only=True)
class ThresholdView:
    """A peer group's threshold as Fleet serves it, in push replies and the API.

    ``threshold`` is None while the group has no quorum (docs/fleet-threshold.md). A push
    reply carries only the fields with a push key; the others are then None. Keyword-only,
    so adding a field never shifts another.
    """

    cluster_id: str | None = field(default=None, metadata=_wire(TEXT))
    group: str | None = field(default=None, metadata=_wire(TEXT))
    threshold: float | None = field(default=None, metadata=_wire(UNIT, "ingero-threshold"))
    median: float | None = field(default=None, metadata=_wire(NUMBER))
    mad: float | None = field(default=None, metadata=_wire(NUMBER))
    quorum_met: bool = field(default=False, metadata=_wire(FLAG, "ingero-quorum-met"))
    panic: bool = field(default=False, metadata=_wire(FLAG, "ingero-panic"))
    active_nodes: int | None = field(default=None, metadata=_wire(COUNT))
    computed_at: float | None = field(default=None, metadata=_wire(NUMBER))
    # Per group: the median of each raw rate (ingero.otlp.health.PEER_RATES) over the active,
    # not stalled nodes that pushed it; a rate is listed only where at least
    # quorum.statistical_min nodes did (docs/fleet-threshold.md, "Peer rates").
    peer_rates: dict[str, float] | None = field(
        default=None, metadata=_wire(RATES, "ingero-peer-rates", optional=True)
    )
    # Per node (push replies, and the API when a node is named): its rate / the peer median.
    rate_ratios: dict[str, float] | None = field(
        default=None, metadata=_wire(RATES, "ingero-rate-ratios", optional=True)
    )
    # Per node: Fleet's open straggler episode of the node, which the node adopts.
    episode_id: str | None = field(
        default=None, metadata=_wire(EVENT_ID, "ingero-episode-id", optional=True, part="episode")
    )
    # Fleet's Unix time (s) as it answered the push, from which the node
    # estimates its clock offset to Fleet (half the round trip bounds the error).
    server_time: float | None = field(
        default=None, metadata=_wire(NUMBER, "ingero-server-time", optional=True)
    )
    # Per node: the entry lag (s, median over the recent collectives) of
    # the node's NCCL rank that Fleet finds consistently late behind its peers; absent while
    # none is. fleet-push counts it as a straggler signal (``peer_lag``).
    peer_lag: float | None = field(
        default=None, metadata=_wire(NUMBER, "ingero-peer-lag", optional=True)
    )
    # Per node: Fleet's open NCCL episode that names a rank of the node (a collective_hang
    # that waits for it, else its peer_lag): its event id, its type and when it began
    # (Fleet's Unix time). fleet-push takes one stack snapshot under that id.
    nccl_episode_id: str | None = field(
        default=None, metadata=_wire(EVENT_ID, "ingero-nccl-episode-id", optional=True, part=NCCL)
    )
    nccl_episode_type: str | None = field(
        default=None,
        metadata=_wire(NCCL_EPISODE_TYPE, "ingero-nccl-episode-type", optional=True, part=NCCL),
    )
    nccl_episode_since: float | None = field(
        default=None, metadata=_wire(NUMBER, "ingero-nccl-episode-since", optional=True, part=NCCL)
    )
    # The collective it is about: a hang's op and sequence number (a lag's op, no seq).
    nccl_episode_op: str | None = field(
        default=None, metadata=_wire(NCCL_OP, "ingero-nccl-episode-op", optional=True, part=NCCL)
    )
    nccl_episode_seq: int | None = field(
        default=None, metadata=_wire(COUNT, "ingero-nccl-episode-seq", optional=True, part=NCCL)
    )
    # Per node: the NCCL collective a rank of the node waits in (entered and returned at
    # enqueue, as real NCCL's calls do) for ranks that have not entered it, or, with no rank
    # named, one every rank of its communicator stopped at. fleet-push then calls its quiet
    # waiting, not a stall (docs/fleet-threshold.md, "Peer lag and hung collectives").
    waiting_for: dict[str, Any] | None = field(
        default=None,
        metadata=_wire(WAIT_FOR, "ingero-waiting-for", optional=True, part="waiting_for"),
    )


def with_fields(view: ThresholdView, **values: Any) -> ThresholdView:
    """A copy of ``view`` with ``values`` set, unchecked, for Fleet's hot path: built
    directly, because dataclasses.replace re-runs __init__ and copy.copy goes through
    __reduce_ex__ (8 and 4 µs, most of an ingest; this is about 1 µs). The view is frozen
    to its users, not to its builder; the caller passes values of the fields' kinds."""
    copy: ThresholdView = object.__new__(ThresholdView)
    copy.__dict__.update(view.__dict__)
    copy.__dict__.update(values)
    return copy


def _header_name(key: str) -> str:
    """``ingero-quorum-met`` -> ``X-Ingero-Quorum-Met``."""
    return "X-" + "-".join(part.capitalize() for part in key.split("-"))


_FIELDS: tuple[Field[Any], ...] = fields(ThresholdView)
# (attribute, gRPC metadata key, HTTP header name, kind) of the fields push replies carry.
_PUSH: tuple[tuple[str, str, str, _Kind], ...] = tuple(
    (f.name, f.metadata["push_key"], _header_name(f.metadata["push_key"]), f.metadata["kind"])
    for f in _FIELDS
    if f.metadata["push_key"]
)
_OPTIONAL: frozenset[str] = frozenset(f.name for f in _FIELDS if f.metadata["optional"])
# attribute -> the part (an episode the reply names) it belongs to, for the fields of one.
_PART: dict[str, str] = {f.name: f.metadata["part"] for f in _FIELDS if f.metadata["part"]}
HEADERS: tuple[str, ...] = tuple(header for _, _, header, _ in _PUSH)


def _sane(kind: _Kind, value: object, label: str) -> bool:
    try:
        kind.check(value, label)
    except ValueError:
        return False
    return True


def _sent(view: ThresholdView) -> list[tuple[str, str, str, _Kind, Any]]:
    """The push fields a reply carries: every one, less optional ones with no value, and
    less a part's field its decoder would refuse (an op a node reported, say)."""
    out = []
    for attr, key, header, kind in _PUSH:
        value = getattr(view, attr)
        if attr in _OPTIONAL and (value is None or value == {} or value == ""):
            continue
        if attr in _PART and not _sane(kind, value, attr):
            continue
        out.append((attr, key, header, kind, value))
    return out


def _default(f: Field[Any]) -> Any:
    assert f.default is not MISSING  # every field has one: a reply may leave any out
    return f.default


def _checked(
    pairs: Iterable[tuple[str, Callable[[], Any]]], rejected: list[str] | None
) -> dict[str, Any]:
    """Each field's value from its reader (which raises ValueError when it is not sane); a
    part with a field that is not sane is left out whole (said in ``rejected``), any
    other field that is not sane raises."""
    values: dict[str, Any] = {}
    failed: set[str] = set()
    for attr, read in pairs:
        try:
            values[attr] = read()
        except ValueError as exc:
            part = _PART.get(attr)
            if part is None:
                raise
            if rejected is not None and part not in failed:  # its first bad field says why
                rejected.append(f"{part} ignored: {exc}")
            failed.add(part)
    for attr in [a for a in values if _PART.get(a) in failed]:
        del values[attr]
    return values


# ---- push replies: HTTP headers and gRPC metadata --------------------------------------


def encode_headers(view: ThresholdView | None) -> list[tuple[str, str]]:
    """The reply headers of an OTLP/HTTP push; none when no data point was accepted."""
    if view is None:
        return []
    return [(header, kind.to_text(value)) for _, _, header, kind, value in _sent(view)]


def encode_metadata(view: ThresholdView | None) -> tuple[tuple[str, str], ...]:
    """The initial metadata of an OTLP/gRPC push reply; none when nothing was accepted."""
    if view is None:
        return ()
    return tuple((key, kind.to_text(value)) for _, key, _, kind, value in _sent(view))


def _from_push(
    found: Mapping[str, tuple[str, str]], rejected: list[str] | None
) -> ThresholdView | None:
    """``found``: attribute -> (text, the name it came under), for the fields present."""
    if not found:
        return None

    def reader(kind: _Kind, text: str, label: str) -> Callable[[], Any]:
        return lambda: kind.from_text(text, label)

    pairs = [(attr, reader(kind, *found[attr])) for attr, _, _, kind in _PUSH if attr in found]
    return ThresholdView(**_checked(pairs, rejected))


def decode_headers(
    headers: Mapping[str, str], rejected: list[str] | None = None
) -> ThresholdView | None:
    """The threshold in a push reply's headers (names case-insensitive); None when absent.

    Raises ValueError when present but not sane; a part (an episode) that is not sane is
    left out instead, and why appended to ``rejected``.
    """
    lower = {name.lower(): value for name, value in headers.items()}
    return _from_push(
        {attr: (lower[h.lower()], h) for attr, _, h, _ in _PUSH if h.lower() in lower}, rejected
    )


def decode_metadata(
    metadata: Iterable[tuple[str, str | bytes]], rejected: list[str] | None = None
) -> ThresholdView | None:
    """The threshold in a gRPC reply's metadata (initial, or trailing from an older Fleet;
    a later value wins); None when absent. Raises ValueError when present but not sane;
    a part that is not sane is left out, as in ``decode_headers``."""
    got = {key: value for key, value in metadata if isinstance(value, str)}
    return _from_push({attr: (got[key], key) for attr, key, _, _ in _PUSH if key in got}, rejected)


# ---- the API: GET /api/v1/threshold ----------------------------------------------------


def encode_json(view: ThresholdView) -> dict[str, object]:
    """The API's answer: every field, none left out (absent values as null; a part's field
    its decoder would refuse as null too)."""
    out: dict[str, object] = {}
    for f in _FIELDS:
        value = getattr(view, f.name)
        sane = f.name not in _PART or _sane(f.metadata["kind"], value, f.name)
        out[f.name] = value if sane else None
    return out


def decode_json(body: object, rejected: list[str] | None = None) -> ThresholdView:
    """The API's answer; a field left out takes its default. ValueError when not sane (a
    part that is not sane is left out, as in ``decode_headers``)."""
    if not isinstance(body, dict):
        raise ValueError("threshold API answer is not a JSON object")

    def reader(f: Field[Any]) -> Callable[[], Any]:
        return lambda: f.metadata["kind"].check(body.get(f.name, _default(f)), f.name)

    return ThresholdView(**_checked([(f.name, reader(f)) for f in _FIELDS], rejected))
