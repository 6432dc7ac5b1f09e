"""Print the .deb's debian/copyright (machine-readable format 1.0) for the venv it runs in.

    /opt/ingero/venv/bin/python packaging/copyright.py > .../usr/share/doc/ingero/copyright

The package ships ingero and, in its private venv, every Python distribution it depends on;
each gets a stanza with the files it installed, its authors and its licence as its metadata
states it (License-Expression, else License, else the licence classifiers), and where the
licence text it ships lies.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from pathlib import Path, PurePosixPath

INGERO = """\
Files: *
Copyright: the ingero authors
License: Apache-2.0
 Licensed under the Apache License, Version 2.0 (the "License"); you may not use
 this package except in compliance with the License.
 .
 On Debian systems, the full text of the Apache License, Version 2.0 can be found
 in /usr/share/common-licenses/Apache-2.0.
"""

# Free-text licence names and classifiers seen in metadata, as SPDX / DEP-5 short names.
_NAMES = {
    "apache license, version 2.0": "Apache-2.0",
    "apache 2.0": "Apache-2.0",
    "apache software license": "Apache-2.0",
    "mit license": "MIT",
    "mit": "MIT",
    "3-clause bsd license": "BSD-3-Clause",
    "bsd license": "BSD",
    "isc license": "ISC",
    "isc license (iscl)": "ISC",
    "lgplv2+": "LGPL-2+",
    "gnu lesser general public license v2 or later (lgplv2+)": "LGPL-2+",
    "gpl2+": "GPL-2+",
    "gnu general public license (gpl)": "GPL",
    "mozilla public license 2.0 (mpl 2.0)": "MPL-2.0",
    "public domain": "public-domain",
    "python software foundation license": "PSF-2.0",
}
_SPDX = re.compile(r"^[A-Za-z0-9.+-]+( (AND|OR|and|or|WITH|with) [A-Za-z0-9.+-]+)*$")


def field(meta: md.PackageMetadata, name: str) -> str:
    values = meta.get_all(name) or []
    return str(values[0]) if values else ""


def short_name(meta: md.PackageMetadata) -> str:
    """The distribution's licence as a DEP-5 short name ("other" when its metadata is unclear)."""
    candidates = [field(meta, "License-Expression"), field(meta, "License").strip()]
    candidates += [
        c.split("::")[-1].strip()
        for c in meta.get_all("Classifier") or []
        if c.startswith("License ::")
    ]
    for text in candidates:
        if not text or "\n" in text:
            continue  # empty, or a whole licence text pasted into the field
        name = _NAMES.get(text.lower())
        if (
            name is None
            and _SPDX.match(text)
            and " " not in text.replace(" AND ", "").replace(" OR ", "")
        ):
            name = text
        if name:
            return name.replace(" OR ", " or ").replace(" AND ", " and ")
    return "other"


def stanza(dist: md.Distribution, site: Path) -> str | None:
    files = [PurePosixPath(str(f)) for f in dist.files or []]
    tops = sorted(
        {f.parts[0] for f in files if f.parts and f.parts[0] not in ("..", "__pycache__")}
    )
    if not tops:
        return None
    meta = dist.metadata
    rel = PurePosixPath(str(site).lstrip("/"))
    patterns = " ".join(
        f"{rel / top}/*" if (site / top).is_dir() else f"{rel / top}" for top in tops
    )
    authors = field(meta, "Author") or field(meta, "Author-email") or field(meta, "Maintainer")
    authors = " ".join(authors.split()) or f"the {meta['Name']} authors"
    texts = sorted(
        f"/{rel / f}" for f in files if re.search(r"(LICEN[CS]E|COPYING|NOTICE)", f.name, re.I)
    )
    where = (
        "The licence text as the distribution ships it: " + ", ".join(texts)
        if texts
        else "The distribution ships no separate licence file."
    )
    return (
        f"Files: {patterns}\n"
        f"Copyright: {authors}\n"
        f"License: {short_name(meta)}\n"
        f" {meta['Name']} {meta['Version']}, from its wheel as published on PyPI.\n"
        f" {where}\n"
    )


def vendored(site: Path) -> str:
    """The one piece of ingero's own package under another licence: the dashboard's chart
    library (docs/echo.md, "Dashboard"), a later stanza than ingero's, so it wins."""
    static = PurePosixPath(str(site).lstrip("/")) / "ingero/echo/dashboard/static"
    return (
        f"Files: {static}/uPlot.*\n"
        "Copyright: 2022 Leon Sorokin\n"
        "License: MIT\n"
        " uPlot 1.6.31, from its npm package, unmodified.\n"
        f" The licence text as the package ships it: /{static}/uPlot.LICENSE\n"
    )


def main() -> None:
    site = next(Path(p) for p in sys.path if p.endswith("site-packages"))
    stanzas = [
        s
        for d in sorted(
            md.distributions(path=[str(site)]), key=lambda d: d.metadata["Name"].lower()
        )
        if d.metadata["Name"] != "ingero" and (s := stanza(d, site)) is not None
    ]
    header = (
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
        "Upstream-Name: ingero\n"
        "Comment: the Python distributions under /opt/ingero/venv are the wheels ingero\n"
        " was tested with, unmodified; each stanza below names its files and licence.\n"
    )
    sys.stdout.write("\n".join([header, INGERO, vendored(site), *stanzas]))


if __name__ == "__main__":
    main()
