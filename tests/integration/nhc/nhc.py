"""LBNL NHC for the tests, from the vendored release (Debian 12 has no lbnl-nhc package).

The tarball is unpacked into a temporary directory and laid out as ``make install`` lays
it out, without building anything (NHC is bash): the driver ``nhc``, a configuration
directory whose ``scripts/`` holds NHC's own checks and contrib/nhc/ingero.nhc (NHC loads
every ``*.nhc`` there), and the helpers that mark Slurm nodes offline and online.
``INGERO_NHC_TARBALL`` names another copy; without it the tests skip and say why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
TARBALL = Path(
    os.environ.get(
        "INGERO_NHC_TARBALL", str(REPO.parent / "shared" / "vendor" / "lbnl-nhc-1.4.3.tar.xz")
    )
)
# The venv's ingero: NHC resets PATH to the system's, so the check is told where it is.
INGERO = Path(sys.executable).with_name("ingero")


def missing_reason() -> str | None:
    if not TARBALL.exists():
        return f"no LBNL NHC: its source {TARBALL} is absent (Debian 12 packages none)"
    if shutil.which("tar") is None or shutil.which("xz") is None:
        return "tar and xz are needed to unpack LBNL NHC"
    if not INGERO.exists():
        return f"{INGERO} is missing: install ingero into the test venv"
    return None


@dataclass(frozen=True)
class Nhc:
    tree: Path  # the unpacked release
    confdir: Path  # what /etc/nhc is after an install

    @property
    def driver(self) -> Path:
        return self.tree / "nhc"

    @property
    def helpers(self) -> Path:
        return self.tree / "helpers"

    def conf(self, name: str, *lines: str) -> Path:
        """An nhc.conf of check lines (``* || check_ingero ...``)."""
        path = self.confdir / f"{name}.conf"
        path.write_text("".join(f"{line}\n" for line in lines))
        return path

    def argv(self, conf: Path, *settings: str, log: str = "-") -> list[str]:
        """The command line NHC runs with (VAR=value ``settings`` after the options)."""
        return [
            "bash", str(self.driver), "-D", str(self.confdir), "-c", str(conf), "-l", log,
            "-t", "30", f"HELPERDIR={self.helpers}", f"INGERO={INGERO}", *settings,
        ]  # fmt: skip

    def run(self, conf: Path, *settings: str) -> subprocess.CompletedProcess[str]:
        """NHC once, on this host, marking nothing (``MARK_OFFLINE=0``)."""
        return subprocess.run(
            self.argv(conf, "MARK_OFFLINE=0", *settings),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


def install(root: Path, tarball: Path = TARBALL) -> Nhc:
    """Unpack NHC under ``root`` and lay out its configuration directory."""
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-xJf", str(tarball), "-C", str(root)], check=True, timeout=60)
    (tree,) = [p for p in root.iterdir() if p.name.startswith("lbnl-nhc-")]
    confdir = root / "etc-nhc"
    scripts = confdir / "scripts"
    scripts.mkdir(parents=True)
    for script in (tree / "scripts").glob("*.nhc"):
        shutil.copy2(script, scripts / script.name)
    shutil.copy2(REPO / "contrib" / "nhc" / "ingero.nhc", scripts / "ingero.nhc")
    for helper in tree.glob("helpers/*"):
        helper.chmod(0o755)
    # Readable by every user: slurmd runs the HealthCheckProgram as root, but the tree may
    # sit under a directory another test made.
    for path in (root, tree, confdir, scripts):
        path.chmod(0o755)
    return Nhc(tree, confdir)
