"""Echo's question parameters, GPU rate table, OpenAPI document and MCP descriptions."""

from __future__ import annotations

from pathlib import Path

import pytest
from openapi_spec_validator import validate

from ingero.echo.answers import QUESTIONS
from ingero.echo.api import openapi_document
from ingero.echo.config import EchoConfig
from ingero.echo.mcp_server import investigate_text, tools
from ingero.echo.questions import BadRequest, Param, Registry, answer_schema
from ingero.echo.rates import GpuRates
from ingero.runtime.config import build
from ingero.runtime.errors import ConfigError


def test_each_question_is_registered_beside_its_function_once() -> None:
    # The answers package registers every question where its function is defined, in the
    # module of its topic; the order names each registered question once.
    for q in QUESTIONS.values():
        assert q.run.__module__.startswith("ingero.echo.answers."), q.name
        assert q.run.__name__ == q.name
    registry = Registry()
    ask = registry.question("a", "A question", (Param("x", "string", "An x"),), answer_schema({}))
    ask(lambda conn, ctx, args: {})
    with pytest.raises(ValueError, match="'a' is registered twice"):
        ask(lambda conn, ctx, args: {})
    with pytest.raises(ValueError, match=r"missing \['a'\]"):
        registry.ordered(())
    with pytest.raises(ValueError, match=r"unknown or twice \['b'\]"):
        registry.ordered(("a", "b"))
    assert list(registry.ordered(("a",))) == ["a"]


def test_parameters_are_validated_with_clear_messages() -> None:
    q = QUESTIONS["stragglers"]
    args = q.parse({"cluster_id": "A", "limit": "5", "since": "10", "order_by": "depth"})
    assert args["limit"] == 5 and args["since"] == 10.0 and args["order_by"] == "depth"
    assert q.parse({})["order_by"] == "time"
    for raw, message in [
        ({"bogus": "1"}, "unknown parameter 'bogus'"),
        ({"limit": "ten"}, "limit must be an integer"),
        ({"limit": "0"}, "at least 1"),
        ({"limit": True}, "integer"),
        ({"since": "nan"}, "finite"),
        ({"order_by": "speed"}, "one of time, depth, episodes"),
        ({"cluster_id": ""}, "non-empty string"),
        ({"cluster_id": 5}, "non-empty string"),
        ({"since": "20", "until": "10"}, "since must not be after until"),
    ]:
        with pytest.raises(BadRequest, match=message):
            q.parse(raw)
    with pytest.raises(BadRequest, match="job_id is required"):
        QUESTIONS["job_report"].parse({})
    assert q.parse({"last": "24h"})["last"] == "24h"
    for raw, message in [
        ({"last": "yesterday"}, "must look like 24h"),
        ({"last": "-5m"}, "must look like 24h"),
        ({"last": "1h", "since": "5"}, "since or last, not both"),
    ]:
        with pytest.raises(BadRequest, match=message):
            q.parse(raw)


def test_gpu_rates_match_models_by_substring_and_overrides_layer(tmp_path: Path) -> None:
    rates = GpuRates.load()
    assert rates.rate("NVIDIA H100 80GB HBM3") == rates.models["H100"]
    assert rates.rate("NVIDIA H200") == rates.models["H200"]
    assert rates.rate("NVIDIA L40S") == rates.models["L40S"]  # not L4: longest match wins
    assert rates.rate(None) == rates.default
    override = tmp_path / "rates.yaml"
    override.write_text("models: {H100: 9.5}\n")
    mine = GpuRates.load(str(override))
    assert (mine.currency, mine.rate("H100"), mine.rate("A100")) == ("USD", 9.5, rates.rate("A100"))
    override.write_text("currency: EUR\ndefault: 1.5\nmodels: {H100: 9.5}\n")
    euro = GpuRates.load(str(override))  # another currency: its table alone, no dollar prices
    assert (euro.currency, euro.rate("H100"), euro.rate("A100")) == ("EUR", 9.5, 1.5)
    override.write_text("models: {H100: -1}\n")
    with pytest.raises(ConfigError, match="H100 must be a number >= 0"):
        GpuRates.load(str(override))


def test_openapi_document_is_valid_openapi_31_with_a_schema_per_question() -> None:
    doc = openapi_document()
    validate(doc)
    assert doc["openapi"].startswith("3.1")
    for name in QUESTIONS:
        op = doc["paths"][f"/api/v1/{name}"]["get"]
        assert op["responses"]["200"]["content"]["application/json"]["schema"]["type"] == "object"
    assert "requestBody" in doc["paths"]["/api/v1/sql"]["post"]


def test_mcp_tools_mirror_the_questions_and_the_prompt_names_explain() -> None:
    names = [t.name for t in tools()]
    assert names == [*QUESTIONS, "sql"]
    assert all(t.output_schema and t.input_schema["type"] == "object" for t in tools())
    text = investigate_text("A", "42")
    for step in ("summary", "stragglers", "job_report", "ingero explain --job 42", "cost"):
        assert step in text
    # the node's explanation is its causal chains, and the job's nodes can be asked at once
    assert "causal chains" in text and "ingero explain --job-nodes 42" in text
    # and, where the node records stacks, the lines of the job's code they come from
    assert "the lines of the job the calls came from" in text
    assert "ingero explain --nodes <its nodes>" in investigate_text("A", None)
    # a multi-node job: which rank is late, in which collective
    assert '`collective_lag` with {"job_id": "42"}' in text
    assert "`collective_lag` with its job_id" in investigate_text("A", None)


def test_config_defaults_and_bad_values() -> None:
    config = build(EchoConfig, {}, "<defaults>")
    assert config.listen.api == "0.0.0.0:8081" and config.listen.otlp_grpc == "0.0.0.0:4327"
    assert config.db == "/var/lib/ingero/echo.db"
    with pytest.raises(ConfigError, match=r"listen\.api: must be HOST:PORT"):
        build(EchoConfig, {"listen": {"api": "8081"}}, "echo.yaml")
    with pytest.raises(ConfigError, match=r"unknown key 'retention\.max_rows'"):
        build(EchoConfig, {"retention": {"max_rows": 5}}, "echo.yaml")
