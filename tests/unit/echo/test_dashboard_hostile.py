"""The dashboard's renderers fuzzed with hostile ids: the JSON embedded in the job page holds
no ``<``, ``>`` or ``&`` and parses back to its data, and each copy-paste shell command is,
once unescaped, exactly its words for the shell, whatever a node or job id holds."""

from __future__ import annotations

import json
import shlex
import tempfile
from collections.abc import Iterator
from html import unescape
from html.parser import HTMLParser
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.dashboard import CLUSTER, START, fill, job_id
from ingero.echo.auth import Principal
from ingero.echo.dashboard import view
from ingero.echo.rates import GpuRates
from ingero.echo.service import Service
from ingero.echo.store import Store
from ingero.runtime.clock import ManualClock

HOSTILE = [
    "<!--<script>",
    "</script><script>alert(1)</script>",
    "n$(touch /tmp/pwned)",
    "n`id`",
    "a'b\"c",
    "x; rm -rf ~",
    "&amp;&lt;",
    "\u2028\u2029",
    "-n --help",
    "",
    "]]><![CDATA[",
    "<svg onload=alert(1)>",
]
ids = st.one_of(st.sampled_from(HOSTILE), st.text(min_size=1, max_size=24))


@pytest.fixture(scope="module")
def answers() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """A real 10-rank job's timeline and report (a real store, Echo's questions)."""
    with tempfile.TemporaryDirectory() as tmp:
        clock = ManualClock(start=START + 3600.0)
        store = Store(f"{tmp}/e.db", clock=clock)
        try:
            fill(store, 10)
            svc = Service(store.path, GpuRates("USD", 1.0, {}), clock=clock)
            args = {"cluster_id": CLUSTER, "job_id": job_id(10)}
            yield (
                svc.answer("job_timeline", args, Principal("ops")),
                svc.answer("job_report", args, Principal("ops")),
            )
        finally:
            store.close()


def substitute(value: Any, names: dict[str, str]) -> Any:
    """``value`` with every string that is a key of ``names`` replaced by its value."""
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, list):
        return [substitute(v, names) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, names) for k, v in value.items()}
    return value


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.starts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.starts.append(tag)


def codes(page: str) -> list[list[str]]:
    """The words of each copy-paste ``ingero`` command, as a shell reads them."""
    out = []
    for part in page.split("<code>")[1:]:
        text = unescape(part.split("</code>")[0])
        if text.startswith("ingero "):
            out.append(shlex.split(text))
    return out


@settings(deadline=None, max_examples=60)
@given(st.lists(ids, min_size=3, max_size=3), ids)
def test_hostile_ids_stay_data_in_the_json_and_words_in_the_commands(
    answers: tuple[dict[str, Any], dict[str, Any]], nodes: list[str], job: str
) -> None:
    timeline, report = answers
    straggler = report["stragglers"][0]["node_id"]
    names = {straggler: nodes[0], "n10-0000": nodes[1], "n10-0001": nodes[2], job_id(10): job}
    timeline, report = substitute(timeline, names), substitute(report, names)
    page = view.job_page(CLUSTER, timeline, report, running=False, signed_in=False)

    block = page.split('<script type="application/json" id="scores-data">')[1]
    block = block.split("</script>")[0]
    assert not {"<", ">", "&"} & set(block) and block.isascii()
    expected = {
        "band": [[b["t"], b["min"], b["mean"], b["max"]] for b in timeline["band"]],
        "series": timeline["series"],
        "thresholds": timeline["thresholds"],
    }
    assert json.loads(block) == expected

    assert ["ingero", "explain", "--nodes", nodes[0], "--job", job] in codes(page)
    assert ["ingero", "export", "--job-nodes", job] in codes(page)

    tags = Tags()
    tags.feed(page)
    assert tags.starts.count("script") == 3  # the JSON block and the two vendored scripts


def test_embedded_json_escapes_what_html_would_read() -> None:
    text = view.embed_json({"id": "</script><!--<script>&\u2028"})
    assert text == '{"id":"\\u003c/script\\u003e\\u003c!--\\u003cscript\\u003e\\u0026\\u2028"}'
    assert json.loads(text) == {"id": "</script><!--<script>&\u2028"}


def test_a_shell_command_quotes_each_word_then_escapes_the_html() -> None:
    assert view.shell_command("ingero", "explain", "--nodes", "n$(touch x)<b>") == (
        "ingero explain --nodes &#x27;n$(touch x)&lt;b&gt;&#x27;"
    )
