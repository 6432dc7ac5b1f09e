"""PyslurmBackend and its worker process where Slurm 25.11 is absent: the real worker
(``python -m ingero.slurm.pyslurm_worker``) runs against a stand-in ``pyslurm`` package on
``PYTHONPATH`` that behaves as libslurm does in the cases that matter here: a cluster to
read and change, ``exit(1)`` without slurm.conf, a failed import, an RPC error, a call that
never returns. tests/integration/slurm/test_backends.py runs the real pyslurm."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingero.runtime.errors import EXIT_UNAVAILABLE, UnavailableError
from ingero.slurm.backend import SlurmError
from ingero.slurm.factory import make_backend
from ingero.slurm.jobnodes import PyslurmJobNodes, make_job_nodes
from ingero.slurm.pyslurm_backend import PyslurmBackend, release

FAKE_PYSLURM = """
import json, os, sys, time

__version__ = "25.11.2"
STATE = os.environ["FAKE_PYSLURM_STATE"]
MODE = os.environ.get("FAKE_PYSLURM_MODE", "ok")

if MODE == "exit":
    print("error: s_p_parse_file: unable to read slurm.conf", file=sys.stderr, flush=True)
    print("fatal: Unable to process configuration file", file=sys.stderr, flush=True)
    os._exit(1)  # what libslurm's fatal() does
if MODE == "importerror":
    raise ImportError("libslurm.so.43: cannot open shared object file")
print("libslurm says hello on stdout", flush=True)  # must not reach the answers


class RPCError(Exception):
    pass


def slurm_api_version():
    return (25, 11, 7)


def _load():
    with open(STATE) as f:
        return json.load(f)


def _save(data):
    with open(STATE, "w") as f:
        json.dump(data, f)


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class Nodes:
    @staticmethod
    def load():
        if MODE == "hang":
            time.sleep(3600)
        if MODE == "down":
            raise RPCError("Unable to contact slurm controller (connect failure)")
        return {n["name"]: _Obj(**n) for n in _load()["nodes"]}


class Node:
    def __init__(self, name=None, state=None, reason=None):
        self.name, self.state, self.reason = name, state, reason

    def modify(self, change):
        data = _load()
        for node in data["nodes"]:
            if node["name"] == self.name:
                if change.state == "DRAIN":
                    node.update(state="IDLE+DRAIN", reason=change.reason,
                                reason_user="root", reason_time=1795000000)
                else:
                    node.update(state="IDLE", reason=None, reason_user=None, reason_time=None)
                _save(data)
                return
        raise RPCError("Invalid node name specified")


class Job:
    @staticmethod
    def load(job_id):
        jobs = _load()["jobs"]
        if str(job_id) not in jobs:
            raise RPCError("Invalid job id specified")
        return _Obj(allocated_nodes=jobs[str(job_id)])


class Jobs:
    @staticmethod
    def load():
        return {}


class slurmctld:
    class Config:
        @staticmethod
        def load():
            return _Obj(cluster_name="fake", version="25.11.7")


class db:
    # pyslurm.db's jobs, as slurmdbd holds them (ids and a time window as filters)

    class JobFilter:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    class Job:
        def __init__(self, job_id=0, admin_comment=None):
            self.id, self.admin_comment = job_id, admin_comment

        def modify(self, change):
            data = _load()
            if str(self.id) not in data["db"]:
                raise RPCError("Nothing was modified")
            data["db"][str(self.id)]["admin_comment"] = change.admin_comment
            _save(data)

    class Jobs:
        @staticmethod
        def load(cond):
            out = {}
            for job_id, row in _load()["db"].items():
                if getattr(cond, "ids", None) and int(job_id) not in cond.ids:
                    continue
                if getattr(cond, "start_time", None) and (row["end_time"] or 0) < cond.start_time:
                    continue
                out[int(job_id)] = _Obj(id=int(job_id), **row)
            return out


class utils:
    @staticmethod
    def nodelist_from_range_str(nodelist):
        prefix, _, rng = nodelist.partition("[")
        first, _, last = rng.rstrip("]").partition("-")
        return [f"{prefix}{i}" for i in range(int(first), int(last) + 1)]
"""


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a worker that imports the stand-in pyslurm."""
    (tmp_path / "pkg" / "pyslurm").mkdir(parents=True)
    (tmp_path / "pkg" / "pyslurm" / "__init__.py").write_text(FAKE_PYSLURM)
    state = tmp_path / "state.json"
    nodes = [
        {"name": f"n{i}", "state": "IDLE", "reason": None, "reason_user": None,
         "reason_time": None}
        for i in (1, 2, 3)
    ]  # fmt: skip
    nodes[2].update(state="DOWN*+DRAIN", reason="hw fault", reason_user="root")
    db = {
        "7": {"state": "COMPLETED", "start_time": 1795000000, "end_time": 1795003600,
              "num_nodes": 2, "admin_comment": "JS1:H4sIAAAA"},
        "8": {"state": "RUNNING", "start_time": 1795000000, "end_time": None,
              "num_nodes": 1, "admin_comment": None},
    }  # fmt: skip
    state.write_text(json.dumps({"nodes": nodes, "jobs": {"7": "n[1-2]", "8": None}, "db": db}))
    yield {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "pkg"), *sys.path]),
        "FAKE_PYSLURM_STATE": str(state),
    }


def test_reads_drains_and_resumes_through_one_worker(fake: dict[str, str]) -> None:
    backend = PyslurmBackend(timeout=20, env=fake)
    try:
        nodes = {n.name: n for n in backend.nodes()}
        assert (nodes["n1"].state, nodes["n1"].flags, nodes["n1"].reason) == ("idle", set(), None)
        assert nodes["n3"].down and nodes["n3"].drained and nodes["n3"].reason == "hw fault"
        assert backend.hello == {"pyslurm": "25.11.2", "slurm": "25.11.7"}
        pid = backend._worker.proc.pid if backend._worker else None

        backend.drain("n2", "ingero: straggler score=0.30")
        n2 = {n.name: n for n in backend.nodes()}["n2"]
        assert n2.drained and n2.ingero_reason and n2.reason_user == "root"
        assert n2.reason_time == 1795000000.0
        backend.resume("n2")
        assert not {n.name: n for n in backend.nodes()}["n2"].drained
        assert backend.cluster_name() == "fake"
        assert backend._worker is not None and backend._worker.proc.pid == pid  # no new process
    finally:
        backend.close()


def test_accounting_records_and_admin_comments_through_the_worker(fake: dict[str, str]) -> None:
    backend = PyslurmBackend(timeout=20, env=fake)
    try:
        assert not backend.admin_comment_lowercased
        seven = backend.job_record("7")
        assert seven is not None and seven.ended and seven.nodes == 2
        assert (seven.start, seven.end, seven.admin_comment) == (
            1795000000.0,
            1795003600.0,
            "JS1:H4sIAAAA",
        )
        eight = backend.job_record("8")
        assert eight is not None and eight.state == "RUNNING" and not eight.ended
        assert backend.job_record("9") is None
        assert [r.job_id for r in backend.ended_jobs(1795000000, 1795009999)] == ["7"]
        backend.set_admin_comment("7", "JS1:H4sIAAAA ingero: x INGERO1:AAAA")
        after = backend.job_record("7")
        assert after is not None and after.admin_comment == "JS1:H4sIAAAA ingero: x INGERO1:AAAA"
        with pytest.raises(SlurmError, match=r"^pyslurm modify job 9: Nothing was modified"):
            backend.set_admin_comment("9", "x")
        with pytest.raises(ValueError, match="invalid Slurm job id"):
            backend.job_record("7 or 1=1")
    finally:
        backend.close()


def test_slurm_errors_are_one_line_slurm_errors(fake: dict[str, str]) -> None:
    backend = PyslurmBackend(timeout=20, env=fake)
    try:
        with pytest.raises(SlurmError, match=r"^pyslurm update nodename=n9: Invalid node name"):
            backend.drain("n9", "ingero: x")
        with pytest.raises(ValueError, match="one node name"):
            backend.drain("n[1-2]", "ingero: x")
        with pytest.raises(ValueError, match="one non-empty line"):
            backend.drain("n1", "a\nb")
        # an error does not end the worker: the next call uses it
        assert len(backend.nodes()) == 3
        assert SlurmError("x").exit_code == EXIT_UNAVAILABLE
    finally:
        backend.close()


def test_job_nodes_in_rank_order(fake: dict[str, str]) -> None:
    lookup = PyslurmJobNodes(PyslurmBackend(timeout=20, env=fake))
    try:
        assert lookup.nodes("7") == ["n1", "n2"]
        with pytest.raises(SlurmError, match="no nodes"):
            lookup.nodes("8")
        with pytest.raises(SlurmError, match=r"Invalid job id specified$"):
            lookup.nodes("9")
        with pytest.raises(SlurmError, match="not a Slurm job id"):
            lookup.nodes("7; rm")
    finally:
        lookup.backend.close()


def test_libslurm_exit_fails_the_call_not_the_caller(fake: dict[str, str]) -> None:
    backend = PyslurmBackend(timeout=20, env={**fake, "FAKE_PYSLURM_MODE": "exit"})
    for _ in range(2):  # every call tries a new worker, none takes the caller down
        with pytest.raises(SlurmError) as failed:
            backend.nodes()
        assert str(failed.value) == (
            "pyslurm: the worker ended: exit 1: fatal: Unable to process configuration file"
        )


def test_failed_import_is_one_line(fake: dict[str, str]) -> None:
    backend = PyslurmBackend(timeout=20, env={**fake, "FAKE_PYSLURM_MODE": "importerror"})
    with pytest.raises(SlurmError, match=r"^pyslurm: cannot import pyslurm: libslurm\.so\.43"):
        backend.nodes()


def test_a_hung_call_is_cut_at_the_timeout_and_the_worker_replaced(fake: dict[str, str]) -> None:
    hung = PyslurmBackend(timeout=3, env={**fake, "FAKE_PYSLURM_MODE": "hang"})
    hung.start()
    worker = hung._worker
    assert worker is not None
    with pytest.raises(SlurmError, match=r"^pyslurm show node: no answer within 3s$"):
        hung.nodes()
    assert worker.proc.returncode is not None  # killed, not left behind
    assert hung._worker is None


def test_controller_down_is_a_slurm_error(fake: dict[str, str]) -> None:
    backend = PyslurmBackend(timeout=20, env={**fake, "FAKE_PYSLURM_MODE": "down"})
    try:
        with pytest.raises(SlurmError, match="Unable to contact slurm controller"):
            backend.nodes()
    finally:
        backend.close()


def test_refuses_a_pyslurm_of_another_release(fake: dict[str, str]) -> None:
    backend = PyslurmBackend(timeout=20, env=fake, site_version=lambda: "slurm 22.05.8")
    with pytest.raises(SlurmError, match=r"built for Slurm 25\.11, this host runs Slurm 22\.05"):
        backend.nodes()
    assert backend._worker is None


def test_release() -> None:
    assert release("slurm 25.11.7") == "25.11"
    assert release("25.11") == "25.11"
    assert release("slurm-wlm 22.05.8") == "22.05"
    assert release("unknown") is None


def _on_path(monkeypatch: pytest.MonkeyPatch, fake: dict[str, str], tmp_path: Path) -> None:
    """This process finds the stand-in pyslurm (as find_spec does) and its workers import it."""
    for key in ("PYTHONPATH", "FAKE_PYSLURM_STATE"):
        monkeypatch.setenv(key, fake[key])
    monkeypatch.syspath_prepend(fake["PYTHONPATH"].split(os.pathsep)[0])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def _scontrol(tmp_path: Path, version: str) -> None:
    script = tmp_path / "bin" / "scontrol"
    script.write_text(f"#!/bin/sh\necho 'slurm {version}'\n")
    script.chmod(0o755)


def test_auto_picks_pyslurm_when_it_matches(
    fake: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _on_path(monkeypatch, fake, tmp_path)
    _scontrol(tmp_path, "25.11.7")
    chosen = make_backend("auto", timeout=20)
    assert chosen.name == "pyslurm"
    assert isinstance(chosen, PyslurmBackend)
    chosen.close()
    lookup = make_job_nodes("auto", timeout=20)
    assert lookup.name == "pyslurm" and lookup.nodes("7") == ["n1", "n2"]
    assert isinstance(lookup, PyslurmJobNodes)
    lookup.backend.close()


def test_auto_falls_back_to_scontrol(
    fake: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _on_path(monkeypatch, fake, tmp_path)
    _scontrol(tmp_path, "22.05.8")  # another release than pyslurm's
    assert make_backend("auto", timeout=20).name == "scontrol"
    assert make_job_nodes("auto", timeout=20).name == "scontrol"
    # pyslurm named explicitly: made, and its first call says why it cannot serve
    explicit = make_backend("pyslurm", timeout=20)
    with pytest.raises(SlurmError, match=r"this host runs Slurm 22\.05:"):
        explicit.nodes()
    _scontrol(tmp_path, "25.11.7")
    monkeypatch.setenv("FAKE_PYSLURM_MODE", "exit")  # no slurm.conf: pyslurm cannot load
    assert make_backend("auto", timeout=20).name == "scontrol"


def test_pyslurm_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ingero.slurm.pyslurm_backend.find_spec", lambda name: None, raising=True)
    with pytest.raises(UnavailableError, match="pyslurm is not installed"):
        make_backend("pyslurm")
