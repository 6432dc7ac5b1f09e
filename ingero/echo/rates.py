"""GPU rates: the hourly price of each GPU model, for the ``cost`` question.

The table ships in ``ingero/echo/data/gpu_rates.yaml``; ``gpu_rates_file`` lays an operator's
table of the same format over it (or replaces it, in another currency).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ingero.runtime.errors import ConfigError


@dataclass(frozen=True)
class GpuRates:
    """Hourly price per GPU model; models match by case-insensitive substring, longest first."""

    currency: str
    default: float
    models: dict[str, float] = field(default_factory=dict)

    def rate(self, gpu_model: str | None) -> float:
        if gpu_model:
            low = gpu_model.lower()
            for model in sorted(self.models, key=len, reverse=True):
                if model.lower() in low:
                    return self.models[model]
        return self.default

    @classmethod
    def parse(cls, raw: Any, source: str) -> GpuRates:
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: expected a mapping with currency, default, models")
        unknown = set(raw) - {"currency", "default", "models"}
        if unknown:
            raise ConfigError(f"{source}: unknown key {sorted(unknown)[0]!r}")
        currency = raw.get("currency", "USD")
        default = raw.get("default", 0.0)
        models = raw.get("models") or {}
        if not isinstance(currency, str) or not isinstance(models, dict):
            raise ConfigError(f"{source}: currency must be a string and models a mapping")
        for key, value in [("default", default), *models.items()]:
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"{source}: rate {key} must be a number >= 0, got {value!r}")
        return cls(currency, float(default), {str(k): float(v) for k, v in models.items()})

    @classmethod
    def load(cls, override: str | None = None) -> GpuRates:
        """The shipped table, with ``override`` (a file of the same format) laid over it.

        An override in another currency replaces the table instead: mixing its prices with
        the shipped ones would label dollars as euros."""
        shipped = yaml.safe_load(
            resources.files("ingero.echo").joinpath("data/gpu_rates.yaml").read_text()
        )
        base = cls.parse(shipped, "gpu_rates.yaml")
        if override is None:
            return base
        try:
            raw = yaml.safe_load(Path(override).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{override}: cannot read GPU rates: {exc}") from None
        mine = cls.parse(raw, override)
        if mine.currency != base.currency:
            return mine
        return cls(
            base.currency,
            mine.default if "default" in raw else base.default,
            {**base.models, **mine.models},
        )
