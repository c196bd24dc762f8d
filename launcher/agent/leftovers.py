"""Pid records, and what an earlier agent of the same run directory left.

Every task and standby is recorded in `RUN_DIR/pids/` (pid, start time, the
token in its environment, the agent's pid). An agent started with the same
run directory first kills what is left of the processes an earlier agent
recorded (it died, or is cut off and has not noticed yet): SIGTERM,
REAP_GRACE_S, SIGKILL, before any task of its own starts on the same ports;
it lists them in its hello (`reaped`) and in `log` lines.

Standard library only; of the launcher, imports proctree and the agent's
files and spawn (the token's name).
"""

from __future__ import annotations

import json
import os
import signal
import time

from launcher.agent.files import private_dir, read_json, unlink, write_private
from launcher.agent.spawn import TOKEN_VAR
from launcher.proctree import has_env, proc_stat, processes

REAP_GRACE_S = 1.0  # leftovers of a dead generation have nothing to save


class PidRecords:
    """The run directory's `pids/` folder: written here, reaped by the next agent."""

    def __init__(self, run_dir: str, emit) -> None:
        self.run_dir = run_dir
        self.emit = emit

    def write(self, name: str, generation: int | None, pid: int, token: str) -> str | None:
        """Write a task's (or, with generation None, a standby's) pid file, for
        a later agent to reap it if we die; its path, None if it failed."""
        start = proc_stat(pid)
        record = {"task": name, "generation": generation, "pid": pid,
                  "start": start[3] if start else None, "token": token,
                  "agent_pid": os.getpid()}
        path = os.path.join(self.run_dir, "pids", f"{name}-{token}.json")
        try:  # whatever fails here, the task runs on and is watched (a full disk...)
            path = os.path.join(private_dir(self.run_dir, "pids"), f"{name}-{token}.json")
            write_private(path + ".tmp", json.dumps(record))
            os.replace(path + ".tmp", path)  # a reader never sees half a record
        except OSError as exc:
            self.emit("log", text=f"cannot record {name} in {path}: {exc}")
            return None
        return path

    def reap_leftovers(self) -> list[dict]:
        """Kill what is left of the tasks an earlier agent of this run dir
        recorded before any task of ours starts. Returns what was found alive."""
        folder = os.path.join(self.run_dir, "pids")
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
        except OSError:
            return []
        records = [r for r in (_read_record(os.path.join(folder, n)) for n in names) if r]
        found = _leftovers(records) if records else {}
        reaped = []
        if found:
            killed = _terminate(lambda: _leftovers(records))
            for index, pids in sorted(found.items()):
                record = records[index]
                reaped.append({"task": record["task"], "generation": record["generation"],
                               "agent_pid": record["agent_pid"], "pids": sorted(pids),
                               "sigkilled": sorted(pids & killed)})
        for name in names:
            unlink(os.path.join(folder, name))
        return reaped


def _read_record(path: str) -> dict | None:
    record = read_json(path, 4096)
    ok = (isinstance(record, dict) and isinstance(record.get("pid"), int)
          and isinstance(record.get("token"), str) and len(record["token"]) >= 8
          and isinstance(record.get("start"), int | None))
    return record if ok else None


def _leftovers(records: list[dict]) -> dict[int, set[int]]:
    """Live processes of each recorded task: record index -> pids.

    A process is the task's when its environment has the task's token (the
    task and every descendant that kept its environment), or when it is in
    the task's process group and that group is proven to be the task's (its
    leader has the recorded start time, or a member has the token): a pid
    reused since then is never touched.
    """
    # pid -> (state, parent, group, start), never us
    table = {pid: stat for pid, stat in processes().items() if pid != os.getpid()}
    found: dict[int, set[int]] = {}
    for index, record in enumerate(records):
        needle = f"{TOKEN_VAR}={record['token']}".encode()
        start = record.get("start")
        pids = {pid for pid, stat in table.items()
                if (start is None or stat[3] >= start) and has_env(pid, needle)}
        leader = table.get(record["pid"])
        if pids or (leader is not None and start is not None and leader[3] == start):
            pids |= {pid for pid, stat in table.items() if stat[2] == record["pid"]}
        if pids:
            found[index] = pids
    return found


def _terminate(find) -> set[int]:
    """SIGTERM (and SIGCONT) what `find()` returns, SIGKILL what is still there
    after REAP_GRACE_S, wait until it is gone; the pids that needed SIGKILL."""
    def signal_all(signum: int) -> set[int]:
        victims = set().union(*find().values())
        for pid in victims:
            try:
                os.kill(pid, signum)
            except OSError:
                pass
        return victims

    signal_all(signal.SIGTERM)
    signal_all(signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
    deadline = time.monotonic() + REAP_GRACE_S
    while find() and time.monotonic() < deadline:
        time.sleep(0.02)
    killed = signal_all(signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while killed and find() and time.monotonic() < deadline:
        time.sleep(0.02)
    return killed
