"""A checker for the Trace Event Format (the JSON ui.perfetto.dev and chrome://tracing load).

Written from the format's specification ("Trace Event Format", Google, the document
catapult's trace viewer and Perfetto's JSON importer follow): the JSON Object Format with a
``traceEvents`` list, and per phase the fields that phase needs. Returns every problem
found, so a test shows all of them at once.
"""

from __future__ import annotations

from typing import Any

# phase -> fields it needs beyond ph/name/pid (ts except for metadata)
PHASES = {
    "X": ("ts", "dur", "tid"),  # complete event
    "B": ("ts", "tid"),
    "E": ("ts", "tid"),
    "i": ("ts", "tid"),  # instant event; "s" scope g|p|t
    "I": ("ts", "tid"),
    "C": ("ts",),  # counter: args hold the numeric series
    "s": ("ts", "tid", "id"),  # flow start
    "t": ("ts", "tid", "id"),  # flow step
    "f": ("ts", "tid", "id"),  # flow end
    "M": (),  # metadata: process_name, thread_name, *_sort_index, with args
}
METADATA = {
    "process_name": "name",
    "thread_name": "name",
    "process_sort_index": "sort_index",
    "thread_sort_index": "sort_index",
    "process_labels": "labels",
}


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def problems(trace: Any) -> list[str]:
    out: list[str] = []
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["top level: an object with a traceEvents list expected"]
    if trace.get("displayTimeUnit") not in (None, "ms", "ns"):
        out.append("displayTimeUnit: must be 'ms' or 'ns'")
    frames = trace.get("stackFrames", {})
    if not isinstance(frames, dict):
        return [*out, "stackFrames: must be an object"]
    for i, e in enumerate(trace["traceEvents"]):
        where = f"traceEvents[{i}]"
        if not isinstance(e, dict):
            out.append(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if ph not in PHASES:
            out.append(f"{where}: unknown ph {ph!r}")
            continue
        if not isinstance(e.get("name"), str):
            out.append(f"{where}: name must be a string")
        for key in ("pid", "tid"):
            if key in e and not isinstance(e[key], int):
                out.append(f"{where}: {key} must be an integer")
        if not isinstance(e.get("pid"), int):
            out.append(f"{where}: pid missing")
        for key in PHASES[ph]:
            if key not in e:
                out.append(f"{where}: ph {ph} needs {key}")
        if "ts" in e and (not _number(e["ts"]) or e["ts"] < 0):
            out.append(f"{where}: ts must be a number >= 0 (microseconds)")
        if ph == "X" and (not _number(e.get("dur")) or e["dur"] < 0):
            out.append(f"{where}: dur must be a number >= 0")
        if "args" in e and not isinstance(e["args"], dict):
            out.append(f"{where}: args must be an object")
        if ph == "C":
            args = e.get("args")
            if not isinstance(args, dict) or not args or not all(map(_number, args.values())):
                out.append(f"{where}: a counter's args must be numbers")
        if ph == "M":
            key = METADATA.get(str(e.get("name")))
            if key is None or key not in (e.get("args") or {}):
                out.append(f"{where}: metadata {e.get('name')!r} needs args.{key}")
        if ph in ("i", "I") and e.get("s", "t") not in ("g", "p", "t"):
            out.append(f"{where}: instant scope must be g, p or t")
        if ph in ("s", "t", "f") and not isinstance(e.get("cat"), str):
            out.append(f"{where}: a flow event needs cat")
        if ph == "f" and e.get("bp") not in (None, "e"):
            out.append(f"{where}: bp must be 'e'")
        if "sf" in e and (not isinstance(e["sf"], int | str) or str(e["sf"]) not in frames):
            out.append(f"{where}: sf {e['sf']!r} is not in stackFrames")
    return out + _frame_problems(frames)


def _frame_problems(frames: Any) -> list[str]:
    """``stackFrames``: id -> {name, parent (the caller's id, optional), category}."""
    out = []
    for fid, f in frames.items():
        where = f"stackFrames[{fid!r}]"
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            out.append(f"{where}: needs a name")
        elif "parent" in f and str(f["parent"]) not in frames:
            out.append(f"{where}: parent {f['parent']!r} is not in stackFrames")
    return out
