"""Conversions between plain Python values and OTLP ``AnyValue``/``KeyValue`` attributes."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from ingero.otlp.limits import MAX_JSON_DEPTH, shown

M = TypeVar("M", bound=Message)


class OtlpDecodeError(ValueError):
    """A request body that is not a valid OTLP message of the expected kind."""


def set_any(target: AnyValue, value: Any) -> None:
    """Fill ``target`` from a JSON-like value (bool before int: bool is an int in Python)."""
    if isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int):
        target.int_value = value
    elif isinstance(value, float):
        target.double_value = value
    elif isinstance(value, str):
        target.string_value = value
    elif isinstance(value, bytes):
        target.bytes_value = value
    elif isinstance(value, Mapping):
        kvlist = target.kvlist_value
        for key, item in value.items():
            if item is not None:
                kv = kvlist.values.add()
                kv.key = str(key)
                set_any(kv.value, item)
        target.kvlist_value.SetInParent()
    elif isinstance(value, list | tuple):
        array = target.array_value
        for item in value:
            set_any(array.values.add(), item)
        target.array_value.SetInParent()
    else:
        target.string_value = str(value)


def add_attributes(target: Any, attributes: Mapping[str, Any]) -> None:
    """Append ``attributes`` (skipping None) to a repeated ``KeyValue`` field."""
    for key, value in attributes.items():
        if value is not None:
            kv = target.add()
            kv.key = key
            set_any(kv.value, value)


def any_to_python(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "kvlist_value":
        return {kv.key: any_to_python(kv.value) for kv in value.kvlist_value.values}
    if kind == "array_value":
        return _array(value.array_value.values)
    return getattr(value, kind)


def _array(values: Iterable[AnyValue]) -> list[Any]:
    """An array's items; ints and strings without a oneof lookup (a oneof member reads as
    zero or empty unless it is the one set, so a non-zero int or a non-empty string is the
    set kind): NCCL reports carry arrays of a few hundred of them in every push."""
    return [v.int_value or v.string_value or any_to_python(v) for v in values]


def attributes_dict(attributes: Iterable[KeyValue]) -> dict[str, Any]:
    """Attributes as a dict; scalars inline, since this runs for every ingested record."""
    out: dict[str, Any] = {}
    for kv in attributes:
        value = kv.value
        text = value.string_value  # most attributes are strings: one call, no oneof lookup
        if text:
            out[kv.key] = text
            continue
        # Then doubles (timestamp, score, threshold) and ints (rank, counts): a oneof member
        # reads as zero unless it is the one set, so a non-zero (or NaN) one is the set kind
        # and needs no oneof lookup either; zeros, bools and the rest take WhichOneof below.
        number = value.double_value
        if number:
            out[kv.key] = number
            continue
        integer = value.int_value
        if integer:
            out[kv.key] = integer
            continue
        kind = value.WhichOneof("value")
        if kind == "string_value":
            out[kv.key] = text
        elif kind is None:
            out[kv.key] = None
        elif kind[0] in "ibd":  # int_value, bool_value, double_value, bytes_value
            out[kv.key] = getattr(value, kind)
        else:
            out[kv.key] = any_to_python(value)
    return out


def parse_protobuf(body: bytes, message_cls: type[M]) -> M:
    message = message_cls()
    try:
        message.ParseFromString(body)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise OtlpDecodeError(f"malformed protobuf: {exc}") from None
    return message


def _hex_ids_to_base64(node: Any, depth: int = 1) -> None:
    """OTLP/JSON writes traceId/spanId as hex where proto3 JSON expects base64.

    The walk also enforces MAX_JSON_DEPTH (``depth`` is ``node``'s nesting level), so the
    recursions after it (this one, protobuf's ParseDict) stay shallow.
    """
    if depth > MAX_JSON_DEPTH:
        raise OtlpDecodeError(f"malformed JSON: {_TOO_DEEP}")
    if isinstance(node, dict):
        for key, item in node.items():
            if key in ("traceId", "spanId", "trace_id", "span_id") and isinstance(item, str):
                try:
                    node[key] = base64.b64encode(bytes.fromhex(item)).decode()
                except ValueError:
                    raise OtlpDecodeError(f"{key} must be hex, got {shown(item)}") from None
            elif isinstance(item, dict | list):
                _hex_ids_to_base64(item, depth + 1)
    elif isinstance(node, list):
        for item in node:
            if isinstance(item, dict | list):
                _hex_ids_to_base64(item, depth + 1)


_TOO_DEEP = f"nested deeper than {MAX_JSON_DEPTH} levels"


def load_json(data: bytes | str) -> Any:
    """``json.loads`` for what came over the network: every bad input is ValueError.

    json's C scanner gives up on nesting at the interpreter's recursion limit (~1000
    levels) with RecursionError, which callers catching ValueError would let through as
    an internal error; such a document is deeper than MAX_JSON_DEPTH in any case.
    """
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(_TOO_DEEP) from None


def parse_json(body: bytes, message_cls: type[M]) -> M:
    """Parse the OTLP/JSON encoding; unknown fields are ignored as the OTLP spec requires.

    Anything that is not such a body, nested deeper than MAX_JSON_DEPTH included, is
    OtlpDecodeError.
    """
    try:
        data = load_json(body)
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError among them
        raise OtlpDecodeError(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise OtlpDecodeError("malformed JSON: the body must be a JSON object")
    _hex_ids_to_base64(data)
    message = message_cls()
    try:
        json_format.ParseDict(data, message, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise OtlpDecodeError(f"invalid OTLP JSON: {exc}") from None
    return message


def to_json(message: Message) -> bytes:
    return json_format.MessageToJson(message, indent=None).encode()
