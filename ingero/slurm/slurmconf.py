"""Merge ingero's hook settings into a site's slurm.conf, or refuse naming the conflict.

ingero needs four settings in slurm.conf (the same on the controller and every node):
``PrologFlags`` with ``Alloc`` (each node gets its job file at allocation), and ``Prolog``,
``Epilog``, ``TaskProlog`` naming its hooks. A site often has some of them already, so
appending ``key=value`` lines would silently override its flags or its own prolog. The merge:

- ``PrologFlags``: ``Alloc`` is added to the site's flags; nothing changes when ``Alloc``,
  ``Contain`` or ``X11`` (both imply ``Alloc``) is there already.
- ``Prolog`` / ``Epilog``: set when unset; when the site's value is a glob
  (``/etc/slurm/prolog.d/*``, which Slurm expands into several scripts) a link to ingero's
  hook is placed in that directory instead; any other value is a conflict.
- ``TaskProlog``: Slurm runs one; any other value is a conflict.

Settings in files pulled in with ``Include`` are read (they decide the effective value) but
never edited: a change needed there is a conflict naming the file and line. An ``Include``
of ``ingero.conf`` beside slurm.conf (what earlier ingero playbooks added) is removed, its
settings merged into slurm.conf itself.

Standard library only, no other ingero import: the Ansible role (``ansible/roles/
slurm_hooks``) runs this very file on its targets as a module utility, and
``ingero slurm-conf`` runs it on the host.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

# The hooks as the .deb and the Ansible role install them.
HOOKS_DIR = "/usr/lib/ingero/slurm"
# What earlier ingero playbooks wrote beside slurm.conf and included from it.
LEGACY_SNIPPET = "ingero.conf"
MARKER = "# ingero job tagging (ingero slurm-conf; see ingero's docs/slurm.md)"
MAX_INCLUDE_DEPTH = 8

# Lines that describe a record (a node, a partition, ...): their keys are not global settings.
_RECORD_KEYS = frozenset(
    {"nodename", "partitionname", "nodeset", "downnodes", "frontendname", "switchname"}
)
_ASSIGNMENT = re.compile(r"(?<!\S)([A-Za-z][A-Za-z0-9]*)[ \t]*=[ \t]*(\"[^\"]*\"|[^\s\"]+)")
_INCLUDE = re.compile(r"^\s*include\s+(\S+)", re.IGNORECASE)
_GLOB = re.compile(r"[*?\[]")
# Flags that make Slurm run the Prolog at allocation (Contain and X11 imply Alloc).
_ALLOC_FLAGS = frozenset({"alloc", "contain", "x11"})
# Names tried for the link in a site's prolog.d: the first that the site's glob matches.
_LINK_NAMES = ("ingero", "50-ingero", "ingero.sh", "50-ingero.sh")

Reader = Callable[[str], str | None]


class SlurmConfConflict(ValueError):
    """slurm.conf cannot take ingero's settings without changing the site's: one line saying
    which setting, where, and what to do."""


@dataclass(frozen=True)
class Hooks:
    prolog: str
    epilog: str
    taskprolog: str

    @classmethod
    def in_dir(cls, directory: str = HOOKS_DIR) -> Hooks:
        d = directory.rstrip("/") or "/"
        return cls(f"{d}/prolog", f"{d}/epilog", f"{d}/taskprolog")

    def path_for(self, key: str) -> str:
        return {"prolog": self.prolog, "epilog": self.epilog, "taskprolog": self.taskprolog}[
            key.lower()
        ]


@dataclass(frozen=True)
class Link:
    """A symbolic link to create: ``path`` (in the site's hook directory) to ``target``."""

    path: str
    target: str


@dataclass(frozen=True)
class MergeResult:
    text: str
    changes: tuple[str, ...]
    links: tuple[Link, ...]


@dataclass(frozen=True)
class _Setting:
    key: str  # canonical spelling (one of _KEYS)
    value: str
    file: str
    line: int  # 1-based
    start: int  # value's span in the line
    end: int


_KEYS = {"prologflags": "PrologFlags", "prolog": "Prolog", "epilog": "Epilog",
         "taskprolog": "TaskProlog"}  # fmt: skip


def _strip_comment(line: str) -> str:
    cut = line.find("#")
    return line if cut < 0 else line[:cut]


def _settings(lines: list[str], file: str) -> list[_Setting]:
    found: list[_Setting] = []
    for number, raw in enumerate(lines, 1):
        text = _strip_comment(raw)
        first = _ASSIGNMENT.search(text)
        if first is None or first.group(1).lower() in _RECORD_KEYS:
            continue
        for match in _ASSIGNMENT.finditer(text):
            key = _KEYS.get(match.group(1).lower())
            if key is not None:
                found.append(_Setting(key, match.group(2).strip('"'), file, number, *match.span(2)))
    return found


def _resolve(path: str, conf_dir: str) -> str:
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(conf_dir, path))


def _walk(
    lines: list[str], file: str, conf_dir: str, read: Reader, depth: int, legacy: list[int]
) -> list[_Setting]:
    """Every setting in the order Slurm reads it: an Include's settings where it stands.

    Line numbers of slurm.conf's own Includes of the earlier ingero snippet go to ``legacy``
    (those files are skipped: their settings are merged into slurm.conf itself).
    """
    own: dict[int, list[_Setting]] = {}
    for setting in _settings(lines, file):
        own.setdefault(setting.line, []).append(setting)
    ordered: list[_Setting] = []
    for number, raw in enumerate(lines, 1):
        ordered.extend(own.get(number, []))
        match = _INCLUDE.match(_strip_comment(raw))
        if match is None:
            continue
        path = _resolve(match.group(1), conf_dir)
        if depth == 0 and path == os.path.join(conf_dir, LEGACY_SNIPPET):
            legacy.append(number)
            continue
        if depth >= MAX_INCLUDE_DEPTH:
            raise SlurmConfConflict(f"Include nesting deeper than {MAX_INCLUDE_DEPTH} at {path}")
        text = read(path)
        if text is None:
            raise SlurmConfConflict(
                f"cannot read {path} (Include on line {number} of {file}): it may set "
                "PrologFlags or a hook; make it readable, or merge by hand (docs/slurm.md)"
            )
        ordered.extend(_walk(text.splitlines(), path, conf_dir, read, depth + 1, legacy))
    return ordered


def _link_for(pattern: str, target: str, where: str) -> Link:
    directory, name_glob = os.path.split(pattern)
    if _GLOB.search(directory):
        raise SlurmConfConflict(
            f"{where}: the glob {pattern!r} spans directories; ingero links its hook into one "
            "directory only: merge by hand (docs/slurm.md)"
        )
    for name in _LINK_NAMES:
        if fnmatch.fnmatchcase(name, name_glob):
            return Link(os.path.join(directory, name), target)
    raise SlurmConfConflict(
        f"{where}: none of the names {', '.join(_LINK_NAMES)} matches {name_glob!r}; link "
        f"{target} into {directory} under a name that does (docs/slurm.md)"
    )


def merge(
    text: str,
    hooks: Hooks,
    conf_path: str,
    read: Reader | None = None,
) -> MergeResult:
    """slurm.conf ``text`` (at ``conf_path``) with ingero's settings merged in.

    ``read(path)`` returns an included file's text, or None when it cannot be read (the
    default reads nothing: every Include is then unreadable). Raises SlurmConfConflict.
    The result is stable: merging its text again changes nothing.
    """
    reader: Reader = read or (lambda _path: None)
    conf_dir = os.path.dirname(os.path.abspath(conf_path))
    lines = text.splitlines()
    legacy_lines: list[int] = []
    # The last value of a key wins: the merge needs each key's last setting, and whether
    # it is in slurm.conf itself (the only file edited).
    effective: dict[str, _Setting] = {}
    for setting in _walk(lines, conf_path, conf_dir, reader, 0, legacy_lines):
        effective[setting.key] = setting

    edits: dict[int, list[tuple[int, int, str]]] = {}
    appended: list[str] = []
    changes: list[str] = [
        f"removed line {n}: Include of the earlier ingero snippet "
        f"{os.path.join(conf_dir, LEGACY_SNIPPET)}"
        for n in legacy_lines
    ]
    links: list[Link] = []

    def change(key: str, new: str, why: str) -> None:
        current = effective.get(key)
        if current is None:
            appended.append(f"{key}={new}")
            changes.append(f"added {key}={new} ({why})")
            return
        if current.file != conf_path:
            raise SlurmConfConflict(
                f"{key}={current.value} is set in {current.file} line {current.line}, which "
                f"ingero does not edit: make it {key}={new} there ({why}), then run again"
            )
        edits.setdefault(current.line, []).append((current.start, current.end, new))
        changes.append(f"line {current.line}: {key}={current.value} -> {key}={new} ({why})")

    flags = effective.get("PrologFlags")
    names = [f.strip() for f in flags.value.split(",") if f.strip()] if flags else []
    if not {n.lower() for n in names} & _ALLOC_FLAGS:
        change("PrologFlags", ",".join([*names, "Alloc"]), "job files at allocation")

    for key in ("Prolog", "Epilog", "TaskProlog"):
        ours = hooks.path_for(key)
        current = effective.get(key)
        if current is None:
            change(key, ours, "ingero's hook")
            continue
        value = current.value
        if value == ours or fnmatch.fnmatchcase(ours, value):
            continue
        where = f"{key}={value} ({current.file} line {current.line})"
        if key != "TaskProlog" and _GLOB.search(value):
            links.append(_link_for(value, ours, where))
            continue
        if key == "TaskProlog":
            raise SlurmConfConflict(
                f"{where}: Slurm runs a single TaskProlog; have yours also run {ours} (it "
                "prints the INGERO_* export lines), or merge by hand (docs/slurm.md)"
            )
        directory = f"/etc/slurm/{key.lower()}.d"
        raise SlurmConfConflict(
            f"{where}: the site has its own {key.lower()}; put it in a directory such as "
            f"{directory}/ and set {key}={directory}/*, then run again (ingero links "
            f"{ours} there)"
        )

    out = [_apply(line, edits.get(n, [])) for n, line in enumerate(lines, 1)]
    for number in reversed(legacy_lines):
        del out[number - 1]
    if appended:
        if out and out[-1].strip():
            out.append("")
        out.extend([MARKER, *appended])
    merged = "\n".join(out) + ("\n" if out else "")
    if not changes:
        merged = text  # untouched, byte for byte
    return MergeResult(merged, tuple(changes), tuple(links))


def _apply(line: str, edits: list[tuple[int, int, str]]) -> str:
    for start, end, new in sorted(edits, reverse=True):
        line = line[:start] + new + line[end:]
    return line


def missing_links(links: tuple[Link, ...]) -> list[Link]:
    """The links not in place yet; SlurmConfConflict when a path is taken by something else."""
    missing: list[Link] = []
    for link in links:
        if os.path.islink(link.path):
            if os.readlink(link.path) == link.target:
                continue
        elif not os.path.lexists(link.path):
            if not os.path.isdir(os.path.dirname(link.path)):
                raise SlurmConfConflict(
                    f"{os.path.dirname(link.path)} does not exist: create it (the site's "
                    "glob names it) and run again"
                )
            missing.append(link)
            continue
        raise SlurmConfConflict(f"{link.path} exists and is not a link to {link.target}")
    return missing


def read_text(path: str) -> str | None:
    """A file's text, or None when it cannot be read (the ``read`` of :func:`merge`)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None
