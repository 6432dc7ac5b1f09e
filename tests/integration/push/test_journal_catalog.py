"""The shipped journal catalog (systemd/catalog/ingero.catalog): journalctl compiles it and
``journalctl -x`` shows its explanation under an ingero entry, in a real journald."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ingero.schema.events import MESSAGE_IDS
from ingero.security.audit import AUDIT_MESSAGE_ID, OPEN_LISTENER_MESSAGE_ID
from ingero.slurm.hooks import HOOK_PROBLEM_MESSAGE_ID
from tests.integration.journald_harness import run_with_journald, unavailable

ROOT = Path(__file__).resolve().parents[3]
CATALOG = ROOT / "systemd" / "catalog" / "ingero.catalog"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("journalctl") is None, reason="journalctl not installed"),
]


def _installed(tmp_path: Path) -> Path:
    """A private root with the catalog installed where the package puts it, compiled."""
    root = tmp_path / "root"
    (root / "usr/lib/systemd/catalog").mkdir(parents=True)
    shutil.copy(CATALOG, root / "usr/lib/systemd/catalog/ingero.catalog")
    result = subprocess.run(
        ["journalctl", f"--root={root}", "--update-catalog"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # journalctl logs a bad entry and goes on; a clean catalog says nothing at all
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return root


def test_every_message_id_has_one_entry_and_journalctl_compiles_it(tmp_path: Path) -> None:
    ids = re.findall(r"^-- ([0-9a-f]{32})$", CATALOG.read_text(), re.M)
    assert sorted(ids) == sorted(
        {*MESSAGE_IDS.values(), HOOK_PROBLEM_MESSAGE_ID, AUDIT_MESSAGE_ID, OPEN_LISTENER_MESSAGE_ID}
    )
    root = _installed(tmp_path)
    listed = subprocess.run(
        ["journalctl", f"--root={root}", "--list-catalog"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for kind, message_id in MESSAGE_IDS.items():
        assert re.search(rf"^{message_id} ingero: ", listed, re.M), kind


WRITER = r"""
import json
from ingero.schema.events import Event
from ingero.runtime.journald import JournalWriter
w = JournalWriter()
ev = Event(type="node_drained", node_id="gpu-07", cluster_id="c1", timestamp=1.0, job_id="4711",
           score=0.3, threshold=0.7, extra={"reason": "ingero: straggler"})
assert w.write(ev.journal_fields())
print(json.dumps({"id": ev.event_id}))
"""


def test_journalctl_x_explains_an_ingero_entry(tmp_path: Path) -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    root = _installed(tmp_path)
    # journalctl -x reads the compiled database at its fixed path: in the harness's private
    # mount namespace a tmpfs over the directory holds ours, the host's is left alone.
    script = (
        f"{sys.executable} -c '{WRITER}' && journalctl --sync 2>/dev/null;"
        " mount -t tmpfs ingero-catalog /var/lib/systemd/catalog &&"
        f" cp {root}/var/lib/systemd/catalog/database /var/lib/systemd/catalog/database &&"
        f" journalctl -x --no-pager -o short MESSAGE_ID={MESSAGE_IDS['node_drained']}"
    )
    result = run_with_journald(["bash", "-c", script], cwd=ROOT)
    assert result.returncode == 0, result.stderr
    first, _, shown = result.stdout.partition("\n")
    assert json.loads(first)["id"]
    assert "ingero node_drained: node gpu-07 job 4711" in shown
    # the catalog's subject and text, with the entry's fields filled in
    assert "Subject: ingero: node gpu-07 drained" in shown
    assert "scontrol show node gpu-07" in shown
