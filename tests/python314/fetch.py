"""A real CPython 3.14 for the stack tests: Debian sid's python3.14, run through its own glibc.

Debian 12 has no 3.14. Sid's packages are downloaded once into a cache directory
(``$XDG_CACHE_HOME/ingero-tests/python3.14``, or ``INGERO_TEST_PY314_DIR``), each checked
along Debian's own chain (``InRelease`` signed by the archive key → ``Packages.xz``'s
SHA256 → each ``.deb``'s SHA256), and extracted with ``dpkg-deb -x``. Nothing is written
outside the cache. The interpreter runs through sid's ``ld-linux-x86-64.so.2`` with
``--library-path`` (its glibc is newer than the host's); ``python3.14`` in the cache is a
launcher script that ``exec``\\s it, so the process is ld.so mapping the real ``python3.14``
image (which links libpython statically): ``/proc/PID/maps`` names that file, which is
what the stack reader looks for.

``python3 -m tests.python314.fetch`` provisions it ahead of a run (tests/run.sh does);
``ensure()`` then gives the launcher, or the reason there is none (the 3.14 cases skip).
"""

from __future__ import annotations

import functools
import hashlib
import lzma
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

MIRROR = os.environ.get("INGERO_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SUITE = "sid"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
# python3.14's own packages and the shared libraries it, ctypes and threading load.
PACKAGES = ("libc6", "libgcc-s1", "python3.14-minimal", "libpython3.14-minimal",
            "libpython3.14-stdlib", "libffi8", "zlib1g", "libexpat1")  # fmt: skip
LIB = "usr/lib/x86_64-linux-gnu"


def cache_dir() -> Path:
    if os.environ.get("INGERO_TEST_PY314_DIR"):
        return Path(os.environ["INGERO_TEST_PY314_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "ingero-tests" / "python3.14"


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as resp:
        data: bytes = resp.read()
    return data


def _sha256_in_release(release: str, path: str) -> str:
    """The SHA256 of ``path`` listed in the (verified) InRelease."""
    section = release.split("SHA256:", 1)[1]
    for line in section.splitlines()[1:]:
        if not line.startswith(" "):
            break
        digest, _, name = line.split()
        if name == path:
            return digest
    raise RuntimeError(f"{path} is not listed in {SUITE}'s InRelease")


def _verified_release(work: Path) -> str:
    if shutil.which("gpgv") is None or not KEYRING.exists():
        raise RuntimeError(f"gpgv or {KEYRING} missing: cannot check Debian's signature")
    signed = work / "InRelease"
    signed.write_bytes(_get(f"{MIRROR}/dists/{SUITE}/InRelease"))
    check = subprocess.run(["gpgv", "--keyring", str(KEYRING), str(signed)],
                           capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    if check.returncode != 0:
        raise RuntimeError(f"InRelease signature: {check.stderr.strip()[-300:]}")
    return signed.read_text()


def _index(release: str) -> dict[str, dict[str, str]]:
    path = "main/binary-amd64/Packages.xz"
    packed = _get(f"{MIRROR}/dists/{SUITE}/{path}")
    if hashlib.sha256(packed).hexdigest() != _sha256_in_release(release, path):
        raise RuntimeError(f"{path}: SHA256 differs from InRelease")
    out: dict[str, dict[str, str]] = {}
    for para in lzma.decompress(packed).decode().split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z0-9-]+): (.*)$", para, re.M))
        if fields.get("Package") in PACKAGES:
            out[fields["Package"]] = fields
    return out


def _launcher(prefix: Path) -> str:
    lib = f"{prefix}/{LIB}:{prefix}/lib/x86_64-linux-gnu"
    return (
        "#!/bin/sh\n"
        "# Debian sid's python3.14 through sid's own dynamic loader and glibc.\n"
        f'PYTHONHOME="{prefix}/usr" exec "{prefix}/{LIB}/ld-linux-x86-64.so.2" '
        f'--library-path "{lib}" --argv0 "$0" "{prefix}/usr/bin/python3.14" "$@"\n'
    )


def provision(cache: Path) -> Path:
    """Download, verify and extract into ``cache`` (a no-op when done); the launcher."""
    launcher = cache / "python3.14"
    if launcher.exists():
        return launcher
    cache.parent.mkdir(parents=True, exist_ok=True)
    work = cache.with_name(cache.name + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        index = _index(_verified_release(work))
        missing = [p for p in PACKAGES if p not in index]
        if missing:
            raise RuntimeError(f"not in {SUITE}: {', '.join(missing)}")
        prefix = work / "root"
        for name in PACKAGES:
            meta = index[name]
            deb = _get(f"{MIRROR}/{meta['Filename']}")
            if hashlib.sha256(deb).hexdigest() != meta["SHA256"]:
                raise RuntimeError(f"{meta['Filename']}: SHA256 differs from Packages")
            path = work / f"{name}.deb"
            path.write_bytes(deb)
            subprocess.run(["dpkg-deb", "-x", str(path), str(prefix)], check=True, timeout=120)
            path.unlink()
        (work / "VERSION").write_text(index["python3.14-minimal"]["Version"] + "\n")
        # The launcher names the final prefix; the rename below makes it true at once.
        (work / "python3.14").write_text(_launcher(cache / "root"))
        (work / "python3.14").chmod(0o755)
        if not cache.exists():
            work.rename(cache)
    finally:  # a failed try leaves nothing behind
        shutil.rmtree(work, ignore_errors=True)
    return launcher


@functools.cache
def ensure(download: bool = False) -> Path | str:
    """The launcher of a working python3.14, or why there is none (found once per run).

    Tests look only in the cache (they talk to nothing beyond the host): tests/run.sh
    downloads ahead of pytest with ``python3 -m tests.python314.fetch`` (``download``)."""
    try:
        if not download and not (cache_dir() / "python3.14").exists():
            raise RuntimeError(
                f"not in {cache_dir()} (python3 -m tests.python314.fetch downloads it;"
                " tests/run.sh does)"
            )
        launcher = provision(cache_dir())
    except (OSError, RuntimeError, subprocess.SubprocessError, lzma.LZMAError) as exc:
        return f"no CPython 3.14 from Debian {SUITE}: {exc}"
    run = subprocess.run([str(launcher), "-c", "import ctypes, threading, sys; print(sys.hexversion)"],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    if run.returncode != 0 or int(run.stdout.strip() or 0) >> 16 != 0x030E:
        return f"{launcher} does not run: {run.stderr.strip()[-300:]}"
    return launcher


if __name__ == "__main__":
    got = ensure(download=True)
    print(got)
    sys.exit(0 if isinstance(got, Path) else 1)
