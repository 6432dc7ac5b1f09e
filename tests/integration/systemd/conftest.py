"""Fixtures: built artefacts (wheelhouse archive, .deb) and booted systemd containers."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.systemd.sysdns import SystemdContainer, unavailable_reason

ROOT = Path(__file__).resolve().parents[3]
BUILD = ROOT / "build"


@dataclass(frozen=True)
class Artefacts:
    wheelhouse_tar: Path
    deb: Path


@pytest.fixture(scope="session")
def artefacts() -> Artefacts:
    """Build once per run; the dependency wheels are cached in build/wheelhouse across runs."""
    if not Path("/usr/bin/python3.11").exists():
        pytest.skip("Debian's python3.11 is needed to build the package's venv")
    result = subprocess.run(
        [str(ROOT / "packaging/build-deb.sh"), str(BUILD)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    deb = Path(result.stdout.strip().splitlines()[-1])
    tars = sorted(BUILD.glob("ingero-wheelhouse-*.tar"))
    assert deb.is_file() and tars
    return Artefacts(wheelhouse_tar=tars[-1], deb=deb)


@pytest.fixture(scope="session")
def can_boot() -> None:
    why = unavailable_reason()
    if why:
        pytest.skip(why)


@pytest.fixture
def boot(can_boot: None) -> Iterator[Callable[[str], SystemdContainer]]:
    """Boot containers (own network namespace: default ports never clash); all go down after."""
    started: list[SystemdContainer] = []

    def _boot(tag: str) -> SystemdContainer:
        container = SystemdContainer(f"ingero-{tag}-{os.getpid()}-{len(started)}")
        started.append(container)
        try:
            container.up(net=True)
        except RuntimeError as exc:
            pytest.skip(str(exc))
        return container

    try:
        yield _boot
    finally:
        for container in started:
            container.down()
