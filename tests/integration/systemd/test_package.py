"""The .deb in a real systemd (PID 1 in namespaces): install, run the units, remove, purge."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest

from ingero.journal.records import parse_line
from ingero.schema.events import MESSAGE_IDS
from tests.integration.systemd.conftest import Artefacts
from tests.integration.systemd.slurmbox import prolog_flags, run_job, start_slurm, write_site_conf
from tests.integration.systemd.sysdns import SystemdContainer, wait_for

pytestmark = pytest.mark.integration

Boot = Callable[[str], SystemdContainer]
UNITS = ["ingero-trace", "ingero-push", "ingero-sink", "ingero-annotate", "ingero-fleet",
         "ingero-echo"]  # fmt: skip


def install(boot: Boot, artefacts: Artefacts, tag: str) -> SystemdContainer:
    box = boot(tag)
    box.run("dpkg", "-i", str(artefacts.deb), timeout=300)
    return box


def drop_in(box: SystemdContainer, unit: str, text: str) -> None:
    path = box.root / f"etc/systemd/system/{unit}.service.d/test.conf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    box.run("systemctl", "daemon-reload")


def test_install_starts_nothing_and_sets_up_user_and_dirs(boot: Boot, artefacts: Artefacts) -> None:
    box = install(boot, artefacts, "pkg")
    assert box.run("id", "-u", "ingero").stdout.strip().isdigit()
    assert box.run("stat", "-c", "%U:%G %a", "/var/lib/ingero").stdout.split() == [
        "root:ingero",
        "770",
    ]
    assert box.run("stat", "-c", "%U:%G %a", "/run/ingero").stdout.split() == ["root:ingero", "775"]
    for unit in UNITS:
        assert box.prop(unit, "LoadState") == "loaded"
        assert box.prop(unit, "ActiveState") == "inactive"
        assert box.prop(unit, "UnitFileState") == "disabled"
    assert "ingero, version" in box.run("ingero", "--version").stdout
    # postinst compiled the bytecode the package does not ship (run fails if it did not)
    box.run("test", "-d", "/opt/ingero/venv/lib/python3.11/site-packages/ingero/__pycache__")
    # man pages and bash completion, as an admin would use them
    assert box.run("man", "-w", "ingero-slurm-conf").stdout.strip().endswith(".1.gz")
    completion = box.run(
        "bash",
        "-c",
        "source /usr/share/bash-completion/completions/ingero;"
        " COMP_WORDS=(ingero slurm-c); COMP_CWORD=1; _ingero_completion ingero;"
        ' printf "%s\\n" "${COMPREPLY[@]}"',
    )
    assert "slurm-conf" in completion.stdout.split()
    # postinst indexed the journal catalog: journalctl -x explains a drain
    drained = box.run("journalctl", "--list-catalog", MESSAGE_IDS["node_drained"]).stdout
    assert "ingero: node @INGERO_NODE@ drained" in drained
    # every unit as installed passes verify inside the target system too
    for unit in UNITS:
        verify = box.run("systemd-analyze", "verify", f"/lib/systemd/system/{unit}.service")
        assert verify.stderr == "", verify.stderr


def test_notify_ready_status_and_watchdog_restart(boot: Boot, artefacts: Artefacts) -> None:
    box = install(boot, artefacts, "wd")
    drop_in(box, "ingero-fleet", "[Service]\nWatchdogSec=2s\nRestartSec=200ms\n")
    # Type=notify: `systemctl start` returns only once fleet sent READY=1
    box.run("systemctl", "start", "ingero-fleet.service")
    assert box.prop("ingero-fleet", "ActiveState") == "active"
    assert box.prop("ingero-fleet", "SubState") == "running"
    assert box.prop("ingero-fleet", "StatusText") != ""
    first = int(box.prop("ingero-fleet", "MainPID"))
    assert first > 0 and box.prop("ingero-fleet", "NRestarts") == "0"
    # a healthy daemon keeps pinging: two watchdog periods pass without a restart
    assert not wait_for(lambda: box.prop("ingero-fleet", "NRestarts") != "0", timeout=5)
    # hang it: a stopped process sends no WATCHDOG=1
    box.run("kill", "-STOP", str(first))  # MainPID and kill both live in the container's pid ns
    assert wait_for(lambda: box.prop("ingero-fleet", "NRestarts") == "1", timeout=30)
    assert wait_for(lambda: box.prop("ingero-fleet", "ActiveState") == "active", timeout=30)
    assert int(box.prop("ingero-fleet", "MainPID")) != first
    log = box.journal("-u", "ingero-fleet", "-o", "cat")
    assert "Watchdog timeout" in log and "Failed with result 'watchdog'" in log


def test_running_service_events_are_found_by_their_fields(boot: Boot, artefacts: Artefacts) -> None:
    box = install(boot, artefacts, "ev")
    box.run("systemctl", "start", "ingero-sink.service", "ingero-push.service")
    assert box.prop("ingero-push", "ActiveState") == "active"

    # fleet-push logs its detection mode as an event when it starts
    def found() -> list[str]:
        out = box.journal(
            "-o",
            "json",
            "-u",
            "ingero-push",
            "INGERO_EVENT=detection_mode",
            f"MESSAGE_ID={MESSAGE_IDS['detection_mode']}",
        )
        return out.splitlines()

    assert wait_for(lambda: bool(found()), timeout=30)
    record = parse_line(found()[0])
    assert record is not None and record.event.type == "detection_mode"
    assert record.unit == "ingero-push.service"
    assert record.event.node_id == box.run("hostname").stdout.strip()
    assert json.loads(found()[0])["SYSLOG_IDENTIFIER"] == "ingero"

    # the same event reached ingero-sink over /run/ingero/events.sock (both units hardened)
    def sink_counted() -> bool:
        scrape = box.run(
            "/opt/ingero/venv/bin/python",
            "-c",
            "import urllib.request;"
            "print(urllib.request.urlopen('http://127.0.0.1:9465/metrics').read().decode())",
            check=False,
        ).stdout
        return 'ingero_sink_events_total{type="detection_mode"} 1.0' in scrape

    assert wait_for(sink_counted, timeout=30)


def test_ingero_events_reads_episodes_a_service_wrote(boot: Boot, artefacts: Artefacts) -> None:
    box = install(boot, artefacts, "iev")
    # a transient service writes through fleet-push's own journald channel
    writer = (
        "from ingero.schema.events import Event;"
        "from ingero.push.channels.journald import JournaldChannel;"
        "import time; c = JournaldChannel(); t = time.time();"
        "c.send(Event(type='straggler_state', node_id='n7', cluster_id='c', job_id='99',"
        " timestamp=t - 60, score=0.4, threshold=0.7, dominant_signal='compute'));"
        "c.send(Event(type='straggler_resolved', node_id='n7', cluster_id='c', job_id='99',"
        " timestamp=t - 15, score=0.9, threshold=0.7));"
        "c.send(Event(type='node_drained', node_id='n8', cluster_id='c', timestamp=t,"
        " extra={'reason': 'ingero: test'}))"
    )
    box.run(
        "systemd-run",
        "--wait",
        "--unit",
        "ingero-writer",
        "/opt/ingero/venv/bin/python",
        "-c",
        writer,
    )
    box.run("journalctl", "--sync")
    out = box.run("ingero", "events", "--json", "--unit", "ingero-writer").stdout
    rows = json.loads(out)
    assert [(r["kind"], r["node_id"]) for r in rows] == [("straggler", "n7"), ("drain", "n8")]
    assert rows[0]["duration"] == pytest.approx(45.0) and rows[0]["job_id"] == "99"
    only = json.loads(box.run("ingero", "events", "--json", "--node", "n8").stdout)
    assert [r["node_id"] for r in only] == ["n8"]
    table = box.run("ingero", "events", "--job", "99").stdout
    assert "n7" in table and "45s" in table and "n8" not in table


def test_hardened_echo_decodes_in_its_worker_and_stores(boot: Boot, artefacts: Artefacts) -> None:
    box = install(boot, artefacts, "echo")
    box.run("systemctl", "start", "ingero-echo.service")
    assert box.prop("ingero-echo", "ActiveState") == "active"
    main = box.prop("ingero-echo", "MainPID")
    # the decoding worker runs inside the unit's sandbox, as the unit's user
    workers = box.run("pgrep", "-u", "ingero", "-P", main, "-f", "spawn_main", check=False)
    assert workers.stdout.split(), box.journal("-u", "ingero-echo", "-o", "cat")
    sender = (
        "import json, urllib.request;"
        "from ingero.schema.events import Event; from ingero.otlp.logs import encode_events;"
        "body = encode_events([Event('straggler_state', f'n{i}', 'c', 1000.0 + i,"
        " score=0.4, threshold=0.8) for i in range(50)]).SerializeToString();"
        "r = urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:4328/v1/logs',"
        " body, {'Content-Type': 'application/x-protobuf'}), timeout=30); print(r.status);"
        "q = json.dumps({'query': 'SELECT count(*) FROM events'}).encode();"
        "a = urllib.request.urlopen('http://127.0.0.1:8081/api/v1/sql', q, timeout=30);"
        "print(json.load(a)['rows'][0][0])"
    )
    out = box.run("/opt/ingero/venv/bin/python", "-c", sender).stdout.split()
    assert out == ["200", "50"], box.journal("-u", "ingero-echo", "-o", "cat")
    box.run("systemctl", "stop", "ingero-echo.service")
    assert box.run("pgrep", "-f", "spawn_main", check=False).stdout.strip() == ""


def test_annotate_serves_marks_and_is_restarted_when_it_dies(
    boot: Boot, artefacts: Artefacts
) -> None:
    """A hostile line once killed the annotate server (exit 70) and nothing restarted it."""
    box = install(boot, artefacts, "ann")
    drop_in(box, "ingero-annotate", "[Service]\nRestartSec=200ms\n")
    box.run("systemctl", "start", "ingero-annotate.service")
    assert wait_for(lambda: box.run("test", "-S", "/run/ingero/annotate.sock",
                                    check=False).returncode == 0, timeout=30)  # fmt: skip
    assert box.run("stat", "-c", "%U %a", "/run/ingero/annotate.sock").stdout.split() == [
        "ingero",
        "600",
    ]
    first = int(box.prop("ingero-annotate", "MainPID"))
    box.run("kill", "-SEGV", str(first))  # dies as by a crash: a failure, not a stop
    assert wait_for(lambda: box.prop("ingero-annotate", "NRestarts") == "1", timeout=30)
    assert wait_for(lambda: box.prop("ingero-annotate", "ActiveState") == "active", timeout=30)
    assert int(box.prop("ingero-annotate", "MainPID")) != first
    # the new server listens, as the ingero user, and writes the node DB
    send = (
        "import socket; s = socket.socket(socket.AF_UNIX);"
        " s.connect('/run/ingero/annotate.sock'); s.sendall(b'{\"kind\":\"step\"}\\n')"
    )
    assert wait_for(lambda: box.run("runuser", "-u", "ingero", "--", "/opt/ingero/venv/bin/python",
                                    "-c", send, check=False).returncode == 0, timeout=30)  # fmt: skip
    box.run("systemctl", "stop", "ingero-annotate.service")
    log = box.journal("-u", "ingero-annotate", "-o", "cat")
    assert "accepted 1 marks" in log, log


def test_trace_loads_bpf_and_push_reads_its_node_db(boot: Boot, artefacts: Artefacts) -> None:
    box = install(boot, artefacts, "bpf")
    start = box.run("systemctl", "start", "ingero-trace.service", check=False, timeout=300)
    if start.returncode != 0 and box.prop("ingero-trace", "ExecMainStatus") == "69":
        # EX_UNAVAILABLE: no BCC, or the kernel refused the programs (the journal says which)
        last = box.journal("-u", "ingero-trace", "-o", "cat").strip().splitlines()
        pytest.skip(f"BPF cannot load here: {[x for x in last if 'ingero:' in x][-1:]}")
    assert start.returncode == 0, start.stderr
    assert box.prop("ingero-trace", "StatusText").startswith("tracing")
    # hardened as it is (bounded capabilities, syscall filter), trace writes the node DB ...
    assert box.run("stat", "-c", "%U:%G", "/var/lib/ingero/ingero.db").stdout.strip() == (
        "root:ingero"
    )
    # ... and unprivileged fleet-push, ordered after it, reads it
    box.run("systemctl", "start", "ingero-push.service")

    def reads_db() -> bool:
        status = box.prop("ingero-push", "StatusText")
        return "score=" in status and not status.startswith("stale")  # stale: DB unreadable

    assert wait_for(reads_db, timeout=30), box.prop("ingero-push", "StatusText")


def test_remove_and_purge_are_clean(boot: Boot, artefacts: Artefacts) -> None:
    box = install(boot, artefacts, "rm")
    box.run("systemctl", "enable", "--now", "ingero-sink.service")
    assert box.prop("ingero-sink", "ActiveState") == "active"
    box.run("dpkg", "-r", "ingero", timeout=300)
    assert box.prop("ingero-sink", "ActiveState") == "inactive"
    assert box.prop("ingero-sink", "LoadState") == "not-found"
    for gone in ("/opt/ingero", "/usr/bin/ingero", "/usr/lib/ingero"):
        assert box.run("test", "-e", gone, check=False).returncode == 1, gone
    assert box.run("test", "-d", "/etc/ingero").returncode == 0  # conffiles stay until purge
    box.run("dpkg", "--purge", "ingero", timeout=120)
    for gone in ("/etc/ingero", "/var/lib/ingero", "/run/ingero"):
        assert box.run("test", "-e", gone, check=False).returncode == 1, gone
    assert box.run("dpkg", "-s", "ingero", check=False).returncode != 0
    assert "ingero" not in box.run("systemctl", "list-unit-files", "--no-legend").stdout


def test_slurm_jobs_are_tagged_by_the_packaged_hooks(boot: Boot, artefacts: Artefacts) -> None:
    box = install(boot, artefacts, "slurm")
    host = write_site_conf(box)  # PrologFlags=Serial, Epilog=/etc/slurm/epilog.d/*
    start_slurm(box)
    # nothing but the package: no settings file names a Python for the hooks
    assert box.run("test", "-e", "/etc/default/ingero-slurm", check=False).returncode == 1
    merged = box.run("ingero", "slurm-conf", "--write")
    assert "PrologFlags=Serial -> PrologFlags=Serial,Alloc" in merged.stderr, merged.stderr
    link = box.root / "etc/slurm/epilog.d/ingero"
    assert os.readlink(link) == "/usr/lib/ingero/slurm/epilog"
    assert box.run("ingero", "slurm-conf", "--check").returncode == 0
    box.run("scontrol", "reconfigure")
    assert wait_for(lambda: "Alloc" in prolog_flags(box).split(","), timeout=30)
    assert "Serial" in prolog_flags(box).split(",")

    job = run_job(box)
    assert job.job_file["job_id"] == job.job_id  # the packaged prolog wrote it
    assert (job.job_file["node_id"], job.job_file["cluster_id"]) == (host, "site")
    assert f"INGERO_JOB_ID={job.job_id}" in job.task_env  # the packaged task prolog
    assert job.site_epilog_ran and not job.job_file_left  # both epilogs ran

    # a site hook ingero cannot merge: one line naming it, exit 65, nothing changed
    other = box.root / "etc/slurm/other.conf"
    other.write_text("TaskProlog=/opt/site/task\n")
    refused = box.run(
        "ingero", "slurm-conf", "--write", "--file", "/etc/slurm/other.conf", check=False
    )
    assert refused.returncode == 65 and "TaskProlog=/opt/site/task" in refused.stderr
    assert other.read_text() == "TaskProlog=/opt/site/task\n"
