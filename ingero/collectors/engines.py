"""Inference servers on this node: recognised from their command lines, measured from the
Prometheus ``/metrics`` they serve.

Engines and what is read of them (flag names from each engine's own argument parser):

- vLLM: ``vllm serve MODEL`` or ``python -m vllm.entrypoints.openai.api_server``;
  ``--model``, ``--served-model-name``, ``--host``, ``--port`` (8000), ``--kv-transfer-config``
  (JSON; ``kv_role`` ``kv_producer`` is a prefill instance, ``kv_consumer`` a decode one).
- SGLang: ``python -m sglang.launch_server``; ``--model-path``/``--model``,
  ``--served-model-name``, ``--port`` (30000), ``--disaggregation-mode prefill|decode``;
  ``/metrics`` only with ``--enable-metrics``. ``sglang_router.launch_router`` is a router.
- TGI: ``text-generation-launcher`` (``--model-id``, ``--port`` 3000, ``--prometheus-port``),
  ``text-generation-router`` (a router), ``text-generation-server serve MODEL`` (a shard).
- Triton: ``tritonserver`` (``--model-repository``, ``--load-model``, ``--metrics-port``
  8002, ``--allow-metrics``); TensorRT-LLM where a ``--backend-config`` names
  ``tensorrtllm``, or its ``/metrics`` holds ``nv_trt_llm_`` families.
- TensorRT-LLM: ``trtllm-serve [serve] MODEL`` (``--host``, ``--port`` 8000; Prometheus text at
  ``/prometheus/metrics``); ``trtllm-serve disaggregated`` is a router.

The proc root is injectable (as in :mod:`ingero.collectors.procfs`): tests and the benchmark
read fixture trees. Unknown flags are ignored; a command line is read bounded.
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ingero.runtime.procstat import stat_fields

ENGINES: tuple[str, ...] = ("vllm", "sglang", "tgi", "triton", "trtllm")
ROLES: tuple[str, ...] = ("prefill", "decode", "mixed", "router")

# A command line is read up to this many bytes and arguments: enough for any real server
# (Triton's longest are a few KiB), bounded for a process that forged a huge one.
MAX_CMDLINE_BYTES = 64 * 1024
MAX_ARGS = 1024
# Model, service and host names kept at most this long (the node DB row stays small).
MAX_NAME_CHARS = 256


@dataclass(frozen=True)
class Engine:
    """One recognised inference server process."""

    engine: str  # one of ENGINES
    model: str | None = None
    role: str | None = None  # one of ROLES; None: not said
    metrics_url: str | None = None  # None: it serves no Prometheus text that we know of
    pid: int | None = None


def _basename(arg: str) -> str:
    return arg.rsplit("/", 1)[-1]


def _flags(args: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """``--name value`` and ``--name=value`` (last one wins, as argparse does) and the
    positionals. A flag followed by another flag or by nothing is a switch ("")."""
    flags: dict[str, str] = {}
    positional: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg[2:].partition("=")
            name = name.replace("_", "-")  # trtllm-serve and Triton spell both ways
            if not eq:
                nxt = args[i + 1] if i + 1 < len(args) else None
                if nxt is not None and not nxt.startswith("--"):
                    value, i = nxt, i + 1
            flags[name] = value
        elif arg.startswith("-") and len(arg) > 1:
            pass  # short options (-m handled by the caller; -p, -h …) say nothing here
        else:
            positional.append(arg)
        i += 1
    return flags, positional


def _short(value: str | None) -> str | None:
    if not value:
        return None
    value = value.strip()
    return value[:MAX_NAME_CHARS] if value else None


def _port(flags: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = flags.get(name)
    if value is None:
        return default
    if value.isascii() and value.isdigit() and 0 < int(value) < 65536:
        return int(value)
    return None  # a port we cannot read: no URL rather than a wrong one


def _url(host: str | None, port: int | None, path: str = "/metrics") -> str | None:
    if port is None:
        return None
    host = (host or "127.0.0.1").strip()
    # Bound to every address: fetched over loopback (fleet-push runs on the same node).
    if host in ("", "0.0.0.0", "::", "[::]", "localhost"):
        host = "127.0.0.1"
    if not all(c.isalnum() or c in ".-:[]" for c in host) or len(host) > MAX_NAME_CHARS:
        return None
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


def _entry(argv: Sequence[str]) -> tuple[str, list[str]]:
    """The program a command line runs (script, ``-m`` module or executable) and its args.

    ``python3 /venv/bin/vllm serve …`` (a console script), ``python -m sglang.launch_server
    …`` and ``/usr/bin/tritonserver …`` all name their program here.
    """
    if not argv:
        return "", []
    first = _basename(argv[0])
    if first.startswith("python") or first in ("pypy3", "uv", "torchrun"):
        i = 1
        while i < len(argv):
            arg = argv[i]
            if arg == "-m" and i + 1 < len(argv):
                return argv[i + 1], list(argv[i + 2 :])
            if arg.startswith("-m") and len(arg) > 2:
                return arg[2:], list(argv[i + 1 :])
            if arg in ("-c",):
                return "", []
            if not arg.startswith("-"):
                return _basename(arg), list(argv[i + 1 :])
            i += 1
        return "", []
    return first, list(argv[1:])


def _kv_role(config: str | None) -> str | None:
    """vLLM's ``--kv-transfer-config`` JSON: its ``kv_role`` as a disaggregation role."""
    if not config:
        return None
    try:
        value = json.loads(config[:MAX_CMDLINE_BYTES])
    except ValueError:
        return None
    role = value.get("kv_role") if isinstance(value, dict) else None
    return {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "mixed"}.get(
        role if isinstance(role, str) else ""
    )


def _vllm(args: list[str]) -> Engine:
    flags, positional = _flags(args)
    if positional and positional[0] == "serve":
        positional = positional[1:]
    model = flags.get("model") or (positional[0] if positional else None)
    served = flags.get("served-model-name")
    return Engine(
        "vllm",
        model=_short(served or model),
        role=_kv_role(flags.get("kv-transfer-config")) or "mixed",
        metrics_url=_url(flags.get("host"), _port(flags, "port", 8000)),
    )


def _sglang(args: list[str]) -> Engine:
    flags, _ = _flags(args)
    model = flags.get("served-model-name") or flags.get("model-path") or flags.get("model")
    mode = flags.get("disaggregation-mode")
    metrics = "enable-metrics" in flags
    return Engine(
        "sglang",
        model=_short(model),
        role=mode if mode in ("prefill", "decode") else "mixed",
        metrics_url=_url(flags.get("host"), _port(flags, "port", 30000)) if metrics else None,
    )


def _sglang_router(args: list[str]) -> Engine:
    flags, _ = _flags(args)
    port = _port(flags, "prometheus-port", None)
    return Engine(
        "sglang",
        role="router",
        metrics_url=_url(flags.get("prometheus-host"), port) if port else None,
    )


def _tgi(args: list[str], role: str | None) -> Engine:
    flags, positional = _flags(args)
    if role is None and positional and positional[0] == "serve":  # text-generation-server
        return Engine("tgi", model=_short(positional[1] if len(positional) > 1 else None))
    port = _port(flags, "prometheus-port", None) or _port(flags, "port", 3000)
    return Engine(
        "tgi",
        model=_short(flags.get("served-model-name") or flags.get("model-id")),
        role=role,
        metrics_url=_url(flags.get("hostname"), port),
    )


def _triton(args: list[str]) -> Engine:
    flags, _ = _flags(args)
    backend = flags.get("backend-config", "")
    engine = "trtllm" if backend.split(",", 1)[0] == "tensorrtllm" else "triton"
    repo = flags.get("model-repository") or flags.get("model-store")
    model = flags.get("load-model") or (_basename(repo.rstrip("/")) if repo else None)
    metrics = flags.get("allow-metrics", "true").lower() not in ("false", "0", "no")
    return Engine(
        engine,
        model=_short(model),
        metrics_url=_url(None, _port(flags, "metrics-port", 8002)) if metrics else None,
    )


def _trtllm(args: list[str]) -> Engine:
    flags, positional = _flags(args)
    if positional and positional[0] in ("disaggregated",):
        return Engine("trtllm", role="router")
    if positional and positional[0] in ("serve", "disaggregated_mpi_worker"):
        positional = positional[1:]
    # A disaggregated worker says its part (--server_role context|generation).
    role = {"context": "prefill", "generation": "decode"}.get(flags.get("server-role", "").lower())
    return Engine(
        "trtllm",
        model=_short(flags.get("served-model-name") or (positional[0] if positional else None)),
        role=role or "mixed",
        metrics_url=_url(flags.get("host"), _port(flags, "port", 8000), "/prometheus/metrics"),
    )


def recognise(argv: Sequence[str]) -> Engine | None:
    """The inference server a command line runs, or None for any other program."""
    argv = list(argv[:MAX_ARGS])
    program, args = _entry(argv)
    if program in ("vllm", "vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"):
        if program == "vllm" and not (args and args[0] == "serve"):
            return None  # vllm bench, vllm chat …: clients, not servers
        return _vllm(args)
    if program in ("sglang.launch_server", "sglang"):
        if program == "sglang" and not (args and args[0] == "serve"):
            return None
        return _sglang(args[1:] if program == "sglang" else args)
    if program in ("sglang_router.launch_router", "sglang-router"):
        return _sglang_router(args)
    if program == "text-generation-launcher":
        return _tgi(args, "mixed")
    if program == "text-generation-router":
        return _tgi(args, "router")
    if program == "text-generation-server":
        return _tgi(args, None)
    if program == "tritonserver":
        return _triton(args)
    if program in ("trtllm-serve", "tensorrt_llm.commands.serve"):
        return _trtllm(args)
    return None


def read_cmdline(proc_root: Path, pid: int) -> list[str] | None:
    """A process's argv from ``<proc_root>/<pid>/cmdline`` (bounded), None when gone."""
    try:
        with open(proc_root / str(pid) / "cmdline", "rb") as f:
            raw = f.read(MAX_CMDLINE_BYTES)
    except OSError:
        return None
    if not raw:
        return None  # a kernel thread, or a zombie
    return raw.rstrip(b"\0").decode("utf-8", "replace").split("\0")


def scan(proc_root: Path = Path("/proc")) -> list[Engine]:
    """Every inference server under ``proc_root``, by pid."""
    return Scanner(proc_root).scan()


def read_ppid(proc_root: Path, pid: int) -> int | None:
    """The parent pid from ``<proc_root>/<pid>/stat`` (after the parenthesised command name,
    which may itself hold spaces and parentheses), None when unreadable."""
    fields = stat_fields(proc_root / str(pid) / "stat") or []
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


class Scanner:
    """:func:`scan` that reads a process's command line once: each push interval lists the
    node's processes, and only those new since the last scan are read and recognised. A pid
    reused by another process has a new /proc entry (a new change time): read again. The
    parent of each process is kept too, so a server's workers (vLLM's engine core, tensor
    parallel ranks: child processes with other command lines) count as the server's."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root
        self.known: dict[int, tuple[int, Engine | None]] = {}
        self.parents: dict[int, int | None] = {}

    def tree(self, pid: int) -> frozenset[int]:
        """``pid`` and its descendants, as of the last scan."""
        children: dict[int, list[int]] = {}
        for child, parent in self.parents.items():
            if parent is not None:
                children.setdefault(parent, []).append(child)
        out, todo = {pid}, [pid]
        while todo:
            for child in children.get(todo.pop(), ()):
                if child not in out:
                    out.add(child)
                    todo.append(child)
        return frozenset(out)

    def scan(self) -> list[Engine]:
        try:
            entries = os.listdir(self.proc_root)
        except OSError:
            return []
        known: dict[int, tuple[int, Engine | None]] = {}
        for name in entries:
            if not name.isdigit():
                continue
            pid = int(name)
            try:
                stamp = os.stat(self.proc_root / name).st_ctime_ns
            except OSError:
                continue  # exited between the listing and now
            cached = self.known.get(pid)
            if cached is not None and cached[0] == stamp:
                known[pid] = cached
                continue
            argv = read_cmdline(self.proc_root, pid)
            if argv is None:
                continue  # a kernel thread or a zombie now; looked at again next scan
            self.parents[pid] = read_ppid(self.proc_root, pid)
            engine = recognise(argv)
            known[pid] = (
                stamp,
                Engine(engine.engine, engine.model, engine.role, engine.metrics_url, pid)
                if engine is not None
                else None,
            )
        self.known = known
        self.parents = {pid: ppid for pid, ppid in self.parents.items() if pid in known}
        return [e for _, (_, e) in sorted(known.items()) if e is not None]


# ---- /metrics ---------------------------------------------------------------------------


class MetricsError(Exception):
    """A /metrics endpoint that could not be read or parsed (one line, for the log)."""


# /metrics is read up to this many bytes: a real engine's text is tens of KiB (vLLM with many
# LoRA adapters a few hundred); more is refused, not parsed.
MAX_METRICS_BYTES = 4 * 1024 * 1024


def fetch(url: str, timeout_s: float, max_bytes: int = MAX_METRICS_BYTES) -> str:
    """The text at ``url``, read within ``timeout_s`` overall (a server that trickles bytes
    cannot hold the caller longer) and at most ``max_bytes``."""
    deadline = time.monotonic() + timeout_s
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            chunks: list[bytes] = []
            size = 0
            while True:
                if time.monotonic() > deadline:
                    raise MetricsError(f"{url}: no complete answer within {timeout_s:g} s")
                chunk = resp.read(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > max_bytes:
                    raise MetricsError(f"{url}: more than {max_bytes} bytes; not read")
                chunks.append(chunk)
    except MetricsError:
        raise
    except (OSError, urllib.error.URLError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        if isinstance(reason, TimeoutError):
            raise MetricsError(f"{url}: no complete answer within {timeout_s:g} s") from None
        raise MetricsError(f"{url}: {reason}") from None
    return b"".join(chunks).decode("utf-8", "replace")


@dataclass(frozen=True)
class Totals:
    """A histogram's (or a counter pair's) cumulative sum and count."""

    total: float = 0.0
    count: float = 0.0


@dataclass(frozen=True)
class Reading:
    """What one /metrics text says, cumulative since the engine started."""

    # Per-output-token latency (s): vLLM/SGLang/TRT-LLM inter-token (or time per output
    # token) histograms, TGI's mean time per token.
    token_latency: Totals | None = None
    # Forward steps by phase (s): TGI's batch forward by method; Triton's executions.
    steps: dict[str, Totals] = field(default_factory=dict)
    generated_tokens: float | None = None
    model: str | None = None
    trtllm: bool = False  # Triton serving through the TensorRT-LLM backend


# Per engine family: the histograms of per-token latency (first present wins), the counter
# of generated tokens, and the label that names the model.
_TOKEN_LATENCY = {
    "vllm": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "sglang": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    "tgi": ("tgi_request_mean_time_per_token_duration",),
    "trtllm": (
        "trtllm_time_per_output_token_seconds",
        "trtllm:time_per_output_token_seconds",
    ),
    "triton": (),
}
_TOKENS = {
    "vllm": "vllm:generation_tokens",
    "sglang": "sglang:generation_tokens",
    "tgi": "tgi_request_generated_tokens",
    "trtllm": "trtllm_generation_tokens",
}
_MODEL_LABELS = ("model_name", "model", "served_model_name")


def parse(text: str, engine: str) -> Reading:
    """One /metrics text of an ``engine``; MetricsError where it is not Prometheus text."""
    latency_names = _TOKEN_LATENCY.get(engine, ())
    latency: dict[str, Totals] = {}
    steps: dict[str, list[float]] = {}
    tokens: float | None = None
    model: str | None = None
    trtllm = False
    try:
        for family in text_string_to_metric_families(text):
            name = family.name
            if name.startswith("nv_trt_llm_"):
                trtllm = True
            if name in latency_names:
                total, count = _sum_count(family.samples, name)
                latency[name] = Totals(total, count)
                model = model or _label(family.samples)
            elif name == _TOKENS.get(engine):
                tokens = sum(
                    s.value for s in family.samples if s.name in (name + "_total", name + "_sum")
                )
            elif engine == "tgi" and name == "tgi_batch_forward_duration":
                for s in family.samples:
                    phase = s.labels.get("method")
                    if phase in ("prefill", "decode") and s.name.endswith(("_sum", "_count")):
                        slot = steps.setdefault(phase, [0.0, 0.0])
                        slot[0 if s.name.endswith("_sum") else 1] += s.value
            elif name in ("nv_inference_compute_infer_duration_us", "nv_inference_exec_count"):
                slot = steps.setdefault("mixed", [0.0, 0.0])
                value = sum(s.value for s in family.samples)
                if name.endswith("_us"):
                    slot[0] += value / 1e6
                else:
                    slot[1] += value
                model = model or _label(family.samples)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise MetricsError(f"not Prometheus text: {str(exc)[:200]}") from None
    chosen = next((latency[n] for n in latency_names if n in latency), None)
    for name, (total, count) in steps.items():
        if not (math.isfinite(total) and math.isfinite(count)):
            raise MetricsError(f"non-finite {name} step totals")
    return Reading(
        token_latency=chosen,
        steps={k: Totals(v[0], v[1]) for k, v in steps.items()},
        generated_tokens=tokens,
        model=_short(model),
        trtllm=trtllm,
    )


def _sum_count(samples: Sequence[object], name: str) -> tuple[float, float]:
    total = count = 0.0
    for s in samples:
        sample_name = getattr(s, "name", "")
        value = float(getattr(s, "value", 0.0))
        if sample_name == name + "_sum":
            total += value
        elif sample_name == name + "_count":
            count += value
    return total, count


def _label(samples: Sequence[object]) -> str | None:
    for s in samples:
        labels = getattr(s, "labels", {})
        for key in _MODEL_LABELS:
            if labels.get(key):
                return str(labels[key])
    return None


@dataclass(frozen=True)
class Rates:
    """One engine's figures over one interval (between two readings)."""

    token_latency_s: float | None = None  # mean per-output-token latency
    step_latency_s: dict[str, float] = field(default_factory=dict)  # mean, by phase
    tokens_per_s: float | None = None  # tokens generated per wall second (load-dependent)

    @property
    def token_rate(self) -> float | None:
        """Tokens per second of one sequence (1 / per-token latency): how fast the replica
        serves a request, not how many it is sent."""
        lat = self.token_latency_s
        return 1.0 / lat if lat else None

    @property
    def step_rate(self) -> float | None:
        """Forward steps per second of step time (1 / mean step latency, decode first)."""
        lat = self.step_latency_s.get("decode") or self.step_latency_s.get("mixed")
        return 1.0 / lat if lat else None


def _mean(previous: Totals | None, current: Totals | None) -> float | None:
    """Mean over the interval; None without new observations or after a counter reset."""
    if previous is None or current is None:
        return None
    dcount, dtotal = current.count - previous.count, current.total - previous.total
    if dcount <= 0 or dtotal <= 0 or not math.isfinite(dtotal / dcount):
        return None
    return dtotal / dcount


def rates(previous: Reading, current: Reading, seconds: float) -> Rates:
    steps = {
        phase: mean
        for phase, totals in current.steps.items()
        if (mean := _mean(previous.steps.get(phase), totals)) is not None
    }
    tokens = None
    if previous.generated_tokens is not None and current.generated_tokens is not None:
        delta = current.generated_tokens - previous.generated_tokens
        tokens = delta / seconds if seconds > 0 and delta >= 0 else None
    return Rates(_mean(previous.token_latency, current.token_latency), steps, tokens)


def unique(engines: Sequence[Engine]) -> Iterator[Engine]:
    """One engine per metrics URL (TGI's launcher and router, a server's worker processes
    that share their parent's command line), the lowest pid first."""
    seen: set[str] = set()
    for e in sorted(engines, key=lambda e: e.pid or 0):
        if e.metrics_url is not None:
            if e.metrics_url in seen:
                continue
            seen.add(e.metrics_url)
        yield e
