"""tags: Slurm job id and rank from /proc/PID/environ and the prolog's job file."""

from __future__ import annotations

from pathlib import Path

from ingero.slurm.jobfile import JobInfo, write_job
from ingero.trace.aggregate import Tags
from ingero.trace.tags import TagCache, parse_environ, tags_from_environ


def test_parse_environ() -> None:
    env = parse_environ(b"A=1\0SLURM_JOB_ID=77\0broken\0=x\0B=a=b\0")
    assert env == {"A": "1", "SLURM_JOB_ID": "77", "B": "a=b"}


def test_environment_wins() -> None:
    assert tags_from_environ({"SLURM_JOB_ID": "77", "SLURM_PROCID": "5"}) == Tags("77", 5)


def test_no_slurm_no_tags() -> None:
    assert tags_from_environ({"PATH": "/bin"}) == Tags()


def test_bad_values_are_ignored() -> None:
    assert tags_from_environ({"SLURM_JOB_ID": "../etc", "SLURM_PROCID": "x"}) == Tags()
    assert tags_from_environ({"SLURM_JOB_ID": "12", "SLURM_PROCID": "-1"}) == Tags("12", None)


def test_rank_from_the_job_file(tmp_path: Path) -> None:
    write_job(tmp_path, JobInfo("31", "c1", "n3", rank=2, world_size=4))
    assert tags_from_environ({"SLURM_JOB_ID": "31"}, tmp_path) == Tags("31", 2)
    (tmp_path / "32.json").write_text("{not json")
    assert tags_from_environ({"SLURM_JOB_ID": "32"}, tmp_path) == Tags("32", None)


def test_cache_reads_each_process_once(tmp_path: Path) -> None:
    (tmp_path / "9").mkdir()
    environ = tmp_path / "9" / "environ"
    environ.write_bytes(b"SLURM_JOB_ID=5\0SLURM_PROCID=1\0")
    cache = TagCache(proc=tmp_path, job_dir=tmp_path / "jobs")
    assert cache.get(9) == Tags("5", 1)
    environ.write_bytes(b"")
    assert cache.get(9) == Tags("5", 1)
    assert cache.get(10) == Tags()  # vanished process: no tags, no error
    cache.forget(9)
    assert cache.get(9) == Tags()
