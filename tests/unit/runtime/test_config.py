"""Configuration loading: defaults, precedence, and one clear error per bad value."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingero.cli.main import main
from ingero.fleet.config import FleetConfig
from ingero.runtime.config import load_config, parse_duration
from ingero.runtime.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def test_defaults_match_design(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INGERO_CONFIG", raising=False)
    config = load_config(FleetConfig, "fleet-test-none")
    assert config.listen.otlp_grpc == "0.0.0.0:4317"
    assert config.listen.otlp_http == "0.0.0.0:4318"
    assert config.listen.api == "0.0.0.0:8080"
    assert config.push_interval == 5.0
    assert config.ttl_multiplier == 5
    assert (config.threshold.k, config.threshold.min_margin, config.threshold.ema_alpha) == (
        2.0,
        0.04,
        0.2,
    )
    assert (config.threshold.hysteresis, config.threshold.panic_fraction) == (0.02, 0.25)
    assert config.quorum.statistical_min == 5
    assert config.quorum.coverage_fraction == 0.8
    assert config.quorum.max_expected_nodes == 10000
    assert config.auth.token_file is None
    assert config.drain.enabled is False and config.drain.backend == "auto"
    assert config.drain.cooldown == 1800.0 and config.drain.min_intervals == 6
    assert config.echo.endpoint is None
    assert config.node_ttl == 25.0
    idle = config.drain.resume_idle
    assert (idle.enabled, idle.clean_for, idle.budget, idle.command) == (False, 600.0, 2, None)
    assert (config.verdict.enabled, config.verdict.max_bytes) == (False, 1024)


def test_file_values_and_cli_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path, "push_interval: 2s\nthreshold: {k: 3}\nlisten: {api: '127.0.0.1:9000'}\n"
    )
    config = load_config(
        FleetConfig, "fleet", path, {"listen.api": "127.0.0.1:9100", "threshold.k": None}
    )
    assert config.push_interval == 2.0
    assert config.threshold.k == 3.0
    assert config.listen.api == "127.0.0.1:9100"


def test_env_variable_is_second_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "ttl_multiplier: 7\n")
    monkeypatch.setenv("INGERO_CONFIG", str(path))
    assert load_config(FleetConfig, "fleet").ttl_multiplier == 7


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("threshold: {k: -1}\n", "threshold.k: must be greater than 0"),
        ("threshold: {k: abc}\n", "threshold.k: expected a number"),
        ("push_interval: soon\n", "push_interval: expected a duration"),
        ("drain: {enabled: 'yes'}\n", "drain.enabled: expected true or false"),
        (
            "drain: {backend: slurmrestd}\n",
            "drain.backend: expected one of auto, scontrol, pyslurm",
        ),
        ("quorum: {statistical_min: 2}\n", "quorum.statistical_min: must be at least 3"),
        ("threshold: {kk: 1}\n", "unknown key 'threshold.kk'"),
        ("verdict: {max_bytes: 100}\n", "verdict.max_bytes: must be"),
        ("drain: {resume_idle: {budget: 0}}\n", "drain.resume_idle.budget: must be"),
        ("drain: {resume_idle: {timeout: 0s}}\n", "drain.resume_idle.timeout: must be"),
        ("listen: {api: 8080}\n", "listen.api: expected a string"),
        ("listen: {api: 'nope'}\n", "listen.api: must be HOST:PORT"),
        ("auth: {tls_cert: /x.pem}\n", "auth.tls_cert and auth.tls_key must be set together"),
        ("- a list\n", "the top level must be a mapping"),
        ("threshold: [1\n", "invalid YAML"),
    ],
)
def test_bad_values_name_key_and_file(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(FleetConfig, "fleet", path)
    assert needle in str(info.value)
    assert str(path) in str(info.value)


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(FleetConfig, "fleet", tmp_path / "absent.yaml")


@pytest.mark.parametrize(
    ("text", "seconds"), [("5s", 5.0), ("30m", 1800.0), ("250ms", 0.25), ("2h", 7200.0), (3, 3.0)]
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["-1s", "5 parsecs", True, "nan", float("inf")])
def test_bad_durations(text: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_invalid_yaml_is_one_line_naming_file_and_place(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("listen:\n  api: [unclosed\npush_interval: 5s\n")
    with pytest.raises(ConfigError) as info:
        load_config(FleetConfig, "fleet", path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: invalid YAML: line ")


def test_a_bad_flag_value_is_blamed_on_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INGERO_CONFIG", raising=False)
    with pytest.raises(ConfigError) as info:
        load_config(FleetConfig, "fleet", None, {"push_interval": "soon"})
    assert str(info.value).startswith("--push-interval: expected a duration")
    path = tmp_path / "fleet.yaml"
    path.write_text("push_interval: never\n")
    with pytest.raises(ConfigError) as info:  # the file's own bad value still names the file
        load_config(FleetConfig, "fleet", path, {"ttl_multiplier": 3})
    assert str(info.value).startswith(f"{path}: push_interval:")


@pytest.mark.parametrize(
    ("args", "first"),
    [
        (["fleet", "--push-interval", "soon"], "--push-interval: expected a duration"),
        (["fleet-push", "--endpoint", "", "--push-interval", "x"], "--push-interval: "),
    ],
)
def test_cli_config_errors_are_one_line_exit_78(
    args: list[str],
    first: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("INGERO_CONFIG", raising=False)
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 78
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and first in lines[0], lines


def test_echo_reads_its_earlier_body_limit_key_with_one_deprecation_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Echo's limits.max_body_bytes is Fleet's name; sites' files with max_request_bytes
    keep working, told once that the key is deprecated."""
    from ingero.echo.config import EchoConfig

    path = write(tmp_path, "limits: {max_request_bytes: 1234}\n")
    with caplog.at_level("WARNING", logger="ingero.runtime.config"):
        config = load_config(EchoConfig, "echo", path)
    assert config.limits.max_body_bytes == 1234
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"{path}: limits.max_request_bytes is deprecated; it is limits.max_body_bytes now"
    ]
    both = write(tmp_path, "limits: {max_request_bytes: 1, max_body_bytes: 2}\n")
    with pytest.raises(ConfigError, match=r"max_request_bytes and limits\.max_body_bytes are one"):
        load_config(EchoConfig, "echo", both)


@pytest.mark.parametrize(
    ("daemon", "old", "new"),
    [("fleet", "bearer_token_file", "token_file"), ("echo", "tokens_file", "token_table")],
)
def test_token_keys_read_their_earlier_names_with_one_deprecation_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, daemon: str, old: str, new: str
) -> None:
    """One name per idea: a token per file is auth.token_file (Fleet, as echo.token_file),
    a YAML table of named, scoped tokens is auth.token_table (Echo); sites' files with the
    earlier names keep working."""
    from ingero.echo.config import EchoConfig
    from ingero.fleet.config import FleetConfig

    schema: type[FleetConfig | EchoConfig] = FleetConfig if daemon == "fleet" else EchoConfig
    path = write(tmp_path, f"auth: {{{old}: /etc/ingero/t}}\n")
    with caplog.at_level("WARNING", logger="ingero.runtime.config"):
        config = load_config(schema, daemon, path)
    assert getattr(config.auth, new) == "/etc/ingero/t"
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"{path}: auth.{old} is deprecated; it is auth.{new} now"]
    both = write(tmp_path, f"auth: {{{old}: /a, {new}: /b}}\n")
    with pytest.raises(ConfigError, match=rf"auth\.{old} and auth\.{new} are one setting"):
        load_config(schema, daemon, both)


def test_a_flag_wins_over_the_earlier_name_of_its_key(tmp_path: Path) -> None:
    """Flag > file holds when the file spells the key by its earlier name: ``ingero echo
    --token-table`` over a file with auth.tokens_file is that flag's table, not an error."""
    from ingero.echo.config import EchoConfig

    path = write(tmp_path, "auth: {tokens_file: /from/file}\n")
    config = load_config(EchoConfig, "echo", path, {"auth.token_table": "/from/flag"})
    assert config.auth.token_table == "/from/flag"


@pytest.mark.parametrize("section", ["nccl", "collectives"])
def test_fleet_push_reads_its_nccl_section_by_both_names(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, section: str
) -> None:
    """fleet-push's NCCL section is ``nccl:``, as Fleet's; a site's file with its earlier
    name ``collectives:`` keeps working, told once that the name is deprecated."""
    from ingero.push.config import PushConfig

    path = write(tmp_path, f"{section}: {{enabled: false, recent_intervals: 7}}\n")
    with caplog.at_level("WARNING", logger="ingero.runtime.config"):
        config = load_config(PushConfig, "fleet-push", path)
    assert (config.nccl.enabled, config.nccl.recent_intervals) == (False, 7)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == (
        [] if section == "nccl" else [f"{path}: collectives is deprecated; it is nccl now"]
    )


def test_fleet_push_refuses_a_file_setting_both_nccl_section_names(tmp_path: Path) -> None:
    from ingero.push.config import PushConfig

    both = write(tmp_path, "collectives: {enabled: false}\nnccl: {enabled: true}\n")
    with pytest.raises(ConfigError, match=r"collectives and nccl are one setting; keep nccl"):
        load_config(PushConfig, "fleet-push", both)
