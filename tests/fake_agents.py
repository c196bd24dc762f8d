"""Scripted agents and a fake clock for driving the real `Supervisor` in milliseconds.

Only for unit tests of the supervisor's policy (a pure state machine fed by
messages): every end-to-end test runs real agents and real processes. Time
never passes for real: when the supervisor waits for a message and none is
due, the clock jumps to the next scripted event (or by the wait's timeout).
"""

from __future__ import annotations

import heapq
import io
import itertools
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.job.policy.recovery import HostInfo
from launcher.job.run.supervisor import RestartPolicy, Supervisor
from launcher.outlets.printer import Printer
from launcher.spec.config import local_config
from launcher.spec.plan import Plan, build_plan
from launcher.spec.rundir import RunRecorder
from launcher.transport import AgentMessage


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1_700_000_000.0 + self.now


class World:
    """The scheduled messages of every fake agent, and the supervisor's queue."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self._due: list[tuple[float, int, AgentMessage]] = []
        self._order = itertools.count()
        self.ready: queue.Queue[AgentMessage] = queue.Queue()

    def at(self, delay: float, host: str, message: dict[str, Any], link_id: int = 0) -> None:
        message.setdefault("t", self.clock.wall() + delay)
        heapq.heappush(self._due, (self.clock.now + delay, next(self._order),
                                   AgentMessage(host, message, link_id)))

    def _deliver(self) -> None:
        while self._due and self._due[0][0] <= self.clock.now:
            message = heapq.heappop(self._due)[2]
            if not message.message.pop("_cancelled", False):
                self.ready.put(message)

    # The queue interface the supervisor uses.
    def get(self, timeout: float | None = None) -> AgentMessage:
        self._deliver()
        if not self.ready.empty():
            return self.ready.get_nowait()
        step = timeout or 0.0
        if self._due:
            step = min(step, max(0.0, self._due[0][0] - self.clock.now))
        self.clock.now += step
        self._deliver()
        if not self.ready.empty():
            return self.ready.get_nowait()
        raise queue.Empty

    def put(self, message: AgentMessage) -> None:
        self.ready.put(message)


# What a scripted task does once started: (delay after start, kind, details).
Script = Callable[[int, str], list[tuple[float, str, dict[str, Any]]]]


@dataclass
class FakeLink:
    """An `AgentLink` whose agent follows a script instead of running processes."""

    host: str
    world: World
    script: Script
    silent_after: float | None = None  # the agent stops talking at this clock time
    ignore_start: set[str] = field(default_factory=set)
    stacks: dict[str, str] = field(default_factory=dict)
    link_id: int = 0
    closed: bool = False
    sent: list[dict[str, Any]] = field(default_factory=list)
    # task -> (generation, when its scripted exit is due, that exit message)
    running: dict[str, tuple[int, float, dict[str, Any] | None]] = field(default_factory=dict)
    _pids: itertools.count = field(default_factory=lambda: itertools.count(100))

    @property
    def last_seen(self) -> float:
        now = self.world.clock.now
        return now if self.silent_after is None else min(now, self.silent_after)

    def _alive(self) -> dict[str, tuple[int, float, dict[str, Any] | None]]:
        now = self.world.clock.now
        self.running = {t: r for t, r in self.running.items() if r[1] > now}
        return self.running

    def send(self, message: dict[str, Any]) -> bool:
        if self.closed:
            return False
        self.sent.append(message)
        op = message.get("op")
        if op == "start" and message["task"] not in self.ignore_start:
            self._start(message["task"], message["generation"])
        elif op == "stop":
            for task, (generation, _due, scripted) in list(self._alive().items()):
                if scripted is not None:
                    scripted["_cancelled"] = True
                self.world.at(0.01, self.host, _exited(task, generation, signal=15,
                                                       stopping=True))
                del self.running[task]
        elif op == "stacks":
            for task in message.get("tasks") or list(self._alive()):
                if task in self._alive():
                    self.world.at(0.2, self.host, {
                        "ev": "stacks", "task": task, "generation": self.running[task][0],
                        "text": self.stacks.get(task, ""),
                        "error": "" if task in self.stacks else "the process is stopped"})
        return True

    def close(self) -> None:
        self.closed = True

    def _start(self, task: str, generation: int) -> None:
        self.running[task] = (generation, float("inf"), None)
        self.world.at(0.01, self.host, {"ev": "started", "task": task,
                                        "generation": generation, "pid": next(self._pids)})
        for delay, kind, details in self.script(generation, task):
            if kind == "exit":
                message = _exited(task, generation, **details)
                self.running[task] = (generation, self.world.clock.now + delay, message)
                self.world.at(delay, self.host, message)
            else:
                self.world.at(delay, self.host, {"ev": kind, "task": task,
                                                 "generation": generation, **details})


def _exited(task: str, generation: int, code: int | None = None, signal: int | None = None,
            stopping: bool = False, tail: list[str] | None = None,
            error: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"ev": "exited", "task": task, "generation": generation, "code": code,
            "signal": signal, "stopping": stopping, "tail": tail or [], "error": error}


@dataclass
class Harness:
    supervisor: Supervisor
    clock: FakeClock
    world: World
    links: dict[str, FakeLink]
    recorder: RunRecorder
    stream: io.StringIO
    run_dir: Path
    printer: Printer

    @property
    def output(self) -> io.StringIO:
        """What the printer wrote: its writer thread drained first (it writes
        from a thread of its own, so a line just told may not be there yet)."""
        self.printer.flush(timeout=5.0)
        return self.stream

    def events(self, name: str) -> list[dict[str, Any]]:
        import json

        self.recorder._events.flush()
        lines = (self.run_dir / "events.jsonl").read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == name]


def harness(tmp_path: Path, script: Script, hosts: int = 2,
            checkpoint_probe: Callable[[], Any] = lambda: None, loaded: Any = None,
            **policy: Any) -> Harness:
    clock = FakeClock()
    world = World(clock)
    loaded = loaded or local_config(hosts)
    hosts = len(loaded.config.hosts)

    def make_plan(generation: int, active: Any = None) -> Plan:
        return build_plan(loaded, ["train.py"], run_dir=str(tmp_path), generation=generation,
                          ports=list(range(30000, 30016)), active_hosts=active)

    plan = make_plan(0)
    # Every host of the file has an agent, spares too (as a launch connects them).
    names = [h.name or h.address for h in loaded.config.hosts]
    links = {name: FakeLink(name, world, script) for name in names}
    recorder = RunRecorder(tmp_path, clock=clock.wall)
    output = io.StringIO()
    printer = Printer([t.label for t in plan.tasks], stream=output, live=False, colour=False)
    settings = {"max_restarts": 3, "backoff_s": 0.0, "heartbeat_timeout_s": 10.0,
                "hang_timeout_s": 300.0, "warm_standby": "off", **policy}
    supervisor = Supervisor(
        make_plan=make_plan,
        hosts=[HostInfo(name, 1, h.spare) for name, h in zip(names, loaded.config.hosts,
                                                            strict=True)],
        links=links, events=world, recorder=recorder, voice=printer,
        policy=RestartPolicy(**settings), checkpoint_probe=checkpoint_probe,
        clock=clock, wall_clock=clock.wall)
    return Harness(supervisor, clock, world, links, recorder, output, tmp_path, printer)
