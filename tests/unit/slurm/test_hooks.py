"""Pure parts of the Slurm hooks: job info from the environment, task exports, summaries."""

from __future__ import annotations

import pytest

from ingero.slurm.hooks import job_info_from_env, summarize, task_exports
from ingero.slurm.jobfile import JobInfo, check_job_id

PROLOG_ENV = {  # as slurmd 22.05 gives it to a Prolog (captured, trimmed)
    "SLURMD_NODENAME": "gpu-b07",
    "SLURM_CLUSTER_NAME": "lab",
    "SLURM_JOB_ID": "1234",
    "SLURM_JOB_NUM_NODES": "4",
    "SLURM_JOB_PARTITION": "debug",
    "SLURM_JOB_UID": "1001",
    "SLURM_JOB_USER": "alice",
    "SLURM_JOB_GPUS": "0,1",
    "SLURM_NODELIST": "gpu-a[01-02],gpu-b07,gpu-c1",
}


def test_prolog_env_to_job_info() -> None:
    info = job_info_from_env(PROLOG_ENV, now=100.0)
    assert info == JobInfo(
        job_id="1234",
        cluster_id="lab",
        node_id="gpu-b07",
        rank=2,
        world_size=4,
        nodes=["gpu-a01", "gpu-a02", "gpu-b07", "gpu-c1"],
        user="alice",
        uid=1001,
        partition="debug",
        gpus=["0", "1"],
        started_at=100.0,
    )


def test_task_env_uses_job_nodelist_and_cuda_devices() -> None:
    env = {
        "SLURM_JOB_ID": "9",
        "SLURMD_NODENAME": "n3",
        "SLURM_JOB_NODELIST": "n[1-3]",
        "SLURM_NODELIST": "n3",
        "CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb",
    }
    info = job_info_from_env(env, now=0.0)
    assert (info.rank, info.world_size, info.gpus, info.cluster_id) == (
        2,
        3,
        ["GPU-aa", "GPU-bb"],
        "default",
    )


def test_node_not_in_list_has_no_rank() -> None:
    info = job_info_from_env({**PROLOG_ENV, "SLURM_NODELIST": "x[1-2]"}, now=0.0)
    assert info.rank is None and info.world_size == 4


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({**PROLOG_ENV, "SLURM_JOB_ID": ""}, "invalid Slurm job id"),
        ({**PROLOG_ENV, "SLURM_JOB_ID": "../../etc/passwd"}, "invalid Slurm job id"),
        ({k: v for k, v in PROLOG_ENV.items() if k != "SLURMD_NODENAME"}, "SLURMD_NODENAME"),
        ({**PROLOG_ENV, "SLURM_NODELIST": "n[1-"}, "node list"),
    ],
)
def test_bad_environment_is_a_clear_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        job_info_from_env(env, now=0.0)


def test_task_exports() -> None:
    info = job_info_from_env(PROLOG_ENV, now=0.0)
    assert task_exports(info, {"SLURM_PROCID": "5"}) == [
        "export INGERO_CLUSTER_ID=lab",
        "export INGERO_JOB_ID=1234",
        "export INGERO_NODE_ID=gpu-b07",
        "export INGERO_RANK=2",
        "export INGERO_WORLD_SIZE=4",
        "export INGERO_TASK_RANK=5",
    ]


def test_task_exports_leave_out_unknown_and_unsafe_values() -> None:
    info = JobInfo(
        job_id="1", cluster_id="a\nexport EVIL=1", node_id="n1", rank=None, world_size=None
    )
    assert task_exports(info, {}) == ["export INGERO_JOB_ID=1", "export INGERO_NODE_ID=n1"]


def ev(kind: str, ts: float, score: float | None = None, **kw: object) -> dict[str, object]:
    return {"type": kind, "timestamp": ts, "node_id": "n2", "job_id": "7", "score": score, **kw}


def test_summary_of_episodes() -> None:
    events = [
        ev("straggler_state", 110, 0.5),
        ev("straggler_state", 120, 0.3),  # re-sent inside the episode
        ev("straggler_resolved", 140, 0.9),
        ev("straggler_state", 190, 0.45),  # open at the job's end
        ev("straggler_state", 150, 0.1, node_id="n1"),  # another node
        ev("straggler_state", 150, 0.1, job_id="8"),  # another job
        ev("straggler_state", 50, 0.1),  # before the job
        ev("group_degraded", 150, 0.1),
        {"type": "straggler_state", "timestamp": "bad", "node_id": "n2", "job_id": "7"},
    ]
    assert summarize(events, "7", "n2", start=100.0, end=200.0) == {
        "straggler_seconds": 40.0,
        "straggler_episodes": 2,
        "worst_score": 0.3,
        "job_seconds": 100.0,
    }


def test_summary_without_events() -> None:
    assert summarize([], "7", "n2", 0.0, 5.0)["worst_score"] is None


def test_job_file_parsing_rejects_bad_fields() -> None:
    good = JobInfo(job_id="1", cluster_id="c", node_id="n", rank=0, world_size=1).to_dict()
    assert JobInfo.from_dict(good).rank == 0
    for key, bad in [
        ("job_id", "x/y"),
        ("rank", "0"),
        ("nodes", "n1"),
        ("node_id", ""),
        ("started_at", True),
        ("user", 5),
    ]:
        with pytest.raises(ValueError):
            JobInfo.from_dict({**good, key: bad})
    with pytest.raises(ValueError, match="JSON object"):
        JobInfo.from_dict([1])
    assert check_job_id("123") == "123"
