"""The job's verdict: the fold of a job's events, and its AdminComment text (encoder beside
decoder, the site's text kept, the size bound, jobstats' reader, 22.05's lowercasing)."""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingero.schema.events import Event
from ingero.slurm.verdict import (
    MAX_LISTED,
    JobTally,
    VerdictError,
    decode_part,
    encode_part,
    human_line,
    merge_admin_comment,
    split_admin_comment,
)

T0 = 1_795_000_000.0


def ev(
    kind: str, node: str = "n3", ts: float = T0, event_id: str | None = None, **kw: Any
) -> Event:
    extra = kw.pop("extra", {})
    return Event(
        type=kind,
        node_id=node,
        cluster_id="c",
        timestamp=ts,
        job_id=kw.pop("job_id", "7"),
        event_id=event_id or str(uuid.uuid4()),
        extra=extra,
        **kw,
    )


EP = "00000000-0000-0000-0000-00000000000a"


def job_events() -> list[Event]:
    """A 1 h job: n3 straggles 20 min (hardware), is drained, a rank lags, GPUs sit idle."""
    return [
        ev("straggler_state", ts=T0 + 600, event_id=EP, rank=2, score=0.41, threshold=0.86,
           dominant_signal="gpu_health", extra={"cause_class": "hardware", "reason": "score"}),
        ev("straggler_state", ts=T0 + 700, event_id=EP, rank=2, score=0.35, threshold=0.86,
           extra={"cause_class": "hardware"}),  # a re-emit
        ev("straggler_resolved", ts=T0 + 1800, event_id=EP, rank=2,
           extra={"reason": "recovered", "since": T0 + 600}),
        ev("node_drained", ts=T0 + 900, extra={"reason": "ingero: straggler"}),
        ev("node_drained", node="n4", ts=T0 + 900, extra={"dry_run": True}),
        ev("peer_lag", node="n1", ts=T0 + 100,
           extra={"comm_hash": "ab" * 8, "comm_rank": 5, "lag_p50_ms": 120.0, "state": "start"}),
        ev("peer_lag", node="n1", ts=T0 + 160,
           extra={"comm_hash": "ab" * 8, "comm_rank": 5, "lag_p50_ms": 210.5, "state": "start"}),
        ev("collective_hang", ts=T0 + 2000, event_id=EP[:-1] + "b", extra={"state": "start"}),
        ev("collective_hang", ts=T0 + 2100, event_id=EP[:-1] + "b", extra={"state": "end"}),
        ev("gpu_idle", node="n2", ts=T0 + 3000, event_id=EP[:-1] + "c",
           extra={"state": "start", "gpus": [0, 1], "since": T0 + 3000, "reason": "no_process",
                  "user": "alice"}),
        ev("gpu_idle", node="n2", ts=T0 + 3300, event_id=EP[:-1] + "c",
           extra={"state": "end", "gpus": [0, 1], "since": T0 + 3000, "idle_s": 300.0}),
        ev("straggler_state", job_id="8", ts=T0),  # another job: the caller sorts
    ]  # fmt: skip


def folded() -> dict[str, Any]:
    tally = JobTally("c", "7")
    for event in job_events():
        if event.job_id == "7":
            tally.add(event)
    return tally.verdict(T0, T0 + 3600, 4)


def test_the_fold_says_where_why_and_how_much() -> None:
    v = folded()
    assert v["stragglers"] == [
        {
            "node": "n3",
            "rank": 2,
            "s": 1200.0,
            "episodes": 1,
            "min_score": 0.35,
            "class": "hardware",
        }
    ]
    assert v["straggler_nodes"] == 1 and v["episodes"] == 1
    assert v["worst"] == {"node": "n3", "rank": 2, "class": "hardware", "signal": "gpu_health"}
    assert v["lag"] == {"node": "n1", "rank": 5, "comm": "ab" * 8, "p50_ms": 210.5}
    assert v["hangs"] == 1
    assert v["drains"] == ["n3"]  # a dry run drains nothing
    assert v["gpu_idle"] == {
        "gpu_s": 600.0,
        "nodes": [{"node": "n2", "gpus": [0, 1], "gpu_s": 600.0, "reason": "no_process"}],
    }
    assert v["lost_share"] == pytest.approx(1200 / 3600, abs=1e-4)
    assert (v["start"], v["end"], v["nodes"]) == (T0, T0 + 3600, 4)


def test_events_in_any_order_and_repeated_fold_the_same() -> None:
    events = [e for e in job_events() if e.job_id == "7"]
    tally = JobTally("c", "7")
    for event in [*reversed(events), *events]:
        tally.add(event)
    assert tally.verdict(T0, T0 + 3600, 4) == folded()


def test_open_episodes_run_to_the_end_and_everything_is_clipped() -> None:
    tally = JobTally("c", "7")
    # opened before the job's accounted start, never resolved; an idle episode still open
    tally.add(ev("straggler_state", ts=T0 - 100, rank=0, score=0.2))
    tally.add(ev("gpu_idle", node="n2", ts=T0 + 3500, extra={"state": "start", "gpus": [3]}))
    v = tally.verdict(T0, T0 + 3600)
    assert v["stragglers"][0]["s"] == 3600.0 and v["lost_share"] == 1.0
    assert v["gpu_idle"]["gpu_s"] == 100.0


def test_overlapping_episodes_of_nodes_count_once_in_the_lost_share() -> None:
    tally = JobTally("c", "7")
    for node, a, b in (("n1", 0, 600), ("n2", 300, 900), ("n1", 500, 700)):
        eid = str(uuid.uuid4())
        tally.add(ev("straggler_state", node=node, ts=T0 + a, event_id=eid, score=0.3))
        tally.add(ev("straggler_resolved", node=node, ts=T0 + b, event_id=eid))
    v = tally.verdict(T0, T0 + 1800)
    assert v["lost_share"] == pytest.approx(900 / 1800)
    assert [(r["node"], r["s"]) for r in v["stragglers"]] == [("n1", 700.0), ("n2", 600.0)]
    assert v["episodes"] == 3


def test_a_clean_job_says_so() -> None:
    v = JobTally("c", "7").verdict(T0, T0 + 5400, 2)
    assert v["straggler_nodes"] == 0 and v["lost_share"] == 0.0
    assert human_line(v) == "no straggler, 1h30m"
    assert decode_part(encode_part(v)) == v


def test_the_human_line_first_then_the_machine_form() -> None:
    part = encode_part(folded())
    line, _, token = part.rpartition(" ")
    assert line == (
        "ingero: 1 straggler node (n3 r2 20m), 1 episode, worst n3 hardware, "
        "NCCL lag p50 210.5 ms r5, 1 hang, drained n3, GPU idle 0.2 GPU-h, lost<=33% of 1h00m"
    )
    assert token.startswith("INGERO1:H4sI")  # base64 of gzip, as jobstats' JS1:
    assert decode_part(part) == folded()


def test_the_lowercase_safe_form_survives_lowercasing() -> None:
    part = encode_part(folded(), base32=True)
    assert " INGERO1B32:" in part
    assert decode_part(part.lower()) == folded()
    with pytest.raises(VerdictError):  # base64 does not survive it
        decode_part(encode_part(folded()).lower())


def big_verdict(n: int) -> dict[str, Any]:
    tally = JobTally("c", "7")
    for i in range(n):
        eid = str(uuid.uuid4())
        tally.add(ev("straggler_state", node=f"gpu{i:04d}", ts=T0 + i, event_id=eid,
                     rank=i, score=0.5 - i * 1e-4, extra={"cause_class": "node"}))  # fmt: skip
        tally.add(ev("node_drained", node=f"gpu{i:04d}", ts=T0 + i))
        tally.add(
            ev("gpu_idle", node=f"gpu{i:04d}", ts=T0 + i, extra={"state": "start", "gpus": [0]})
        )
    return tally.verdict(T0, T0 + 3600, n)


@pytest.mark.parametrize("max_bytes", [256, 512, 1024, 4096])
def test_a_verdict_of_1000_straggling_nodes_is_cut_to_the_bound(max_bytes: int) -> None:
    v = big_verdict(1000)
    part = encode_part(v, max_bytes)
    assert len(part.encode()) <= max_bytes
    back = decode_part(part)
    assert back["cut"] > 0 and back["job"] == "7"
    assert back["episodes"] == 1000
    if max_bytes >= 1024:  # room for the lists: the worst first
        assert back["stragglers"][0]["node"] == v["stragglers"][0]["node"]
        assert len(back["stragglers"]) <= MAX_LISTED and back["straggler_nodes"] == 1000


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 60), max_bytes=st.integers(256, 4096), b32=st.booleans())
def test_every_part_fits_and_decodes(n: int, max_bytes: int, b32: bool) -> None:
    part = encode_part(big_verdict(n), max_bytes, b32)
    assert len(part.encode()) <= max_bytes
    assert decode_part(part)["v"] == 1


def test_the_site_text_is_kept_and_only_ingero_part_replaced() -> None:
    site = "site: checked by ops, ticket 42"
    first = merge_admin_comment(site, encode_part(folded()))
    assert first.startswith(site + " ingero: ")
    again = merge_admin_comment(first, encode_part(JobTally("c", "7").verdict(T0, T0 + 60)))
    assert again.count("ingero:") == 1 and again.startswith(site + " ingero: no straggler")
    assert split_admin_comment(again) == (site, again[len(site) + 1 :])
    assert merge_admin_comment(None, "ingero: x INGERO1:AAAA") == "ingero: x INGERO1:AAAA"
    # a part in the middle (another tool appended after it) comes out, the rest stays
    middle = f"{site} ingero: x INGERO1:AAAA tail text"
    assert split_admin_comment(middle)[0] == f"{site} tail text"


@pytest.mark.parametrize("name", ["a", "aa", "aaa", "aaaa", "aaaaa", "aaaaaa", "x" * 40])
def test_jobstats_reads_its_own_part_after_ingero_added_its_own(name: str) -> None:
    """jobstats decodes ``data[4:]`` as one base64 run (jobstats.py: gzip.decompress(
    base64.b64decode(self.data[4:]))), padded or not: the glue token ends it."""
    stats = {"nodes": {name: {"cpus": 4}}, "total_time": 50944}
    js1 = "JS1:" + base64.b64encode(gzip.compress(json.dumps(stats).encode())).decode()
    text = merge_admin_comment(js1, encode_part(folded()))
    assert json.loads(gzip.decompress(base64.b64decode(text[4:]))) == stats
    assert split_admin_comment(text)[0] == js1
    assert decode_part(split_admin_comment(text)[1] or "") == folded()
    # rewriting replaces ingero's part only, glue and all
    rewritten = merge_admin_comment(text, encode_part(folded()))
    assert rewritten == text


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_splits_without_error_and_keeps_what_is_not_ingero(text: str) -> None:
    site, part = split_admin_comment(text)
    if part is None:
        assert site == text
    with contextlib.suppress(VerdictError):
        decode_part(text)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(["INGERO1:", "INGERO1B32:", "ingero1:"]))
def test_the_decoder_refuses_garbage_with_one_error(blob: bytes, prefix: str) -> None:
    text = "ingero: x " + prefix + base64.b64encode(blob).decode()
    with pytest.raises(VerdictError):
        decode_part(text)


def test_a_verdict_of_another_version_is_refused() -> None:
    token = base64.b64encode(gzip.compress(b'{"v": 2}')).decode()
    with pytest.raises(VerdictError, match="not a version 1 verdict"):
        decode_part(f"ingero: x INGERO1:{token}")
    with pytest.raises(VerdictError, match="no ingero verdict"):
        decode_part("JS1:H4sI")
