"""Inference servers from command lines and /metrics texts (ingero.collectors.engines).

Command lines as each engine's launcher and docs spell them (flags from their argument
parsers); /metrics texts in tests/fixtures/engines are shaped on each engine's own metric
definitions. The parser is fuzzed: any argv gives an Engine or None, never an exception.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingero.collectors import engines as ce
from ingero.collectors.engines import Engine, MetricsError, Reading, Totals, parse, recognise

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "engines"
PY = "/opt/venv/bin/python3"

CMDLINES: list[tuple[list[str], Engine | None]] = [
    (
        [PY, "/opt/venv/bin/vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8001"],
        Engine(
            "vllm", "meta-llama/Llama-3.1-8B-Instruct", "mixed", "http://127.0.0.1:8001/metrics"
        ),
    ),
    (
        [
            PY,
            "/opt/venv/bin/vllm",
            "serve",
            "/models/llama",
            "--served-model-name",
            "llama",
            "--host",
            "0.0.0.0",
            "--kv-transfer-config",
            '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}',
        ],
        Engine("vllm", "llama", "prefill", "http://127.0.0.1:8000/metrics"),
    ),
    (
        [
            "python3",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model=mistralai/Mistral-7B",
            "--port=9000",
            "--kv-transfer-config",
            '{"kv_role":"kv_consumer"}',
        ],
        Engine("vllm", "mistralai/Mistral-7B", "decode", "http://127.0.0.1:9000/metrics"),
    ),
    ([PY, "/opt/venv/bin/vllm", "bench", "serve", "--model", "x"], None),  # a client
    (
        [
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "Qwen/Qwen2-7B-Instruct",
            "--port",
            "30001",
            "--disaggregation-mode",
            "decode",
            "--enable-metrics",
        ],
        Engine("sglang", "Qwen/Qwen2-7B-Instruct", "decode", "http://127.0.0.1:30001/metrics"),
    ),
    (  # no --enable-metrics: SGLang serves no /metrics
        ["python", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "8"],
        Engine("sglang", "m", "mixed", None),
    ),
    (
        ["python3", "-m", "sglang_router.launch_router", "--worker-urls", "http://a:1"],
        Engine("sglang", None, "router", None),
    ),
    (
        [
            "text-generation-launcher",
            "--model-id",
            "bigscience/bloom-560m",
            "--port",
            "8080",
            "--prometheus-port",
            "9001",
        ],
        Engine("tgi", "bigscience/bloom-560m", "mixed", "http://127.0.0.1:9001/metrics"),
    ),
    (
        ["/usr/local/bin/text-generation-router", "--port", "3000", "--hostname", "10.0.0.5"],
        Engine("tgi", None, "router", "http://10.0.0.5:3000/metrics"),
    ),
    (
        ["/opt/conda/bin/python", "/opt/conda/bin/text-generation-server", "serve", "gpt2"],
        Engine("tgi", "gpt2", None, None),
    ),
    (
        ["/opt/tritonserver/bin/tritonserver", "--model-repository=/models/ensemble"],
        Engine("triton", "ensemble", None, "http://127.0.0.1:8002/metrics"),
    ),
    (
        [
            "tritonserver",
            "--model-repository",
            "/models",
            "--load-model",
            "llama",
            "--backend-config=tensorrtllm,decoupled=true",
            "--metrics-port",
            "9102",
        ],
        Engine("trtllm", "llama", None, "http://127.0.0.1:9102/metrics"),
    ),
    (
        ["tritonserver", "--model-repository=/m", "--allow-metrics=false"],
        Engine("triton", "m", None, None),
    ),
    (
        [PY, "/opt/venv/bin/trtllm-serve", "nvidia/Llama-3.1-8B-FP8", "--port", "8005"],
        Engine(
            "trtllm",
            "nvidia/Llama-3.1-8B-FP8",
            "mixed",
            "http://127.0.0.1:8005/prometheus/metrics",
        ),
    ),
    (
        ["trtllm-serve", "serve", "m", "--host", "::1", "--server_role", "generation"],
        Engine("trtllm", "m", "decode", "http://[::1]:8000/prometheus/metrics"),
    ),
    (["trtllm-serve", "disaggregated", "-c", "disagg.yaml"], Engine("trtllm", None, "router")),
    (  # unknown flags, a bad port: still vLLM, with no URL rather than a wrong one
        [PY, "/v/bin/vllm", "serve", "m", "--no-such-flag", "--port", "http", "-x", "--x=1"],
        Engine("vllm", "m", "mixed", None),
    ),
    (["python3", "train.py", "--model", "llama"], None),
    (["/usr/bin/bash", "-c", "vllm serve m"], None),
    ([], None),
]


@pytest.mark.parametrize(("argv", "expected"), CMDLINES, ids=lambda v: str(v)[:60])
def test_recognise(argv: list[str], expected: Engine | None) -> None:
    assert recognise(argv) == expected


def test_scan_reads_an_injected_proc_root(tmp_path: Path) -> None:
    for pid, argv in ((17, [PY, "/v/bin/vllm", "serve", "m"]), (18, ["bash"]), (19, [])):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv))
    (tmp_path / "self").mkdir()
    (tmp_path / "20").mkdir()  # gone between the listing and the read: no cmdline
    assert ce.scan(tmp_path) == [Engine("vllm", "m", "mixed", "http://127.0.0.1:8000/metrics", 17)]
    assert ce.scan(tmp_path / "missing") == []


def test_a_forged_huge_cmdline_is_read_bounded(tmp_path: Path) -> None:
    (tmp_path / "5").mkdir()
    argv = [PY, "/v/bin/vllm", "serve", "m", *(["--x", "y" * 100] * 10_000)]
    (tmp_path / "5" / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv))
    read = ce.read_cmdline(tmp_path, 5)
    assert read is not None and sum(len(a) + 1 for a in read) <= ce.MAX_CMDLINE_BYTES + 1
    assert ce.scan(tmp_path)[0].engine == "vllm"


READINGS = {
    "vllm": Reading(Totals(304.8, 20320.0), {}, 20480.0, "llama"),
    "sglang": Reading(Totals(595.2, 39680.0), {}, 40000.0, "Qwen/Qwen2-7B-Instruct"),
    "tgi": Reading(
        Totals(2.64, 120.0),
        {"prefill": Totals(4.8, 120.0), "decode": Totals(280.0, 14000.0)},
        14100.0,
        None,
    ),
    "triton": Reading(None, {"mixed": Totals(125.0, 5000.0)}, None, "tensorrt_llm", True),
    "trtllm": Reading(Totals(0.512, 64.0), {}, None, "nvidia/Llama-3.1-8B-Instruct-FP8"),
}


@pytest.mark.parametrize("engine", sorted(READINGS))
def test_parse_captured_metrics(engine: str) -> None:
    assert parse((FIXTURES / f"{engine}.txt").read_text(), engine) == READINGS[engine]


def test_rates_between_two_readings() -> None:
    before = Reading(Totals(10.0, 1000.0), {"decode": Totals(2.0, 100.0)}, 1000.0)
    after = Reading(Totals(13.0, 1100.0), {"decode": Totals(4.5, 200.0)}, 1100.0)
    r = ce.rates(before, after, 2.0)
    assert r.token_latency_s == pytest.approx(0.03)
    assert r.token_rate == pytest.approx(1 / 0.03)
    assert r.step_latency_s == {"decode": pytest.approx(0.025)}
    assert r.step_rate == pytest.approx(40.0)
    assert r.tokens_per_s == pytest.approx(50.0)
    # Nothing served meanwhile says nothing (not 0); a restarted engine's counters went back.
    assert ce.rates(after, after, 2.0).token_rate is None
    assert ce.rates(after, before, 2.0) == ce.Rates()


@pytest.mark.parametrize(
    "text",
    [
        "<html>not metrics {{{ 1 2 3",
        'vllm:inter_token_latency_seconds_sum{model_name="x" 1',
        'vllm:inter_token_latency_seconds_sum{model_name="x"} fast\n',
    ],
)
def test_garbage_metrics_is_one_clear_error(text: str) -> None:
    with pytest.raises(MetricsError, match="not Prometheus text"):
        parse(text, "vllm")


def test_nonfinite_totals_are_refused() -> None:
    text = '# TYPE nv_inference_exec_count counter\nnv_inference_exec_count{model="m"} +Inf\n'
    with pytest.raises(MetricsError, match="non-finite"):
        parse(text, "triton")


def test_empty_metrics_says_nothing() -> None:
    assert parse("", "vllm") == Reading()


def test_unique_keeps_one_engine_per_metrics_url() -> None:
    a = Engine("tgi", "m", "mixed", "http://127.0.0.1:3000/metrics", 10)
    b = Engine("tgi", None, "router", "http://127.0.0.1:3000/metrics", 11)
    c = Engine("tgi", "m", None, None, 12)
    assert list(ce.unique([b, c, a])) == [a, c]


_ARG = st.one_of(
    st.sampled_from(
        [
            "vllm",
            "serve",
            "--port",
            "--model",
            "--served-model-name",
            "--kv-transfer-config",
            "--disaggregation-mode",
            "--enable-metrics",
            "-m",
            "sglang.launch_server",
            "tritonserver",
            "--backend-config",
            "trtllm-serve",
            "text-generation-launcher",
            "--prometheus-port",
            "--host",
            "{",
            '{"kv_role": 1}',
            "[]",
            "99999",
            "0",
            "=",
            "--=",
            "--",
            "-",
            "python3",
            "/bin/vllm",
            "disaggregated",
            "--server_role",
        ]
    ),
    st.text(max_size=40),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_ARG, max_size=16))
def test_fuzz_recognise(argv: list[str]) -> None:
    engine = recognise(argv)
    if engine is not None:
        assert engine.engine in ce.ENGINES
        assert engine.role is None or engine.role in ce.ROLES
        assert engine.model is None or 0 < len(engine.model) <= ce.MAX_NAME_CHARS
        assert engine.metrics_url is None or engine.metrics_url.startswith("http://")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400), st.sampled_from(ce.ENGINES))
def test_fuzz_parse(text: str, engine: str) -> None:
    """Any text: a Reading or MetricsError, never another exception."""
    with contextlib.suppress(MetricsError):
        assert isinstance(parse(text, engine), Reading)
