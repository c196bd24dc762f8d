"""Which of two saves of one directory is newer: by the job's clock, not a host's.

A copy is never published over a newer save of its saver (memcopy.copy_slot:
a late copy of an agent given up on, a worker's save relayed for a lost
chief). Told by the files' mtimes alone (each copy stamps the files that name
its save with the save's time), hosts whose clocks disagree by more than the
gap between two saves would order them wrongly: a newer save refused as
"older" than the one in place, lost to the directory. So each copy also
writes, in the same publish (agent/publish.py: ORDER, journaled with its
files): for each saver of the directory, the run, generation, process, that
process's count of saves, step and time of the save now in place. Within a
run, a later copy compares generation first (a restarted job's saves are
newer, whatever its step: a rollback restores an older one), then, from one
process, its count of saves (a second `fit` with a new optimizer counts its
steps from 0 again), then step, then time. Another run's entry (its
generations count from 0 again) tells nothing: the mtimes decide.

ORDER is believed only while the saver's files are still the ones that copy
stamped (their mtime its time): a save the script wrote there itself since (a
full memory: saved directly) is judged by mtime, as is a directory with no
ORDER (the script's own, an older launcher's).

Standard library only.
"""

from __future__ import annotations

import json
import os

from launcher.agent.publish import ORDER

# A directory's file this much later than a save's time is a newer save's (a
# file system's timestamps may be coarser than the save's float time).
CLOCK_SLACK_S = 0.01


def position(record: dict) -> dict:
    """A save's place in the job: its run (MGPU_RUN_ID), generation, process
    (host:pid) and that process's count of saves, step (None: not known), time."""
    def number(key: str, kind: type) -> int | float | None:
        try:
            value = record.get(key)
            return None if value is None or isinstance(value, bool) else kind(value)
        except (TypeError, ValueError):
            return None

    return {"run": str(record.get("run") or ""), "generation": number("generation", int) or 0,
            "process": str(record.get("process") or ""), "seq": number("seq", int),
            "step": number("step", int), "time": number("time", float)}


def later(theirs: dict, mine: dict) -> bool | None:
    """`theirs` is a later save than `mine` (None: cannot be told, another run's).

    A run's generations only grow; within a generation one process's saves
    follow its count (a step count that starts again, a second `fit` with a
    new optimizer, still saves later); between processes (a worker's save
    relayed for a lost chief) the step, then the time."""
    if not theirs["run"] or theirs["run"] != mine["run"]:
        return None  # another run's (a run's generations start at 0 again)
    if theirs["generation"] != mine["generation"]:
        return theirs["generation"] > mine["generation"]
    if theirs["process"] and theirs["process"] == mine["process"] \
            and theirs["seq"] is not None and mine["seq"] is not None:
        return theirs["seq"] > mine["seq"]
    if theirs["step"] is not None and mine["step"] is not None and theirs["step"] != mine["step"]:
        return theirs["step"] > mine["step"]
    return theirs["time"] is not None and mine["time"] is not None and \
        theirs["time"] > mine["time"] + CLOCK_SLACK_S


def read(target: str) -> dict[str, dict]:
    try:
        with open(os.path.join(target, ORDER), encoding="utf-8") as handle:
            order = json.load(handle)
    except (OSError, ValueError):
        return {}
    return order if isinstance(order, dict) else {}


def key(saver: tuple[str, ...]) -> str:
    return "/".join(saver)


def with_save(target: str, saver: tuple[str, ...], record: dict) -> str:
    """ORDER's text once this save is in place (the other savers' kept)."""
    order = read(target)
    order[key(saver)] = position(record)
    return json.dumps(order, sort_keys=True)


def holds_newer(target: str, saver: tuple[str, ...], names: list[str], record: dict) -> bool:
    """`target` holds a save of this saver newer than `record`'s."""
    mine, theirs = position(record), _entry(read(target).get(key(saver)))
    if theirs is not None and _stamped_by(target, names, theirs["time"]):
        verdict = later(theirs, mine)
        if verdict is not None:
            return verdict
    return newer_in(target, names, mine["time"])


def holds_any_newer(target: str, names: list[str], record: dict) -> bool:
    """`target` holds a save, of any saver, newer than `record`'s (a drop's)."""
    mine = position(record)
    for entry in read(target).values():
        theirs = _entry(entry)
        if theirs is not None and later(theirs, mine):
            return True
    return newer_in(target, names, mine["time"])


def _entry(entry: object) -> dict | None:
    """An ORDER entry as a position (None: not one)."""
    return position(entry) if isinstance(entry, dict) else None


def _stamped_by(target: str, names: list[str], when: object) -> bool:
    """The saver's files in `target` are the ones a copy stamped `when`."""
    if not isinstance(when, (int, float)):
        return False
    found = False
    for name in names:
        try:
            mtime = os.stat(os.path.join(target, name)).st_mtime
        except OSError:
            continue
        if abs(mtime - when) > CLOCK_SLACK_S:
            return False
        found = True
    return found


def newer_in(target: str, names: list[str], when: float | None) -> bool:
    """`target` holds one of `names` written after `when` (by mtime)."""
    if when is None:
        return False
    for name in names:
        try:
            if os.stat(os.path.join(target, name)).st_mtime > when + CLOCK_SLACK_S:
                return True
        except OSError:
            continue
    return False
