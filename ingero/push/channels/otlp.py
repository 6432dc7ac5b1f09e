"""Events as OTLP logs to Fleet, encoded by ``ingero.otlp.logs``; the push client carries them."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from ingero.otlp.logs import encode_events
from ingero.push.channels.queued import QueuedChannel
from ingero.schema.events import Event

Exporter = Callable[[ExportLogsServiceRequest], None]


# The longest wait between two tries of one event (they start at ``retry_delay``).
MAX_RETRY_DELAY = 30.0


class OtlpLogsChannel(QueuedChannel):
    """``exporter`` raises a retryable ExportError (the OTLP exporter core's verdict) or
    OSError to have an event retried, after a wait growing from ``retry_delay`` to
    MAX_RETRY_DELAY and at least what Fleet asked for; any other error drops it."""

    name = "otlp"

    def __init__(
        self,
        exporter: Exporter,
        resource: Mapping[str, object],
        queue_size: int = 1000,
        retry_delay: float = 1.0,
    ) -> None:
        self._exporter = exporter
        self._resource = dict(resource)
        super().__init__(queue_size, retry_delay, max(retry_delay, MAX_RETRY_DELAY))

    def _deliver(self, event: Event) -> None:
        self._exporter(encode_events([event], self._resource))
