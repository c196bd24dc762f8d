"""One launch: a job from a loaded config to its result.

Where a launch happens, in the order it happens:

    launch = Launch(loaded, command, run_dir)     targets, TF addresses (reach.py)
    first = launch.prepare()                      generation 0 (`first.plan`; `--dry-run`
                                                  prints launch.plan(0)); simulated hosts:
                                                  the checkpoint dir claimed (`first.moved`:
                                                  another one, for the command to say),
                                                  ports free
    connected = launch.connect(make_transport(config), first.plan)  agents, hellos, re-plan
    launch.preflight(connected)                   the firewall's refusals and notices
    job = launch.start(connected, screen)         run directory, supervisor
    outcome = job.run()                           supervise, then summary.json

The steps from the connect on are one call for every launch,
`sequence.run_launch` (early ends as values, a stop handed in). The steps up
to the connect are `reach.py`'s, shared with `mgpu-launch check`.
This module returns values or raises (`LaunchRefused`, and the spec's and
transport's own errors); it never prints, words or exits: the cli parses arguments,
makes the printer (a `Screen`) and hands it in, owns the signals, and turns
what comes back into text and exit codes.

Must not import: views, commands, cli.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from ...spec.allocation import system_of
from ...spec.config import LoadedConfig, dump_config, effective_roles
from ...spec.plan import Plan, PlanError, default_checkpoint_dir
from ...spec.rundir import EVENTS, RunRecorder
from ...spec.transports import traits
from ...transport import Transport
from ...transport.link import close_links
from ...transport.ports import busy_ports
from ..detect import checkpoints
from ..lines.output import Voice
from ..policy import stops
from ..policy.recovery import HostInfo
from ..record import events as ev
from ..record import story
from ..record.states import JobStatus, RunResult
from . import fwreport
from .reach import Connected, Reach
from .supervisor import Supervisor


class LaunchRefused(Exception):
    """The job cannot start here; the message says why and what to do."""


class Screen(Voice, Protocol):
    """The voice a launch is handed (the operator's printer is one): it also
    knows whether the terminal went away, and is closed when the job ends."""

    terminal_lost: str | None
    terminal_lost_t: float | None
    dropped: int

    def close(self) -> None: ...


class View(ev.Listener, Protocol):
    """A view of the job beside the screen (metrics, notifications: launcher/views/
    outlets.py): told every event; opened before the supervisor runs, with a way
    to add its own events to the story (from any thread); closed (bounded) after."""

    def open(self, record: Callable[[ev.Event], None]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Prepared:
    """Generation 0 planned, before any host is reached (`Launch.prepare`)."""

    plan: Plan
    moved: checkpoints.Moved | None = None  # the checkpoint directory this run uses instead


@dataclass(frozen=True)
class Outcome:
    """What a launch came to: the job's result and the summary written."""

    result: RunResult
    summary: dict[str, Any]  # summary.json, as written (or as it would have been)
    stop: dict[str, Any] | None  # what a stop did to the tasks (interrupted runs)
    drops: str  # the task output lines the logs lack, said once; "" when none
    unwritten: str | None = None  # why summary.json could not be written


class Launch:
    """One launch of `command` on a loaded config into `run_dir`."""

    def __init__(self, loaded: LoadedConfig, command: Sequence[str], run_dir: Path,
                 launch_cwd: str | None = None) -> None:
        self.run_dir = run_dir
        self.reach = Reach(loaded, command, str(run_dir), launch_cwd)

    @property
    def loaded(self) -> LoadedConfig:
        return self.reach.loaded

    def plan(self, generation: int = 0, active_hosts: Sequence[str] | None = None,
             ports: Sequence[int] | None = None) -> Plan:
        return self.reach.plan(generation, active_hosts, ports)

    @property
    def pythons(self) -> list[str]:
        """Each host's Python, in the order of the hosts (simulated hosts: this machine's)."""
        return [t.python for t in self.reach.targets]

    def prepare(self, claim: bool = True) -> Prepared:
        """What every launch does before it reaches a host: on simulated hosts
        the checkpoint directory claimed (unless not `claim`: a detached run
        claims it in its own process; a directory moved is returned, to be
        said); generation 0 planned; on simulated hosts its ports checked free.
        Raises LaunchRefused or PlanError."""
        local = traits(self.loaded.config.transport).simulated
        moved = self.claim_checkpoint_dir() if local and claim else None
        first = self.plan(0)
        if local:
            self.check_ports(first)
        return Prepared(first, moved)

    def claim_checkpoint_dir(self) -> checkpoints.Moved | None:
        """Simulated hosts: no two live runs share a checkpoint directory (each
        would resume from, and overwrite, the other's backups). A default
        directory in use is replaced by the next free `<dir>-2`, `-3`, ... (and
        that is returned); one the cluster file names is refused.
        Real hosts' directories are not visible here to lock."""
        loaded = self.loaded
        wanted = Path(default_checkpoint_dir(loaded))
        for attempt in range(1, 100):
            candidate = wanted if attempt == 1 else wanted.with_name(f"{wanted.name}-{attempt}")
            try:
                checkpoints.claim(candidate, self.run_dir)  # held until this process ends
            except checkpoints.CheckpointDirBusy as exc:
                if loaded.config.checkpoint.dir is not None:
                    raise LaunchRefused(f"{exc}: two jobs must not share a checkpoint "
                                        "directory; wait for it, or set another "
                                        "`checkpoint.dir`") from None
                continue
            if attempt == 1:
                return None
            checkpoint = loaded.config.checkpoint.model_copy(update={"dir": str(candidate)})
            self.reach.loaded = replace(
                loaded, config=loaded.config.model_copy(update={"checkpoint": checkpoint}))
            return checkpoints.Moved(wanted, candidate)
        raise LaunchRefused(f"{wanted} and 98 more checkpoint directories are in use")

    def check_ports(self, plan: Plan) -> None:
        """Simulated hosts: the planned ports are free on this machine."""
        busy = busy_ports([t.port for t in plan.tasks if t.port])
        if busy:
            details = ", ".join(f"{p}{_port_holder(p)}" for p in busy)
            raise LaunchRefused(f"port(s) already in use on this machine: {details}\n"
                                "  stop what holds them, set `ports: {base: <other port>}`, "
                                "or `ports: {base: auto}`")

    def connect(self, transport: Transport, first: Plan) -> Connected:
        """Every host's agent and hello; generation 0 re-planned with them.
        Raises TransportError or AddressError (nothing left connected)."""
        return self.reach.connect(transport, first)

    def preflight(self, connected: Connected) -> tuple[list[str], list[str]]:
        """(refusals, notices) of the job's firewall on each host, from the hellos."""
        return fwreport.preflight(self.loaded.config.security.tf_ports, connected.hellos())

    def start(self, connected: Connected, screen: Screen,
              max_restarts: int | None = None, views: Sequence[View] = ()) -> Job:
        """The run directory's first files and the job's supervisor, not yet running.
        `max_restarts` overrides `restart.max_restarts` (`--max-restarts`)."""
        loaded = self.loaded
        config = loaded.config
        recorder = RunRecorder(self.run_dir)
        recorder.write_config(dump_config(loaded))
        policy = config.restart
        if max_restarts is not None:
            policy = policy.model_copy(update={"max_restarts": max_restarts})
        first = connected.plan
        supervisor = Supervisor(
            make_plan=lambda g, active: first if g == 0 else self.plan(g, active),
            hosts=[HostInfo(h.name or h.address, _workers_on(loaded, h), h.spare)
                   for h in config.hosts],
            links=connected.links, events=connected.events, recorder=recorder, voice=screen,
            policy=policy, reconnect=connected.reconnect,
            checkpoint_probe=lambda: checkpoints.checkpoint_state(first.checkpoint_dir),
            launcher_info={"launcher_pid": os.getpid(), "launcher_host": socket.gethostname(),
                           "command": tuple(self.reach.command),
                           "hosts": host_facts(connected.hellos())},
            listeners=views, max_skips=config.max_skips,
        )
        return Job(self, connected, supervisor, recorder, screen, views)


class Job:
    """A started launch: its supervisor runs in `run()`; stops are asked for
    with `request_stop` (safe from a signal handler)."""

    def __init__(self, launch: Launch, connected: Connected, supervisor: Supervisor,
                 recorder: RunRecorder, screen: Screen, views: Sequence[View] = ()) -> None:
        self.views = list(views)
        self._views_open = False
        self._record_lock = threading.Lock()
        self.launch = launch
        self.connected = connected
        self.supervisor = supervisor
        self.recorder = recorder
        self.screen = screen

    def request_stop(self, signum: int) -> None:
        self.supervisor.request_stop(signum)

    def run(self) -> Outcome:
        """Supervise the job, then write its summary: a result, whatever happens."""
        self._views_open = True
        for view in self.views:
            view.open(self._record)
        try:
            result = self._supervise()
        finally:
            for view in self.views:
                view.close()
            with self._record_lock:
                self._views_open = False
        loaded = self.launch.loaded
        if traits(loaded.config.transport).allocation and result.interrupted_by == signal.SIGTERM:
            system = system_of(loaded.config.transport)
            result = replace(result, message=system.why_stopped(system.read(os.environ).job_id))
        told = self._story()
        summary = self._note_terminal(_summary(result, told))
        stop = stops.entry(result, self.connected.plan.grace_s)  # what a stop did to the tasks
        if stop is not None:
            summary["stop"] = stop
        summary["goodput"] = told.goodput() if told is not None else None
        events = self.connected.events
        events.close()
        if events.dropped or events.cut:  # lines the logs lack, or have cut
            summary["output_lines_dropped"] = dict(events.dropped)
            summary["output_lines_cut"] = dict(events.cut)
        unwritten = None
        try:
            self.recorder.write_summary(summary)
        except OSError as exc:  # a full disk: the summary still reaches the user
            unwritten = str(exc)
        self.recorder.close()
        return Outcome(result, summary, stop, events.drop_report(), unwritten)

    def _record(self, event: ev.Event) -> None:
        """A view's own event (e.g. a notification failed): written and said."""
        with self._record_lock:
            if not self._views_open:
                return
            ev.write(self.recorder, event)
        self.screen.tell(event)

    def _supervise(self) -> RunResult:
        """Run the job; whatever happens, every agent's link and the transport
        are closed afterwards, and a fault of the launcher itself is a failed result."""
        started = time.monotonic()
        try:
            result = self.supervisor.run()
        except Exception as exc:  # still stop everything, and report
            failed = ev.LauncherFailed(error_type=type(exc).__name__, error=str(exc),
                                       plan=isinstance(exc, PlanError))  # e.g. hosts lost
            why = str(exc) if failed.plan else f"{failed.error_type}: {failed.error}"
            result = RunResult(status=JobStatus.FAILED, restarts=0,
                               wall_s=time.monotonic() - started, root_cause=None, tasks={},
                               message=why)
            done = ev.JobDone(status="failed", wall_s=round(result.wall_s, 3), message=why)
            for event in (failed, done):  # the story still ends (status, report, notify)
                ev.write(self.recorder, event)
                for view in self.views:
                    view.tell(event)
            self.screen.tell(failed)  # its words: launcher/views/narrate.py
        finally:
            close_links(self.supervisor.links.values())
            self.connected.transport.close()
            self.screen.close()
        return result

    def _story(self) -> story.Story | None:
        """The run's model, folded from events.jsonl as written (as `status` reads it)."""
        try:
            with open(self.recorder.run_dir / EVENTS, errors="replace") as lines:
                return story.fold(story.records(lines))
        except OSError:
            return None

    def _note_terminal(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Record in the run directory that the terminal went away (when, why)
        and how many lines it did not show."""
        screen = self.screen
        if screen.terminal_lost is not None:
            ev.write(self.recorder, ev.TerminalLost(reason=screen.terminal_lost,
                                                    lost_t=screen.terminal_lost_t))
            summary["terminal_lost"] = {"reason": screen.terminal_lost,
                                        "t": screen.terminal_lost_t}
        if screen.dropped:
            summary["terminal_lines_dropped"] = screen.dropped
        return summary


def host_facts(hellos: dict[str, dict[str, Any] | None]) -> tuple[dict[str, Any], ...]:
    """Each host's versions, as its agent's hello told them (generation 0's `launch`)."""
    facts = []
    for host, hello in hellos.items():
        hello = hello or {}
        packages = hello.get("packages") or {}
        facts.append({"host": host, "hostname": hello.get("hostname"),
                      "mgpu_launch": hello.get("version"),
                      "python": hello.get("python_version"),
                      **{name: packages.get(name) for name in ("tensorflow", "keras", "tf_keras")}})
    return tuple(facts)


def _workers_on(loaded: LoadedConfig, spec: Any) -> int:
    roles = effective_roles(loaded.config, spec)
    return roles.get("chief", 0) + roles.get("worker", 0)


def _port_holder(port: int) -> str:
    try:
        import psutil

        for conn in psutil.net_connections(kind="inet"):
            listening = conn.laddr and conn.status == psutil.CONN_LISTEN
            if listening and conn.laddr.port == port and conn.pid:
                proc = psutil.Process(conn.pid)
                return f" (held by pid {conn.pid}: {' '.join(proc.cmdline())[:80]})"
    except Exception:  # best effort: psutil may lack the rights to look
        pass
    return ""


def _summary(result: RunResult, told: story.Story | None) -> dict[str, Any]:
    """summary.json: the story's rendering (launcher/job/record/story.py); the result's
    own words only where the story cannot say them (its end never told, or a
    reason the launch learnt after it: a Slurm allocation's end)."""
    if told is None or told.ended is None:
        return result.to_json()
    return {**told.summary(), "message": result.message}
