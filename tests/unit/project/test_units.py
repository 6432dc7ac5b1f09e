"""The systemd units under systemd/: what each promises, and `systemd-analyze verify` clean."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
UNITS = ROOT / "systemd"
INSTALLED_BINARY = "/opt/ingero/venv/bin/ingero"
SERVICES = sorted(p.name for p in UNITS.glob("*.service"))
DROP_INS = sorted(UNITS.glob("examples/*.service.d/*.conf"))
WATCHDOG = {
    "ingero-fleet.service",
    "ingero-push.service",
    "ingero-trace.service",
    "ingero-gpu-sample.service",
}
NOTIFY = WATCHDOG | {"ingero-echo.service"}
COMMAND = {
    "ingero-fleet.service": "fleet --config /etc/ingero/fleet.yaml",
    "ingero-echo.service": "echo --config /etc/ingero/echo.yaml",
    "ingero-push.service": "fleet-push --config /etc/ingero/fleet-push.yaml",
    "ingero-sink.service": "sink",
    "ingero-annotate.service": "annotate serve",
    "ingero-trace.service": "trace --record",
    "ingero-gpu-sample.service": "gpu-sample",
}


def parse(text: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    return parser


def service(name: str) -> configparser.SectionProxy:
    return parse((UNITS / name).read_text())["Service"]


def render(text: str, binary: str) -> str:
    return text.replace(INSTALLED_BINARY, binary)


def test_every_daemon_has_a_unit() -> None:
    assert sorted(COMMAND) == SERVICES


@pytest.mark.parametrize("name", SERVICES)
def test_exec_start_runs_the_daemon_command(name: str) -> None:
    assert service(name)["ExecStart"] == f"{INSTALLED_BINARY} {COMMAND[name]}"


@pytest.mark.parametrize("name", SERVICES)
def test_hardening_and_restart_policy(name: str) -> None:
    svc = service(name)
    assert svc["NoNewPrivileges"] == "yes"
    assert svc["ProtectSystem"] == "strict"
    assert svc["PrivateTmp"] == "yes"
    assert svc["SystemCallFilter"].startswith("@system-service")
    assert svc["RestrictAddressFamilies"]
    assert svc["Restart"] == "on-failure"
    assert svc["RestartPreventExitStatus"] == "78"  # EXIT_CONFIG: a restart cannot fix it
    unit = parse((UNITS / name).read_text())["Unit"]
    assert int(unit["StartLimitBurst"]) > 1 and unit["StartLimitIntervalSec"]


@pytest.mark.parametrize("name", SERVICES)
def test_notify_daemons_and_watchdogs(name: str) -> None:
    svc = service(name)
    if name in NOTIFY:
        assert svc["Type"] == "notify" and svc["NotifyAccess"] == "main"
    else:
        assert svc["Type"] == "exec"
    # a watchdog on a daemon that never pings would kill it every WatchdogSec
    assert ("WatchdogSec" in svc) == (name in WATCHDOG)


@pytest.mark.parametrize("name", sorted(set(SERVICES) - {"ingero-trace.service"}))
def test_unprivileged_daemons(name: str) -> None:
    svc = service(name)
    assert svc["User"] == "ingero"
    assert svc["CapabilityBoundingSet"] == ""


def test_trace_has_only_the_capabilities_bpf_needs() -> None:
    svc = service("ingero-trace.service")
    caps = set(svc["CapabilityBoundingSet"].split())
    assert {"CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN"} <= caps
    assert not caps & {"CAP_NET_ADMIN", "CAP_SYS_MODULE", "CAP_SETUID", "CAP_NET_RAW"}
    assert svc["LimitMEMLOCK"] == "infinity"
    assert "bpf" in svc["SystemCallFilter"].split()


def test_push_runs_after_trace_and_leaves_its_state_directory_alone() -> None:
    unit = parse((UNITS / "ingero-push.service").read_text())
    assert "ingero-trace.service" in unit["Unit"]["After"].split()
    # two units declaring StateDirectory=ingero with different owners would fight over it
    assert "StateDirectory" not in unit["Service"]
    assert service("ingero-trace.service")["StateDirectory"] == "ingero"


def test_fleet_may_write_its_echo_spool_under_var_lib_ingero_only() -> None:
    svc = service("ingero-fleet.service")
    assert svc["ReadWritePaths"] == "-/var/lib/ingero" and svc["ProtectSystem"] == "strict"
    assert "StateDirectory" not in svc


def test_gpu_sample_sees_the_nvidia_devices_and_runs_before_push() -> None:
    unit = parse((UNITS / "ingero-gpu-sample.service").read_text())
    # NVML opens /dev/nvidia*; a private /dev would hide every GPU.
    assert "PrivateDevices" not in unit["Service"]
    assert "ingero-push.service" in unit["Unit"]["Before"].split()
    assert "StateDirectory" not in unit["Service"]


def test_annotate_restarts_on_failure_and_writes_only_its_socket_and_the_node_db() -> None:
    """A dead annotate server leaves every job's marks unwritten (a hostile line once killed
    it with exit 70): systemd brings it back; it listens only on a local socket."""
    unit = parse((UNITS / "ingero-annotate.service").read_text())
    svc = unit["Service"]
    assert svc["Restart"] == "on-failure" and svc["RestartSec"]
    assert svc["RestrictAddressFamilies"] == "AF_UNIX" and svc["PrivateNetwork"] == "yes"
    assert svc["ReadWritePaths"].split() == ["-/run/ingero", "-/var/lib/ingero"]
    assert "StateDirectory" not in svc and "RuntimeDirectory" not in svc
    assert "ingero-trace.service" in unit["Unit"]["After"].split()


def test_nondirectory_paths_are_declared_by_systemd() -> None:
    text = (UNITS / "tmpfiles.d/ingero.conf").read_text()
    assert "d /var/lib/ingero 0770 root ingero -" in text
    assert "d /run/ingero 0775 root ingero -" in text and "d /run/ingero/jobs" in text
    assert "u ingero " in (UNITS / "sysusers.d/ingero.conf").read_text()


def _verify(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
    )


needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed"
)


@needs_analyze
@pytest.mark.parametrize("name", SERVICES)
def test_rendered_unit_verifies_with_empty_stderr(name: str, tmp_path: Path) -> None:
    # verify fails when ExecStart's binary is missing: render with the test venv's ingero
    binary = str(Path(sys.executable).with_name("ingero"))
    assert Path(binary).exists()
    unit = tmp_path / name
    unit.write_text(render((UNITS / name).read_text(), binary))
    result = _verify(unit)
    assert result.returncode == 0 and result.stderr == "", result.stderr


@needs_analyze
@pytest.mark.parametrize("drop_in", DROP_INS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_drop_in_example_verifies_with_empty_stderr(drop_in: Path, tmp_path: Path) -> None:
    name = drop_in.parent.name.removesuffix(".d")
    binary = str(Path(sys.executable).with_name("ingero"))
    unit = tmp_path / name
    # a drop-in's keys apply as if appended to the unit: verify the combination
    # (an ExecStart= in the drop-in is rendered as the unit's is)
    unit.write_text(render((UNITS / name).read_text() + "\n" + drop_in.read_text(), binary))
    result = _verify(unit)
    assert result.returncode == 0 and result.stderr == "", result.stderr


@needs_analyze
def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    binary = str(Path(sys.executable).with_name("ingero"))
    unit = tmp_path / "ingero-fleet.service"
    text = render((UNITS / "ingero-fleet.service").read_text(), binary)
    unit.write_text(text.replace("WatchdogSec=30s", "WatchdogSec=soon"))
    assert "soon" in _verify(unit).stderr
