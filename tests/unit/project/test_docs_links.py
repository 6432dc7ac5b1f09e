"""Links into docs/benchmarks.md and docs/decisions/ resolve: every `benchmarks.md#anchor` in the
repository names a heading the file has (as GitHub makes its anchors), every decision record
named exists and is in the records' index, a code comment that cites benchmarks.md names its
section, the README's figures are the table's, and benchmarks.md stays a reference one reads
in minutes (under 800 lines)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

THIS = Path(__file__).resolve()
ROOT = THIS.parents[3]
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
DECISIONS = ROOT / "docs" / "decisions"
MAX_LINES = 800
# Where links and citations live: sources, docs, deploy files; not the venv or build output.
ROOTS = ("ingero", "bench", "tests", "docs", "contrib", "systemd", "slurm", "packaging", "ansible")
SUFFIXES = {".py", ".md", ".c", ".h", ".sh", ".j2", ".toml", ".yml", ".yaml", ".service", ".cfg"}
CODE_ROOTS = ("ingero", "bench", "tests")

ANCHOR_LINK = re.compile(r"benchmarks\.md#([\w-]+)")
DECISION_LINK = re.compile(r"decisions/(\d{4}-[\w.-]+?\.md)(?:#([\w-]+))?")
LOCAL_DECISION_LINK = re.compile(r"\]\((\d{4}-[\w.-]+?\.md)(?:#([\w-]+))?\)")
SELF_LINK = re.compile(r"\]\(#([\w-]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text without markup, lower case, punctuation dropped
    (letters, digits, `_` and `-` kept), spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[`*]", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every anchor a Markdown file's headings make, a repeated one with GitHub's -1, -2."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", markdown)):
        base = slug(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def files() -> list[Path]:
    found = list(ROOT.glob("*.md"))
    for top in ROOTS:
        found += [
            p
            for p in (ROOT / top).rglob("*")
            if p.suffix in SUFFIXES and p.is_file() and p.resolve() != THIS
        ]
    return sorted(found)


def broken_links(text: str, in_decisions: bool, bench: str, records: dict[str, str]) -> list[str]:
    """What in `text` points at a heading benchmarks.md lacks, or a decision record (or a
    heading in one) that does not exist. In a record, `](NNNN-….md)` names a record too."""
    bad = [f"benchmarks.md#{a}" for a in ANCHOR_LINK.findall(text) if a not in anchors(bench)]
    links = DECISION_LINK.findall(text)
    if in_decisions:
        links += LOCAL_DECISION_LINK.findall(text)
    for name, anchor in links:
        if name not in records:
            bad.append(f"decisions/{name}")
        elif anchor and anchor not in anchors(records[name]):
            bad.append(f"decisions/{name}#{anchor}")
    return bad


def load_records() -> dict[str, str]:
    return {p.name: p.read_text() for p in DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md")}


def test_every_link_into_benchmarks_and_decisions_resolves() -> None:
    bench, records = BENCHMARKS.read_text(), load_records()
    bad = {}
    for path in files():
        text = path.read_text(errors="replace")
        found = broken_links(text, path.parent == DECISIONS, bench, records)
        if found:
            bad[str(path.relative_to(ROOT))] = found
    assert not bad, f"links to headings or records that do not exist: {bad}"


def test_links_within_benchmarks_and_records_resolve() -> None:
    for path in [BENCHMARKS, *sorted(DECISIONS.glob("*.md"))]:
        text = path.read_text()
        bad = [a for a in SELF_LINK.findall(text) if a not in anchors(text)]
        assert not bad, f"{path.relative_to(ROOT)}: no heading for {bad}"


def test_the_checker_finds_a_broken_anchor_and_a_missing_record() -> None:
    bench = "# Benchmarks\n\n## Fleet's push path\n\n### OTLP/gRPC\n\n## Echo\n\n### Ingest\n"
    records = {"0001-a.md": "# 0001. A\n\n## Figures that decided\n"}
    good = (
        "docs/benchmarks.md#fleets-push-path, benchmarks.md#otlpgrpc, "
        "docs/decisions/0001-a.md, decisions/0001-a.md#figures-that-decided"
    )
    assert broken_links(good, False, bench, records) == []
    assert broken_links("(docs/benchmarks.md#fleet-push-ingest)", False, bench, records) == [
        "benchmarks.md#fleet-push-ingest"
    ]
    assert broken_links("docs/decisions/0002-b.md", False, bench, records) == [
        "decisions/0002-b.md"
    ]
    assert broken_links("[0002](0002-b.md)", True, bench, records) == ["decisions/0002-b.md"]
    assert broken_links("decisions/0001-a.md#why", False, bench, records) == [
        "decisions/0001-a.md#why"
    ]


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Fleet's push path", "fleets-push-path"),
        ("Where a full push's time goes", "where-a-full-pushs-time-goes"),
        ("OTLP/gRPC", "otlpgrpc"),
        ("Fleet's `/metrics`", "fleets-metrics"),
        ("Building Slurm 25.11 for the tests", "building-slurm-2511-for-the-tests"),
        ("Drain controller vs. a frozen slurmctld", "drain-controller-vs-a-frozen-slurmctld"),
        (
            "On a real H200: stacks, CUDA graphs and NCCL",
            "on-a-real-h200-stacks-cuda-graphs-and-nccl",
        ),
    ],
)
def test_anchors_are_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_repeated_heading_gets_a_numbered_anchor() -> None:
    assert anchors("## Ingest\n\n### Ingest\n\n```\n# not a heading\n```\n") == {
        "ingest",
        "ingest-1",
    }


def test_benchmarks_stays_under_800_lines() -> None:
    lines = len(BENCHMARKS.read_text().splitlines())
    assert lines < MAX_LINES, f"docs/benchmarks.md has {lines} lines: move history to a record"


def test_a_code_comment_citing_benchmarks_names_its_section() -> None:
    bare = []
    for top in CODE_ROOTS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in {".py", ".c", ".h", ".sh"} or path.resolve() == THIS:
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if re.search(r"benchmarks\.md(?!#[\w-])", line):
                    bare.append(f"{path.relative_to(ROOT)}:{n}")
    assert not bare, f"cite docs/benchmarks.md#<section>: {bare}"


def test_the_readmes_figures_are_benchmarks_figures() -> None:
    # The README quotes a few of today's figures: each is in benchmarks.md's table.
    section = (ROOT / "README.md").read_text().split("## Design and figures", 1)[1]
    section = section.split("\n## ", 1)[0]
    number = r"\d(?:[\d,]*\d)?(?:\.\d+)?"
    figure = re.compile(rf"(?<![\w.,]){number}(?:\u2013{number})?(?![\w.,]?\d)")
    quoted = {f for f in figure.findall(section) if len(f.replace(",", "")) > 1}
    assert quoted, "the README quotes no figure"
    text = BENCHMARKS.read_text().split("## Where things stand", 1)[1].split("\n## ", 1)[0]
    missing = sorted(
        f for f in quoted if not re.search(rf"(?<![\w.,]){re.escape(f)}(?![\w]|[.,]\d)", text)
    )
    assert not missing, f"README figures not in docs/benchmarks.md's table: {missing}"


def test_every_decision_record_is_dated_decided_and_indexed() -> None:
    index = (DECISIONS / "README.md").read_text()
    numbers = []
    for name, text in sorted(load_records().items()):
        numbers.append(int(name[:4]))
        assert text.startswith(f"# {name[:4]}. "), name
        assert re.search(r"^- Date: 20\d\d-\d\d-\d\d", text, re.M), name
        assert re.search(r"^Decision: \S", text, re.M), name
        assert f"]({name})" in index, f"{name} is not in docs/decisions/README.md"
    assert numbers == list(range(1, len(numbers) + 1)), "records are numbered 0001, 0002, …"
