"""The README's two "Try it" commands run as written in a root shell without sudo (a fresh
Debian 12 root shell often has none) and through sudo where it is installed. apt-get,
python3, the venv's pip and ingero, and tests/run.sh are stand-ins that record how they were
called: what is under test is the command lines themselves."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def try_it_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Try it", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    return [b.strip() for b in blocks]


def stub(path: Path, body: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> "$CALLS"\n{body}')
    path.chmod(0o755)


def run(command: str, shell: str, tmp: Path, with_sudo: bool) -> list[str]:
    work, bin_dir = tmp / "work", tmp / "bin"
    stub(bin_dir / "apt-get")
    # python3 -m venv .venv: a venv whose pip and ingero record their calls too
    stub(
        bin_dir / "python3",
        "mkdir -p .venv/bin\nfor t in pip ingero; do\n"
        '  printf \'#!/bin/sh\\necho "$(basename "$0") $*" >> "$CALLS"\\n\' > .venv/bin/$t\n'
        "  chmod +x .venv/bin/$t\ndone\n",
    )
    stub(work / "tests" / "run.sh")
    if with_sudo:
        stub(bin_dir / "sudo", 'exec "$@"\n')
    tools = tmp / "tools"  # the few host tools the stand-ins use; no sudo among them
    tools.mkdir()
    for tool in ("mkdir", "chmod", "basename"):
        (tools / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    calls = tmp / "calls"
    result = subprocess.run(
        [shell, "-c", command],
        cwd=work,
        env={"PATH": f"{bin_dir}:{tools}", "CALLS": str(calls)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return calls.read_text().splitlines()


def test_the_readme_has_exactly_two_one_line_commands() -> None:
    commands = try_it_commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    assert not any(c.startswith("sudo ") for c in commands)


@pytest.mark.parametrize("shell", ["/bin/sh", "/bin/bash"])
@pytest.mark.parametrize("with_sudo", [False, True])
def test_the_commands_run_with_and_without_sudo(
    shell: str, with_sudo: bool, tmp_path: Path
) -> None:
    demo, suite = try_it_commands()
    via = ["sudo apt-get install -y python3-venv"] if with_sudo else []
    assert run(demo, shell, tmp_path / "demo", with_sudo) == [
        *via,
        "apt-get install -y python3-venv",
        "python3 -m venv .venv",
        "pip install -e .",
        "ingero demo",
    ]
    via = ["sudo ./tests/run.sh"] if with_sudo else []
    assert run(suite, shell, tmp_path / "suite", with_sudo) == [*via, "run.sh "]
