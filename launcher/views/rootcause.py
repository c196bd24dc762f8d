"""The root cause of a job's end, as every view says it: the run's last words
in the terminal, `mgpu-launch status` and the HTML report all render it from
here, from the failure as summary.json lists it (`Failure.to_json`,
launcher/job/record/states.py).

`words` picks what is said (its description, where it was stuck, its last
lines without the traceback they repeat, the traceback once with its
exception); `lines` renders them as text. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LAST_LINES = 10  # a task's last output lines shown under its root cause


@dataclass(frozen=True)
class Words:
    description: str
    stack: tuple[str, ...]  # where it was stuck, innermost frame first (a hang's)
    last_lines: tuple[str, ...]  # its output's last lines, the traceback in them left out
    traceback: str  # "" when it raised nothing the bootstrap caught
    exception: str  # "Type: message", "" without a traceback


def words(cause: Mapping[str, Any], last: int = LAST_LINES) -> Words:
    """What is said of `cause` (a failure as summary.json lists it)."""
    lines = [str(line) for line in cause.get("last_lines") or ()]
    error = cause.get("error")
    error = error if isinstance(error, Mapping) else {}
    traceback = str(error.get("traceback") or "").rstrip()
    if traceback:  # the output's copy of the traceback is left out: it is said once
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
        lines = lines[:starts[-1]] if starts else []
    exception = f"{error['type']}: {error.get('message', '')}" \
        if traceback and error.get("type") else ""
    return Words(description=str(cause.get("description") or cause.get("task") or ""),
                 stack=tuple(str(frame) for frame in cause.get("stack") or ()),
                 last_lines=tuple(lines[-last:]), traceback=traceback, exception=exception)


def lines(cause: Mapping[str, Any], stacks_dir: str = "") -> list[str]:
    """`cause` as text lines: `root cause: ...`, where it was stuck (its
    threads' stacks in `stacks_dir`), its last lines, its traceback."""
    said = words(cause)
    out = [f"root cause: {said.description}"]
    if said.stack:
        out.append("where it was stuck (innermost frame first"
                   + (f"; all threads in {stacks_dir}/" if stacks_dir else "") + "):")
        out += [f"  {frame}" for frame in said.stack]
    if said.last_lines:
        out.append("its last lines:")
        out += [f"  {line}" for line in said.last_lines]
    if said.traceback:
        out.append("traceback (most recent call last):")
        out += [f"  {line}" for line in said.traceback.splitlines()]
        if said.exception:
            out.append(said.exception)
    return out
