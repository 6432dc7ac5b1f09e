"""The rule table (``rules.yaml``): which signals make which chain, parsed and checked."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

import yaml

from ingero.runtime.errors import ConfigError

SIGNALS: Final = (
    "offcpu",
    "block_io",
    "page_allocs",
    "tcp_retransmits",
    "gpu_throttle",
    "gpu_xid",
    "launch_latency",
    "sync_latency",
    "op_latency",
    "memcpy",
    "alloc_churn",
    "nccl_latency",
    "graph_recapture",
    "peer_lag",
    "throughput_drop",
)


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    prior: float
    fix: str
    cause_any: tuple[str, ...] = ()
    cause_all: tuple[str, ...] = ()
    via_any: tuple[str, ...] = ()
    unless_any: tuple[str, ...] = ()
    effect_any: tuple[str, ...] = ()


_RULE_KEYS: Final = {
    "id",
    "name",
    "prior",
    "fix",
    "cause_any",
    "cause_all",
    "via_any",
    "unless_any",
    "effect_any",
}


def parse_rules(data: Any, origin: str = "rules") -> tuple[Rule, ...]:
    """The rule table from its YAML value; ConfigError naming the rule and key when bad."""
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise ConfigError(f"{origin}: expected a mapping with a 'rules' list")
    rules = []
    seen: set[str] = set()
    for i, item in enumerate(data["rules"]):
        where = f"{origin}: rules[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: expected a mapping")
        unknown = set(item) - _RULE_KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}")
        for key in ("id", "name", "fix"):
            if not isinstance(item.get(key), str) or not item[key].strip():
                raise ConfigError(f"{where}: {key!r} must be a non-empty string")
        where = f"{origin}: rule {item['id']!r}"
        if item["id"] in seen:
            raise ConfigError(f"{where}: duplicate id")
        seen.add(item["id"])
        prior = item.get("prior")
        if not isinstance(prior, int | float) or isinstance(prior, bool) or not 0 < prior <= 1:
            raise ConfigError(f"{where}: 'prior' must be a number in (0, 1]")
        lists: dict[str, tuple[str, ...]] = {}
        for key in ("cause_any", "cause_all", "via_any", "unless_any", "effect_any"):
            value = item.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{where}: {key!r} must be a list of signal names")
            bad = [v for v in value if v not in SIGNALS]
            if bad:
                raise ConfigError(f"{where}: {key!r}: unknown signal {bad[0]!r}")
            lists[key] = tuple(value)
        if not lists["cause_any"] and not lists["cause_all"]:
            raise ConfigError(f"{where}: needs cause_any or cause_all")
        rules.append(
            Rule(
                id=item["id"],
                name=item["name"],
                prior=float(prior),
                fix=" ".join(item["fix"].split()),
                **lists,
            )
        )
    return tuple(rules)


def load_rules() -> tuple[Rule, ...]:
    """The rule table shipped in the package (``ingero/explain/rules.yaml``)."""
    text = resources.files("ingero.explain").joinpath("rules.yaml").read_text()
    return parse_rules(yaml.safe_load(text), "ingero/explain/rules.yaml")
