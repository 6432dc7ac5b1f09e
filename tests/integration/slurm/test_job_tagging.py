"""An sbatch job across the real cluster gets job files (Prolog), INGERO_* in every task
(TaskProlog), and a job summary plus file removal at the end (Epilog)."""

from __future__ import annotations

import json

import pytest

from tests.integration.slurm.cluster import SlurmCluster

pytestmark = pytest.mark.integration

JOB = """#!/bin/bash
root={root}
# every task copies its node's job file and its INGERO_* environment out
srun bash -c 'cp {root}/jobs/$SLURMD_NODENAME/$SLURM_JOB_ID.json {root}/out/file.$SLURMD_NODENAME.json;
  env | grep ^INGERO_ | sort > {root}/out/env.$SLURMD_NODENAME.txt'
# one straggler episode of n2, logged as fleet-push would log it
ev() {{ echo "{{\\"type\\":\\"$1\\",\\"node_id\\":\\"n2\\",\\"cluster_id\\":\\"ingerotest\\",\\"job_id\\":\\"$SLURM_JOB_ID\\",\\"timestamp\\":$(date +%s.%N),\\"score\\":$2}}" >> $root/events/n2.ndjson; }}
ev straggler_state 0.31
sleep 1
ev straggler_state 0.27
sleep 1
ev straggler_resolved 0.9
"""


def test_sbatch_job_is_tagged_on_every_node(slurm: SlurmCluster) -> None:
    root = slurm.root
    script = root / "job.sh"
    script.write_text(JOB.format(root=root))
    sub = slurm.run(
        [
            "sbatch",
            "--parsable",
            "--wait",
            "-N4",
            "--gres=gpu:1",
            "-o",
            str(root / "out" / "job.log"),
            str(script),
        ],
        timeout=120,
    )
    job_id = sub.stdout.strip().split(";")[0]
    assert job_id.isdigit(), sub
    job_log = (root / "out" / "job.log").read_text()
    assert job_log == "", job_log

    for rank, node in enumerate(slurm.node_names):
        info = json.loads((root / "out" / f"file.{node}.json").read_text())
        assert (info["job_id"], info["node_id"], info["rank"]) == (job_id, node, rank)
        assert (info["world_size"], info["cluster_id"]) == (4, "ingerotest")
        assert info["nodes"] == slurm.node_names
        assert (info["user"], info["partition"], info["gpus"]) == ("root", "debug", ["0"])
        env = (root / "out" / f"env.{node}.txt").read_text().splitlines()
        assert env == [
            "INGERO_CLUSTER_ID=ingerotest",
            f"INGERO_JOB_ID={job_id}",
            f"INGERO_NODE_ID={node}",
            f"INGERO_RANK={rank}",
            f"INGERO_TASK_RANK={rank}",
            "INGERO_WORLD_SIZE=4",
        ]

    # The epilog runs after the job completes: wait for every node's file to go.
    files = [root / "jobs" / node / f"{job_id}.json" for node in slurm.node_names]
    slurm.wait(lambda: not any(f.exists() for f in files), 60, "epilogs to remove job files")
    for node in slurm.node_names:
        log = root / "events" / f"{node}.ndjson"
        summaries = [
            e
            for e in map(json.loads, log.read_text().splitlines())
            if e["type"] == "job_summary" and e["job_id"] == job_id
        ]
        assert len(summaries) == 1, node
        summary = summaries[0]
        assert (summary["node_id"], summary["cluster_id"]) == (node, "ingerotest")
        assert summary["rank"] == slurm.node_names.index(node)
        if node == "n2":
            assert summary["worst_score"] == 0.27
            assert summary["straggler_episodes"] == 1
            assert 1.5 < summary["straggler_seconds"] < summary["job_seconds"]
        else:
            assert summary["worst_score"] is None and summary["straggler_seconds"] == 0.0
