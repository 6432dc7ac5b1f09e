#!/usr/bin/python
# The merge itself is ingero.slurm.slurmconf (module_utils/ingero_slurmconf.py links to it),
# the same code `ingero slurm-conf` runs and the unit tests cover.
"""Ansible module: merge ingero's Slurm hook settings into slurm.conf."""

from __future__ import annotations

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.ingero_slurmconf import (
    HOOKS_DIR,
    Hooks,
    SlurmConfConflict,
    merge,
    missing_links,
    read_text,
)

DOCUMENTATION = r"""
module: ingero_slurm_conf
short_description: Merge ingero's PrologFlags, Prolog, Epilog and TaskProlog into slurm.conf
description:
  - Keeps the site's flags and hooks; a setting that cannot be merged fails the task with
    one line naming it (see ingero's docs/slurm.md). Supports check mode and diff.
options:
  path:
    description: The slurm.conf to edit.
    type: path
    default: /etc/slurm/slurm.conf
  hooks_dir:
    description: Where ingero's prolog, epilog and taskprolog are installed.
    type: path
    default: /usr/lib/ingero/slurm
  backup:
    description: Keep a time-stamped copy of the file before changing it.
    type: bool
    default: false
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/etc/slurm/slurm.conf"},
            "hooks_dir": {"type": "path", "default": HOOKS_DIR},
            "backup": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    text = read_text(path)
    if text is None:
        module.fail_json(msg=f"cannot read {path}")
    try:
        result = merge(text, Hooks.in_dir(module.params["hooks_dir"]), path, read_text)
        links = missing_links(result.links)
    except SlurmConfConflict as exc:
        module.fail_json(msg=f"{path}: {exc}")
    changed = result.text != text or bool(links)
    outcome = {
        "changed": changed,
        "changes": list(result.changes),
        "links": [f"{link.path} -> {link.target}" for link in links],
        "diff": {"before": text, "after": result.text, "before_header": path,
                 "after_header": path},
    }
    if changed and not module.check_mode:
        if result.text != text:
            target = os.path.realpath(path)
            if module.params["backup"]:
                outcome["backup_file"] = module.backup_local(target)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".slurm.conf.")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(result.text)
            module.atomic_move(tmp, target)  # keeps the file's owner, mode and context
        for link in links:
            os.symlink(link.target, link.path)
    module.exit_json(**outcome)


if __name__ == "__main__":
    main()
