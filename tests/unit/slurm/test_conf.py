"""Merging ingero's hook settings into a site's slurm.conf (ingero.slurm.slurmconf) and the
``ingero slurm-conf`` command around it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingero.cli.main import main
from ingero.slurm.slurmconf import (
    Hooks,
    Link,
    SlurmConfConflict,
    merge,
    missing_links,
    read_text,
)

HOOKS = Hooks.in_dir("/usr/lib/ingero/slurm")
CONF = "/etc/slurm/slurm.conf"
SITE = """# site slurm.conf
ClusterName=lab
SlurmctldHost=ctl
NodeName=gpu[01-04] CPUs=64 Gres=gpu:8 State=UNKNOWN
PartitionName=gpu Nodes=ALL Default=YES
"""


def effective(text: str, files: dict[str, str] | None = None) -> dict[str, str]:
    """Key -> last value, as Slurm reads it (for checking a merge's outcome)."""
    from ingero.slurm.slurmconf import _walk

    settings = _walk(text.splitlines(), CONF, "/etc/slurm", (files or {}).get, 0, [])
    return {s.key: s.value for s in settings}


def test_a_plain_site_conf_gets_all_four_settings_appended() -> None:
    result = merge(SITE, HOOKS, CONF)
    assert result.text.startswith(SITE)
    assert effective(result.text) == {
        "PrologFlags": "Alloc",
        "Prolog": HOOKS.prolog,
        "Epilog": HOOKS.epilog,
        "TaskProlog": HOOKS.taskprolog,
    }
    assert len(result.changes) == 4 and result.links == ()
    again = merge(result.text, HOOKS, CONF)
    assert again.text == result.text and again.changes == ()


def test_site_flags_are_kept_and_alloc_joins_them_in_place() -> None:
    text = SITE + "prologflags=Serial,DeferBatch   # keep this comment\n"
    result = merge(text, HOOKS, CONF)
    assert "prologflags=Serial,DeferBatch,Alloc   # keep this comment\n" in result.text
    assert result.text.count("Alloc") == 1
    assert result.changes[0].startswith("line 6: PrologFlags=Serial,DeferBatch -> ")


@pytest.mark.parametrize("flags", ["Alloc", "Contain", "X11,Serial", "serial,contain"])
def test_flags_that_run_the_prolog_at_allocation_are_left_alone(flags: str) -> None:
    result = merge(SITE + f"PrologFlags={flags}\n", HOOKS, CONF)
    assert f"PrologFlags={flags}\n" in result.text
    assert effective(result.text)["PrologFlags"] == flags


def test_keys_of_node_and_partition_records_are_not_global_settings() -> None:
    text = SITE + "NodeName=x Prolog=/not/a/global Epilog=/nor/this\n"
    assert effective(merge(text, HOOKS, CONF).text)["Prolog"] == HOOKS.prolog


def test_a_site_prolog_is_a_conflict_named_with_its_line() -> None:
    with pytest.raises(SlurmConfConflict) as info:
        merge(SITE + "Prolog=/etc/slurm/site-prolog\n", HOOKS, CONF)
    message = str(info.value)
    assert "Prolog=/etc/slurm/site-prolog" in message and "line 6" in message
    assert "Prolog=/etc/slurm/prolog.d/*" in message and "\n" not in message


def test_a_site_taskprolog_is_a_conflict() -> None:
    with pytest.raises(SlurmConfConflict, match="single TaskProlog"):
        merge(SITE + "TaskProlog=/etc/slurm/task.sh\n", HOOKS, CONF)


@pytest.mark.parametrize(
    ("pattern", "link"),
    [
        ("/etc/slurm/prolog.d/*", "/etc/slurm/prolog.d/ingero"),
        ("/etc/slurm/prolog.d/*.sh", "/etc/slurm/prolog.d/ingero.sh"),
        ("/etc/slurm/prolog.d/[0-9]*", "/etc/slurm/prolog.d/50-ingero"),
    ],
)
def test_a_prolog_glob_gets_a_link_and_no_edit(pattern: str, link: str) -> None:
    text = SITE + f"PrologFlags=Alloc\nProlog={pattern}\nEpilog={HOOKS.epilog}\n"
    text += f"TaskProlog={HOOKS.taskprolog}\n"
    result = merge(text, HOOKS, CONF)
    assert result.text == text and result.changes == ()
    assert result.links == (Link(link, HOOKS.prolog),)


def test_a_glob_no_link_name_matches_is_a_conflict() -> None:
    with pytest.raises(SlurmConfConflict, match="none of the names"):
        merge(SITE + "Epilog=/etc/slurm/epilog.d/site-*\n", HOOKS, CONF)


def test_an_included_setting_decides_and_is_never_edited() -> None:
    site = SITE + "Include site-hooks.conf\n"
    ok = {"/etc/slurm/site-hooks.conf": "PrologFlags=Contain\n"}
    result = merge(site, HOOKS, CONF, ok.get)
    assert effective(result.text, ok)["PrologFlags"] == "Contain"
    assert not any("PrologFlags" in c for c in result.changes)
    serial = {"/etc/slurm/site-hooks.conf": "# flags\nPrologFlags=Serial\n"}
    with pytest.raises(SlurmConfConflict) as info:
        merge(site, HOOKS, CONF, serial.get)
    assert "/etc/slurm/site-hooks.conf line 2" in str(info.value)
    assert "PrologFlags=Serial,Alloc" in str(info.value)


def test_a_later_include_overrides_slurm_conf_itself() -> None:
    site = SITE + f"Prolog={HOOKS.prolog}\nInclude /etc/slurm/late.conf\n"
    files = {"/etc/slurm/late.conf": "Prolog=/opt/site/prolog\n"}
    with pytest.raises(SlurmConfConflict, match=r"/etc/slurm/late\.conf line 1"):
        merge(site, HOOKS, CONF, files.get)


def test_an_unreadable_include_is_a_conflict() -> None:
    with pytest.raises(SlurmConfConflict, match=r"cannot read /etc/slurm/gone\.conf"):
        merge(SITE + "Include gone.conf\n", HOOKS, CONF)


def test_the_earlier_playbooks_include_is_replaced_by_merged_settings() -> None:
    site = SITE + "PrologFlags=Serial\nInclude /etc/slurm/ingero.conf\n"
    result = merge(site, HOOKS, CONF)  # its content is never read
    assert "ingero.conf" not in result.text
    assert effective(result.text)["PrologFlags"] == "Serial,Alloc"
    assert any("earlier ingero snippet" in c for c in result.changes)


_FLAGS = st.lists(
    st.sampled_from(["Serial", "DeferBatch", "NoHold", "Alloc", "Contain", "ForceRequeueOnFail"]),
    unique=True,
    max_size=3,
)


@given(
    flags=st.none() | _FLAGS,
    prolog=st.sampled_from([None, HOOKS.prolog, "/etc/slurm/prolog.d/*"]),
    epilog=st.sampled_from([None, HOOKS.epilog, "/etc/slurm/epilog.d/*.sh"]),
    taskprolog=st.sampled_from([None, HOOKS.taskprolog]),
    order=st.permutations(range(4)),
)
def test_any_mergeable_site_conf_ends_merged_and_stays_so(
    flags: list[str] | None,
    prolog: str | None,
    epilog: str | None,
    taskprolog: str | None,
    order: list[int],
) -> None:
    lines = [
        None if flags is None else f"PrologFlags={','.join(flags)}",
        None if prolog is None else f"Prolog={prolog}",
        None if epilog is None else f"Epilog={epilog}",
        None if taskprolog is None else f"TaskProlog={taskprolog}",
    ]
    text = SITE + "".join(f"{lines[i]}\n" for i in order if lines[i] is not None)
    result = merge(text, HOOKS, CONF)
    got = effective(result.text)
    names = {f.lower() for f in got["PrologFlags"].split(",")}
    assert names & {"alloc", "contain"}
    assert set(flags or []) <= set(got["PrologFlags"].split(","))  # nothing of the site's lost
    for key, glob in (("Prolog", prolog), ("Epilog", epilog)):
        assert got[key] == (glob if glob and "*" in glob else HOOKS.path_for(key))
    assert got["TaskProlog"] == HOOKS.taskprolog
    assert len(result.links) == sum(1 for v in (prolog, epilog) if v and "*" in v)
    again = merge(result.text, HOOKS, CONF)
    assert again.text == result.text and again.changes == ()


def test_missing_links_checks_what_is_in_place(tmp_path: Path) -> None:
    prolog_d = tmp_path / "prolog.d"
    prolog_d.mkdir()
    wanted = Link(str(prolog_d / "ingero"), HOOKS.prolog)
    assert missing_links((wanted,)) == [wanted]
    os.symlink(HOOKS.prolog, wanted.path)
    assert missing_links((wanted,)) == []
    taken = Link(str(prolog_d / "other"), HOOKS.prolog)
    Path(taken.path).write_text("#!/bin/sh\n")
    with pytest.raises(SlurmConfConflict, match="is not a link to"):
        missing_links((taken,))
    with pytest.raises(SlurmConfConflict, match="does not exist"):
        missing_links((Link(str(tmp_path / "nodir" / "ingero"), HOOKS.prolog),))
    assert read_text(str(tmp_path / "nope")) is None


# ---- ingero slurm-conf ------------------------------------------------------------------


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(["slurm-conf", *argv])
    out, err = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 1), out, err


def test_cli_prints_checks_writes_and_keeps_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(SITE + "PrologFlags=Serial\nEpilog=" + str(tmp_path / "epilog.d") + "/*\n")
    conf.chmod(0o644)
    (tmp_path / "epilog.d").mkdir()
    before = conf.read_text()
    code, out, err = run(["--file", str(conf)], capsys)
    assert code == 0 and "PrologFlags=Serial,Alloc" in out and conf.read_text() == before
    assert "link " + str(tmp_path / "epilog.d" / "ingero") in err
    assert run(["--file", str(conf), "--check"], capsys)[0] == 1
    code, _, err = run(["--file", str(conf), "--write"], capsys)
    assert code == 0 and "scontrol reconfigure" in err
    assert stat.S_IMODE(conf.stat().st_mode) == 0o644
    assert os.readlink(tmp_path / "epilog.d" / "ingero") == HOOKS.epilog
    assert effective(conf.read_text())["PrologFlags"] == "Serial,Alloc"
    assert run(["--file", str(conf), "--check"], capsys)[0] == 0
    written = conf.read_text()
    assert run(["--file", str(conf), "--write"], capsys)[0] == 0
    assert conf.read_text() == written


def test_cli_conflict_is_one_line_exit_65_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(SITE + "TaskProlog=/opt/site/task\n")
    code, out, err = run(["--file", str(conf), "--write"], capsys)
    assert code == 65 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"ingero: {conf}: TaskProlog=/opt/site/task")
    assert conf.read_text() == SITE + "TaskProlog=/opt/site/task\n"


def test_cli_reads_slurm_conf_from_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(SITE)
    monkeypatch.setenv("SLURM_CONF", str(conf))
    code, out, _ = run(["--hooks-dir", "/opt/h"], capsys)
    assert code == 0 and "TaskProlog=/opt/h/taskprolog" in out
