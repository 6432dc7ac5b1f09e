"""CPython line tables: the line being executed at an instruction offset.

Two formats, both decoded to ``(start, end, line)`` ranges of byte offsets into the code
object's bytecode, exactly as ``code.co_lines()`` yields them in the version that wrote
the table:

- 3.10 ``co_linetable``: pairs of (unsigned byte offset delta, signed line delta); a line
  delta of -128 means "no line" for that range, and a zero-length range is skipped.
- 3.11+ location table (Objects/locations.md): entries whose first byte has bit 7 set,
  bits 3-6 the entry's code and bits 0-2 its length minus one, in 2-byte code units. The
  code says how the line changes: 15 no location, 14 long form (signed varint line delta,
  then end line, column and end column varints), 13 no columns (signed varint delta),
  10-12 one line (delta = code - 10, two column bytes), 0-9 short form (same line, one
  column byte).

A table that ends early or is malformed yields the ranges read so far, never an invented
line: an offset past them maps to ``None``.
"""

from __future__ import annotations

from collections.abc import Iterator

Range = tuple[int, int, int | None]  # [start, end) byte offsets, line (None: no line)


def ranges_310(table: bytes, firstlineno: int) -> Iterator[Range]:
    """The ranges of a 3.10 ``co_linetable`` (what 3.10's ``co_lines()`` yields)."""
    line = firstlineno
    end = 0
    for i in range(0, len(table) - 1, 2):
        sdelta = table[i]
        ldelta = table[i + 1] - 256 if table[i + 1] > 127 else table[i + 1]
        start, end = end, end + sdelta
        if ldelta == -128:
            lineno: int | None = None
        else:
            line += ldelta
            lineno = line
        if start == end:
            continue
        yield start, end, lineno


class _Cursor:
    def __init__(self, table: bytes, pos: int) -> None:
        self.table = table
        self.pos = pos

    def byte(self) -> int:
        if self.pos >= len(self.table):
            raise IndexError("location table ends inside an entry")
        b = self.table[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        b = self.byte()
        value = b & 63
        shift = 0
        while b & 64:
            b = self.byte()
            shift += 6
            value |= (b & 63) << shift
            if shift > 64:
                raise IndexError("varint too long")
        return value

    def svarint(self) -> int:
        v = self.varint()
        return -(v >> 1) if v & 1 else v >> 1


def ranges_311(table: bytes, firstlineno: int) -> Iterator[Range]:
    """The ranges of a 3.11+ location table (what ``co_lines()`` yields, before merging
    adjacent ranges of one line)."""
    line = firstlineno
    addr = 0
    cur = _Cursor(table, 0)
    while cur.pos < len(table):
        first = table[cur.pos]
        if not first & 0x80:
            return  # not at an entry start: malformed
        cur.pos += 1
        code = (first >> 3) & 15
        length = ((first & 7) + 1) * 2
        lineno: int | None
        try:
            if code == 15:
                lineno = None
            elif code == 14:
                line += cur.svarint()
                cur.varint()
                cur.varint()
                cur.varint()
                lineno = line
            elif code == 13:
                line += cur.svarint()
                lineno = line
            elif code >= 10:
                line += code - 10
                cur.byte()
                cur.byte()
                lineno = line
            else:
                cur.byte()
                lineno = line
        except IndexError:
            return
        yield addr, addr + length, lineno
        addr += length


def line_for(table: bytes, firstlineno: int, offset: int, fmt: str) -> int | None:
    """The line executing at byte ``offset`` of the bytecode, or None when unmapped.

    ``fmt`` is "310" or "311" (every version since 3.11 shares the location table).
    """
    if offset < 0:
        return firstlineno  # a frame that has not started: CPython reports the def line
    ranges = ranges_310 if fmt == "310" else ranges_311
    for start, end, line in ranges(table, firstlineno):
        if start <= offset < end:
            return line
    return None
