"""OpenTelemetry semantic-convention resource attributes on everything ingero sends over OTLP.

Names from the OpenTelemetry semantic conventions (package opentelemetry-semantic-conventions:
``opentelemetry.semconv.attributes.service_attributes`` for ``service.*``,
``_incubating.attributes.cloud_attributes.CLOUD_PROVIDER``, ``…hw_attributes.HW_MODEL``). They
are written beside ingero's own contract names (``ingero.provider``, ``ingero.gpu.model``),
never instead of them, so receivers built for the old names keep working.
"""

from __future__ import annotations

from ingero import __version__

SERVICE_NAME = "service.name"
SERVICE_VERSION = "service.version"
SERVICE_INSTANCE_ID = "service.instance.id"
CLOUD_PROVIDER = "cloud.provider"
HW_MODEL = "hw.model"

# service.name of each sender (OTel: a logical service, the same for every instance).
PUSH_SERVICE = "ingero-push"
FLEET_SERVICE = "ingero-fleet"


def service_attributes(name: str, instance_id: str) -> dict[str, object]:
    """``service.name``/``service.version``/``service.instance.id`` of one sending process.

    ``instance_id`` must be stable for the sender (fleet-push: its node id; Fleet: its host
    and API address) so a backend does not see a new service instance after each restart.
    """
    return {SERVICE_NAME: name, SERVICE_VERSION: __version__, SERVICE_INSTANCE_ID: instance_id}
