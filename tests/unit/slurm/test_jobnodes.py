"""A job's nodes from captured squeue/scontrol output (Slurm 22.05 and 25.11,
tests/fixtures/slurm)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from ingero.slurm.backend import SlurmError
from ingero.slurm.jobnodes import (
    SlurmJobNodes,
    parse_hostnames,
    parse_job_nodelist,
    parse_squeue_nodelist,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"
JOB = (FIXTURES / "job_id_2205.txt").read_text().strip()
SQUEUE = (FIXTURES / "squeue_job_nodelist_2205.txt").read_text()
SHOW_JOB = (FIXTURES / "scontrol_show_job_2205.txt").read_text()
HOSTNAMES = (FIXTURES / "scontrol_show_hostnames_2205.txt").read_text()
# "exit 1\n<stderr>" as captured for a job id slurmctld does not know
UNKNOWN = (FIXTURES / "squeue_unknown_job_2205.txt").read_text().splitlines()[1]


class Runner:
    """Answers each command line with a captured output, or raises what Slurm would."""

    def __init__(self, outputs: dict[str, str | Exception]) -> None:
        self.outputs = outputs
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str], timeout: float) -> str:
        self.calls.append(list(args))
        answer = self.outputs[" ".join(args)]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _captured(tag: str, name: str) -> str:
    return (FIXTURES / f"{name}_{tag}.txt").read_text()


@pytest.mark.parametrize("tag", ["2205", "2511"])
def test_each_release_through_squeue_and_scontrol(tag: str) -> None:
    job = _captured(tag, "job_id").strip()
    nodelist = parse_squeue_nodelist(_captured(tag, "squeue_job_nodelist"))
    assert nodelist == parse_job_nodelist(_captured(tag, "scontrol_show_job")) == "n[2-4]"
    runner = Runner(
        {
            f"squeue -h -j {job} -o %N": _captured(tag, "squeue_job_nodelist"),
            "scontrol show hostnames n[2-4]": _captured(tag, "scontrol_show_hostnames"),
        }
    )
    assert SlurmJobNodes(runner=runner, have_squeue=True).nodes(job) == ["n2", "n3", "n4"]
    for name in ("squeue_unknown_job", "scontrol_show_unknown_job"):
        said = _captured(tag, name).splitlines()
        assert said[0] == "exit 1" and said[1].endswith("Invalid job id specified")


@pytest.mark.parametrize(
    ("parse", "text", "expected"),
    [
        (parse_squeue_nodelist, SQUEUE, "n[2-4]"),
        (parse_squeue_nodelist, "\n", None),  # a pending job: squeue prints an empty %N
        (parse_job_nodelist, SHOW_JOB, "n[2-4]"),  # NodeList=, not ReqNodeList=
        (parse_job_nodelist, "JobId=5\n   ReqNodeList=(null)\n   NodeList=(null)\n", None),
        (parse_hostnames, HOSTNAMES, ["n2", "n3", "n4"]),
    ],
)
def test_parsers_on_captured_output(parse: object, text: str, expected: object) -> None:
    assert callable(parse)
    assert parse(text) == expected


# (has squeue, outputs, expected nodes or error text, commands run)
CASES = [
    (
        True,
        {f"squeue -h -j {JOB} -o %N": SQUEUE, "scontrol show hostnames n[2-4]": HOSTNAMES},
        ["n2", "n3", "n4"],
        [["squeue", "-h", "-j", JOB, "-o", "%N"], ["scontrol", "show", "hostnames", "n[2-4]"]],
    ),
    (
        False,
        {f"scontrol show job {JOB}": SHOW_JOB, "scontrol show hostnames n[2-4]": HOSTNAMES},
        ["n2", "n3", "n4"],
        [["scontrol", "show", "job", JOB], ["scontrol", "show", "hostnames", "n[2-4]"]],
    ),
    (
        True,
        {f"squeue -h -j {JOB} -o %N": "\n"},
        "has no nodes (yet)",
        [["squeue", "-h", "-j", JOB, "-o", "%N"]],
    ),
    (
        True,
        {f"squeue -h -j {JOB} -o %N": SlurmError(f"squeue -h -j: exit 1: {UNKNOWN}")},
        "Invalid job id specified",
        [["squeue", "-h", "-j", JOB, "-o", "%N"]],
    ),
    (True, {}, "not a Slurm job id", []),
]


@pytest.mark.parametrize(("squeue", "outputs", "expected", "commands"), CASES)
def test_job_nodes(
    squeue: bool, outputs: dict[str, str | Exception], expected: object, commands: list[list[str]]
) -> None:
    runner = Runner(outputs)
    backend = SlurmJobNodes(runner, have_squeue=squeue)
    job = JOB if commands else "1;rm -rf /"
    if isinstance(expected, list):
        assert backend.nodes(job) == expected
    else:
        with pytest.raises(SlurmError, match=re.escape(str(expected))):
            backend.nodes(job)
    assert runner.calls == commands
