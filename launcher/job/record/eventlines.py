"""The lines of events.jsonl read back into events (launcher/job/record/events.py).

A reader keeps what it does not know: a line of another version never raises
(an unknown kind reads as `Unknown`, unknown keys land in `extra`; a value of
the wrong type is kept as it is); a line without `v` is version 1.

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from . import events as ev


def version(record: dict[str, Any]) -> int:
    """The schema version of a line: 1 when it has none (written before `v`)."""
    v = record.get("v")
    return v if isinstance(v, int) and not isinstance(v, bool) else 1


def from_record(record: dict[str, Any]) -> ev.Event:
    """A line of events.jsonl read back; never raises on a line of another
    version (unknown kind: `Unknown`; unknown keys: `extra`; a value of the
    wrong type is kept as it is)."""
    t = record.get("t")
    t = t if isinstance(t, int | float) and not isinstance(t, bool) else None
    name = str(record.get("event", ""))
    cls = ev.KINDS.get(name)
    rest = {k: v for k, v in record.items() if k not in ("t", "event", "v")}
    if cls is None:
        return ev.Unknown(t=t, name=name, extra=rest)
    by_key = {f.metadata.get("key", f.name): f for f in dataclasses.fields(cls)
              if f.name not in ("t", "extra")}
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in rest.items():
        f = by_key.get(key)
        if f is None or f.name == "metrics":
            extra[key] = value
        else:
            values[f.name] = _typed(f.name, value)
    if cls is ev.Progress:
        values["metrics"], extra = extra, {}
    for f in dataclasses.fields(cls):  # required keys a line lacks: a neutral value
        if f.name not in values and f.default is dataclasses.MISSING \
                and f.default_factory is dataclasses.MISSING and f.name not in ("t", "extra"):
            values[f.name] = 0 if f.name == "generation" else ""
    return cls(t=t, extra=extra, **values)


def _typed(name: str, value: Any) -> Any:
    if name == "tasks" and isinstance(value, list):
        return tuple(_placed(v) if isinstance(v, dict) else str(v) for v in value)
    if isinstance(value, list):
        return tuple(value)
    return value


def _placed(entry: dict[str, Any]) -> ev.Placed:
    known = {f.name for f in dataclasses.fields(ev.Placed)}
    return ev.Placed(**{"task": "", "host": "",
                     **{k: v for k, v in entry.items() if k in known}})
