"""Parsing real scontrol/sinfo output (captured from Slurm 22.05, see tests/fixtures/slurm)
and the commands ScontrolBackend runs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from ingero.runtime.errors import ConfigError, UnavailableError
from ingero.slurm.backend import NodeInfo, SlurmError
from ingero.slurm.factory import make_backend
from ingero.slurm.scontrol_backend import (
    ScontrolBackend,
    parse_cluster_name,
    parse_scontrol_nodes,
    parse_sinfo_json,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"
SCONTROL = (FIXTURES / "scontrol_show_node_2205.txt").read_text()
SINFO_JSON = (FIXTURES / "sinfo_json_2205.json").read_text()
SCONTROL_2511 = (FIXTURES / "scontrol_show_node_2511.txt").read_text()
SINFO_JSON_2511 = (FIXTURES / "sinfo_json_2511.json").read_text()
INGERO = "ingero: straggler score=0.41 threshold=0.87 job=7 since=2026-11-22T21:00:00Z"

# name, base state, flags, reason, down, drained, reboot_pending, ingero_reason
EXPECTED = [
    ("n1", "idle", set(), None, False, False, False, False),
    ("n2", "idle", {"DRAIN"}, "admin: bad DIMM #42", False, True, False, False),
    ("n3", "idle", {"DRAIN"}, INGERO, False, True, False, True),
    ("n4", "down", set(), "hw fault", True, False, False, False),
    (
        "n5",
        "down",
        {"DRAIN", "REBOOT_ISSUED"},
        "kernel update : reboot issued",
        True,
        True,
        True,
        False,
    ),
    ("n6", "mixed", {"DRAIN"}, INGERO, False, True, False, True),
]


def _backend_2511() -> list[NodeInfo]:
    """What ScontrolBackend reads on 25.11: its sinfo --json groups nodes, so scontrol."""
    fake = FakeSlurm({"sinfo --json": SINFO_JSON_2511, "scontrol show": SCONTROL_2511})
    nodes = ScontrolBackend(timeout=3.0, runner=fake).nodes()
    assert [c[0] for c in fake.calls] == ["sinfo", "scontrol"]
    return nodes


@pytest.mark.parametrize(
    "parse",
    [
        lambda: parse_scontrol_nodes(SCONTROL),
        lambda: parse_sinfo_json(SINFO_JSON),
        lambda: parse_scontrol_nodes(SCONTROL_2511),
        _backend_2511,
    ],
    ids=["scontrol-22.05", "sinfo-json-22.05", "scontrol-25.11", "backend-25.11"],
)
def test_parses_every_captured_state(parse: object) -> None:
    assert callable(parse)
    nodes = {n.name: n for n in parse()}
    assert sorted(nodes) == [row[0] for row in EXPECTED]
    for name, state, flags, reason, down, drained, reboot, ingero in EXPECTED:
        node = nodes[name]
        assert (node.state, set(node.flags), node.reason) == (state, flags, reason), name
        assert (node.down, node.drained, node.reboot_pending, node.ingero_reason) == (
            down,
            drained,
            reboot,
            ingero,
        ), name
        assert node.reason_user == ("root" if reason else None)


def test_sinfo_json_of_2511_is_refused_for_its_groups() -> None:
    # n3 (ingero's reason) is grouped under n2's admin reason: reading it would mislead.
    with pytest.raises(SlurmError, match="grouped output"):
        parse_sinfo_json(SINFO_JSON_2511)


@pytest.mark.parametrize("tag", ["2205", "2511"])
def test_cluster_name_of_each_release(tag: str) -> None:
    text = (FIXTURES / f"scontrol_show_config_{tag}.txt").read_text()
    assert parse_cluster_name(text) == "ingerotest"


def test_both_parsers_agree_on_times() -> None:
    a = {n.name: n.reason_time for n in parse_scontrol_nodes(SCONTROL)}
    b = {n.name: n.reason_time for n in parse_sinfo_json(SINFO_JSON)}
    assert a == b  # the fixtures were captured on a UTC host


def test_newer_sinfo_json_state_list() -> None:
    text = json.dumps(
        {
            "nodes": [
                {
                    "name": "a",
                    "state": ["IDLE", "DRAIN"],
                    "reason": "x",
                    "reason_changed_at": {"set": True, "number": 5},
                }
            ]
        }
    )
    (node,) = parse_sinfo_json(text)
    assert (node.state, node.flags, node.reason_time) == ("idle", frozenset({"DRAIN"}), 5.0)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"nodes": {}}',
        '{"nodes": [{"state": "idle"}]}',
        '{"nodes": [{"name": "a"}]}',
    ],
)
def test_bad_sinfo_json_is_a_clear_error(text: str) -> None:
    with pytest.raises(SlurmError, match="sinfo --json"):
        parse_sinfo_json(text)


def test_sinfo_json_with_slurmctld_stopped_is_an_error_not_an_empty_cluster() -> None:
    # captured: sinfo --json exits 0 with {"errors": [...], "nodes": []} when slurmctld hangs
    text = (FIXTURES / "sinfo_json_2205_ctld_stopped.json").read_text()
    with pytest.raises(SlurmError, match="Unspecified error"):
        parse_sinfo_json(text)
    with pytest.raises(SlurmError, match="no nodes"):
        parse_sinfo_json('{"errors": [], "nodes": []}')


@pytest.mark.parametrize("text", ["garbage line\n", "NodeName=a Arch=x86_64\n"])
def test_bad_scontrol_output_is_a_clear_error(text: str) -> None:
    with pytest.raises(SlurmError, match="scontrol show node"):
        parse_scontrol_nodes(text)


class FakeSlurm:
    """Stands in for the Slurm commands (external programs), recording what was run."""

    def __init__(self, outputs: dict[str, str | Exception]) -> None:
        self.outputs = outputs
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str], timeout: float) -> str:
        assert timeout == 3.0
        self.calls.append(list(args))
        out = self.outputs.get(args[0] + " " + args[1], "")
        if isinstance(out, Exception):
            raise out
        return out


def test_reads_json_first() -> None:
    fake = FakeSlurm({"sinfo --json": SINFO_JSON})
    nodes = ScontrolBackend(timeout=3.0, runner=fake).nodes()
    assert len(nodes) == 6 and fake.calls == [["sinfo", "--json"]]


def test_falls_back_to_scontrol_when_json_is_unsupported_and_remembers() -> None:
    fake = FakeSlurm(
        {
            "sinfo --json": SlurmError("sinfo: unrecognized option '--json'"),
            "scontrol show": SCONTROL,
        }
    )
    backend = ScontrolBackend(timeout=3.0, runner=fake)
    assert [n.name for n in backend.nodes()] == ["n1", "n2", "n3", "n4", "n5", "n6"]
    backend.nodes()
    assert fake.calls.count(["sinfo", "--json"]) == 1


def test_a_failure_once_json_worked_is_raised() -> None:
    fake = FakeSlurm({"sinfo --json": SINFO_JSON})
    backend = ScontrolBackend(timeout=3.0, runner=fake)
    assert len(backend.nodes()) == 6
    fake.outputs["sinfo --json"] = SlurmError("sinfo --json: no answer within 3s")
    with pytest.raises(SlurmError, match="no answer"):
        backend.nodes()
    assert ["scontrol", "show", "node", "--oneliner"] not in fake.calls


def test_slurm_down_at_start_does_not_give_up_json() -> None:
    down = SlurmError("exit 1: Unable to contact slurm controller")
    fake = FakeSlurm({"sinfo --json": down, "scontrol show": down})
    backend = ScontrolBackend(timeout=3.0, runner=fake)
    with pytest.raises(SlurmError, match="Unable to contact"):
        backend.nodes()
    fake.outputs = {"sinfo --json": SINFO_JSON}
    assert len(backend.nodes()) == 6


def test_drain_and_resume_commands() -> None:
    fake = FakeSlurm({})
    backend = ScontrolBackend(timeout=3.0, runner=fake)
    backend.drain("n3", INGERO)
    backend.resume("n3")
    assert fake.calls == [
        ["scontrol", "update", "nodename=n3", "state=drain", f"reason={INGERO}"],
        ["scontrol", "update", "nodename=n3", "state=resume"],
    ]


@pytest.mark.parametrize("node", ["", "n[1-3]", "n1,n2", "n1 n2", "a=b"])
def test_refuses_anything_but_one_node_name(node: str) -> None:
    backend = ScontrolBackend(timeout=3.0, runner=FakeSlurm({}))
    with pytest.raises(ValueError, match="one node name"):
        backend.drain(node, "ingero: x")
    with pytest.raises(ValueError, match="one node name"):
        backend.resume(node)


def test_refuses_a_multiline_reason() -> None:
    with pytest.raises(ValueError, match="one non-empty line"):
        ScontrolBackend(timeout=3.0, runner=FakeSlurm({})).drain("n1", "a\nb")


def test_backend_choice() -> None:
    with pytest.raises(ConfigError, match="unknown"):
        make_backend("slurmrestd")


def test_nodeinfo_defaults() -> None:
    node = NodeInfo("a", "idle")
    assert not (node.down or node.drained or node.reboot_pending or node.ingero_reason)


def test_auto_without_scontrol_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UnavailableError, match="scontrol not found"):
        make_backend("auto")


def test_cluster_name_from_scontrol_show_config() -> None:
    text = (FIXTURES / "scontrol_show_config_2205.txt").read_text()
    assert parse_cluster_name(text) == "ingerotest"
    with pytest.raises(SlurmError, match="no ClusterName"):
        parse_cluster_name("Configuration data as of 2026-11-22T21:31:09\nSlurmUser = root\n")
    fake = FakeSlurm({"scontrol show": text})
    backend = ScontrolBackend(timeout=3.0, runner=fake)
    assert backend.cluster_name() == backend.cluster_name() == "ingerotest"
    assert fake.calls == [["scontrol", "show", "config"]]  # read once
