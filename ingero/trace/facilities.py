"""What this kernel's uprobes can do, the hazards a site must know, and the launch mode.

Read from the running kernel, never from headers: its release, whether a uprobe_multi
program loads and links (6.6+), whether a uprobe session program does (6.13+), and from its
BTF whether it has the x86 uretprobe syscall (6.11+). ``ingero check`` prints all of it and
``ingero trace`` picks its launch mode from it (``launch_mode``).

The hazard: since 6.11 (ff474a78cef5, "uprobe: Add uretprobe syscall to speed up return
probe") a return probe on x86-64 returns through the ``uretprobe`` syscall. A process under
a seccomp filter that does not allow that syscall (Docker's default profile, a container
runtime's, systemd's ``SystemCallFilter=``) was killed at the return of a probed function.
cf6cb56ef244 ("seccomp: passthrough uretprobe systemcall without filtering") lets it
through every filter: mainline 6.14, stable 6.12.14 and 6.13.3; 6.11.y ended (6.11.11)
without it. The version says which kernels have it; a distribution kernel may carry it
under an older number.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path

from ingero.trace import kbtf, sessions
from ingero.trace.sessions import SessionKfuncs

LAUNCH_AUTO, LAUNCH_SAMPLED, LAUNCH_ALL = "auto", "sampled", "all"
LAUNCH_MODES = (LAUNCH_AUTO, LAUNCH_SAMPLED, LAUNCH_ALL)
URETPROBE_SYSCALL = "__x64_sys_uretprobe"
SECCOMP_FIX = "cf6cb56ef244"
# The first release of each line with the fix; lines not named have it from 6.14 on.
_FIXED_IN = {(6, 12): 14, (6, 13): 3}
_SYSCALL_FROM = (6, 11)


def parse_version(release: str) -> tuple[int, int, int]:
    """``6.12.13-amd64`` → (6, 12, 13); (0, 0, 0) where it is no version."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", release)
    if m is None:
        return (0, 0, 0)
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def seccomp_passthrough(release: str) -> bool:
    """Whether a kernel of this release lets the uretprobe syscall through seccomp filters
    (by its version: cf6cb56ef244 in 6.12.14, 6.13.3 and 6.14+)."""
    major, minor, patch = parse_version(release)
    if (major, minor) >= (6, 14):
        return True
    fixed = _FIXED_IN.get((major, minor))
    return fixed is not None and patch >= fixed


@dataclass(frozen=True)
class Facilities:
    """The kernel's uprobe facilities, as probed (``probe``)."""

    release: str
    uprobe_multi: bool
    uprobe_multi_why: str
    sessions: bool
    sessions_why: str
    # Whether the kernel has the uretprobe syscall (None: no BTF to tell).
    uretprobe_syscall: bool | None
    kfuncs: SessionKfuncs | None = None

    @property
    def seccomp_hazard(self) -> bool:
        """Return probes may kill a process under a seccomp filter that does not allow the
        uretprobe syscall: the syscall is there and the release predates the fix."""
        if self.uretprobe_syscall is False:
            return False
        if self.uretprobe_syscall is None and parse_version(self.release)[:2] < _SYSCALL_FROM:
            return False
        return not seccomp_passthrough(self.release)

    def launch_mode(
        self, requested: str = LAUNCH_AUTO, task_storage: bool = True, multi: bool = True
    ) -> tuple[str, str]:
        """The launch mode the tracer runs in (sampled | all) and why. ``sampled`` asked
        for where it cannot run raises ValueError with the reason."""
        if requested not in LAUNCH_MODES:
            raise ValueError(f"launch mode {requested!r}: one of {', '.join(LAUNCH_MODES)}")
        if requested == LAUNCH_ALL:
            return LAUNCH_ALL, "asked for (--launch-returns all): every launch is timed"
        blocker = None
        if not multi:
            blocker = "uprobe_multi links are off (perf-event uprobes have no sessions)"
        elif not self.uprobe_multi:
            blocker = f"no uprobe_multi links: {self.uprobe_multi_why}"
        elif not self.sessions:
            blocker = f"no uprobe sessions: {self.sessions_why}"
        elif not task_storage:
            blocker = "no task-local storage (the entry-only launch needs it)"
        if blocker is None:
            return LAUNCH_SAMPLED, (
                "uprobe sessions: launches counted at entry, a sample of them timed at their return"
            )
        if requested == LAUNCH_SAMPLED:
            raise ValueError(f"--launch-returns sampled cannot run here: {blocker}")
        return LAUNCH_ALL, f"{blocker}: every launch takes its return probe"


def probe(release: str | None = None, btf_path: Path = kbtf.VMLINUX) -> Facilities:
    """Probe this kernel (loads a few tiny BPF programs: needs root or CAP_BPF)."""
    release = release if release is not None else platform.release()
    uretprobe: bool | None = None
    try:
        with kbtf.read_kernel(btf_path) as btf:
            kfuncs: SessionKfuncs | str = sessions.kfuncs_from_btf(btf)
            uretprobe = btf.func(URETPROBE_SYSCALL) is not None
    except (OSError, kbtf.BtfError) as exc:
        kfuncs = f"no kernel BTF to read ({exc})"
    multi, multi_why = sessions.probe_links()
    has_sessions, sessions_why = sessions.probe(kfuncs)
    return Facilities(
        release=release,
        uprobe_multi=multi,
        uprobe_multi_why=multi_why,
        sessions=has_sessions,
        sessions_why=sessions_why,
        uretprobe_syscall=uretprobe,
        kfuncs=kfuncs if has_sessions and isinstance(kfuncs, SessionKfuncs) else None,
    )
