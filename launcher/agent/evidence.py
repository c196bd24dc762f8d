"""Why a task ended, as only its host can tell: evidence read beside its exit.

A task's exit code and signal say how it ended; some causes leave their facts
only on the host (the kernel's out-of-memory killer: a SIGKILL like any
other). Each collector of `COLLECTORS` notes what it needs as the task starts
(`start(pid)`, on the agent's thread that started it) and reads the facts as
it exits (`end(note)`: a dict, or None when there is nothing to say). The
`exited` message carries them as `evidence: {name: facts}`
(launcher/job/run/protocol.py checks them; launcher/job/record/classify.py
reads them into the failure's kind and words). This is the seam for a
failure kind whose evidence must come from a task's host: a collector here,
its kind's row in launcher/job/record/failkinds.py, and its reading in
`classify.exit_of` (docs/design.md, "A new failure kind").

Standard library only; every read is bounded and never raises.
"""

from __future__ import annotations

VMSTAT = "/proc/vmstat"
CGROUP_ROOT = "/sys/fs/cgroup"


def _read(path: str, limit: int = 65536) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read(limit)
    except OSError:
        return ""


def _count(text: str, key: str) -> int | None:
    """`key N` in a flat keyed file (/proc/vmstat, memory.events, memory.oom_control)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


class OomKills:
    """The kernel's out-of-memory killer: its kills in the task's memory cgroup
    (cgroup v2 `memory.events`, v1 `memory.oom_control`), and on the host
    (/proc/vmstat `oom_kill`), while the task ran."""

    @staticmethod
    def _cgroup(pid: int) -> str | None:
        """The folder of the task's memory cgroup (v1's memory controller, else v2's)."""
        unified = None
        for line in _read(f"/proc/{pid}/cgroup").splitlines():
            _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
            if "memory" in controllers.split(","):
                return f"{CGROUP_ROOT}/memory{path.rstrip('/')}"
            if controllers == "":
                unified = f"{CGROUP_ROOT}{path.rstrip('/')}"
        return unified

    @staticmethod
    def _kills(folder: str | None) -> int | None:
        if folder is None:
            return None
        events = _count(_read(f"{folder}/memory.events"), "oom_kill")
        return events if events is not None else _count(_read(f"{folder}/memory.oom_control"),
                                                        "oom_kill")

    def start(self, pid: int) -> dict:
        folder = self._cgroup(pid)
        return {"cgroup": folder, "in_cgroup": self._kills(folder),
                "on_host": _count(_read(VMSTAT), "oom_kill")}

    def end(self, note: dict) -> dict | None:
        facts: dict = {}
        for key, now in (("in_cgroup", self._kills(note.get("cgroup"))),
                         ("on_host", _count(_read(VMSTAT), "oom_kill"))):
            before = note.get(key)
            if now is not None and before is not None and now > before:
                facts[key] = now - before
        if not facts:
            return None
        limit = _read(f"{note.get('cgroup')}/memory.max").strip() or \
            _read(f"{note.get('cgroup')}/memory.limit_in_bytes").strip()
        if facts.get("in_cgroup") and limit.isdigit():
            facts["limit_bytes"] = int(limit)
        return facts


COLLECTORS = {"oom": OomKills()}


def at_start(pid: int) -> dict:
    """Each collector's note, as the task starts."""
    notes = {}
    for name, collector in COLLECTORS.items():
        try:
            notes[name] = collector.start(pid)
        except Exception:  # noqa: BLE001 - evidence is a bonus, never a task's failure
            continue
    return notes


def at_exit(notes: dict) -> dict:
    """Each collector's facts, as the task exits (only those with something to say)."""
    evidence = {}
    for name, note in notes.items():
        try:
            facts = COLLECTORS[name].end(note)
        except Exception:  # noqa: BLE001
            continue
        if facts:
            evidence[name] = facts
    return evidence
