"""One generation's run: start its tasks, route every agent message to the
detectors and the story, act on what they find, and end it.

The supervisor (job/run/supervisor.py) runs the job across generations and
decides each restart; this runner does what happens inside one generation, on
the supervisor's thread. Agents' reader threads push `AgentMessage`s into one
queue; only this thread reads it and mutates state. Signals only set a flag
(`request_stop`), read by the loop.

A failure is acted on when it is first seen — a task's exit, a fatal
TensorFlow error in its output, a silent task, a silent host — because TF
peers of a dead or hung worker take many seconds to exit by themselves. The
detectors return what they find (job/detect/findings.py); the loop acts on it (`_act`).

Must not import: cli, ops. Talks to hosts only through `AgentLink`s.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any

from ...spec.config import RestartPolicy
from ...spec.plan import Plan, Task
from ...spec.rundir import RunRecorder
from ...strategy import ON_JAX, Strategy
from ...transport import AgentLink, AgentMessage
from ..detect import resumes
from ..detect.findings import Failures, Finding, Found, HostSilent, restarted_alone
from ..detect.generation import Generation
from ..detect.radar import Radar
from ..detect.sentinel import Sentinel
from ..detect.tailcut import grace_s as tail_grace
from ..detect.watch import Watch
from ..lines.output import TaskOutput, Voice
from ..policy.fence import tasks_over_by
from ..policy.teardown import Teardown
from ..record import events as ev
from ..record.classify import OutputWatcher, exit_of
from ..record.failkinds import Kind, traits
from ..record.phases import Phase
from ..record.states import IllegalTransition, TaskRecord, TaskState
from ..record.story import Beside
from . import fwreport
from .intake import Intake
from .peerrelay import PeerRelay
from .profiling import Profiler
from .protocol import BadMessage, check_message
from .teller import Teller

POLL_S = 0.1
MAX_BATCH = 500  # messages handled per loop turn before the checks run again
# At a generation's end, for what is still queued (transport/inbox.py): at most
# 20,000 lines, seconds even on a busy host; a second Ctrl-C cuts it short.
DRAIN_S = 10.0
# A ParameterServerStrategy worker that keeps dying is a real failure.
MAX_SINGLE_WORKER_RESTARTS = 5
# Messages refused as malformed that are recorded one by one; the rest are counted.
MAX_BAD_MESSAGES_RECORDED = 20


class GenerationRunner:
    def __init__(self, links: dict[str, AgentLink], events: queue.Queue[AgentMessage],
                 recorder: RunRecorder, voice: Voice, story: Teller, policy: RestartPolicy,
                 resumes: resumes.Resumes, sentinel: Sentinel, spares: tuple[str, ...],
                 checkpoint_probe: Callable[[], Any], launcher_info: dict[str, Any],
                 clock: Callable[[], float], wall_clock: Callable[[], float]) -> None:
        self._links = links
        self._events = events
        self._voice = voice
        self._story = story
        self._policy = policy
        self._launcher_info = launcher_info
        self._clock = clock
        self._output = TaskOutput(voice, recorder, clock, story.tell)
        self._failures = Failures(story.tell, wall_clock)
        self.stop_signal: int | None = None
        self._stop_count = 0
        self._handled_stops = 0
        self._bad_messages = 0
        self.starts: dict[str, str] = {}  # task -> "warm" / "cold", this generation
        self._teardown = Teardown(links, recorder, clock, story.tell, story.happen)
        # The memory tier's copies on other hosts, relayed and placed (job/run/peerrelay.py).
        self._peers = PeerRelay(lambda: self._links, story.tell, clock)
        self._opened: dict[str, set[int]] = {}  # ports each host's tasks opened (fwreport)
        self._watch = Watch(policy, links, clock, story.tell)
        self.current: Generation | None = None  # read-only for observers (live view)
        # Synchronized traces of the running tasks (job/run/profiling.py).
        self.profiler = Profiler(getattr(recorder, "run_dir", None), clock, wall_clock)
        self.radar = Radar(story.tell, clock, policy.on_straggler, spares=spares,
                           probe=checkpoint_probe, profiler=self.profiler,  # named, replaced
                           alive=lambda h: not getattr(self._links.get(h), "closed", True))
        # Every progress report, heard by the detectors that read progress (job/run/intake.py).
        self._intake = Intake(clock, story.tell, self._act, self._watch, sentinel,
                              resumes, self.radar)

    def request_stop(self, signum: int) -> None:
        """Safe from a signal handler: only records the request."""
        self.stop_signal = signum
        self._stop_count += 1

    def stop_pending(self) -> bool:
        return self._stop_count > self._handled_stops

    # -------------------------------------------------------------- generation

    def run(self, plan: Plan) -> Generation:
        """Start the plan's tasks, watch them until the generation is over
        (done, failed and torn down, or stopped), and return it."""
        jax = plan.strategy in ON_JAX
        gen = Generation(plan, {t.name: TaskRecord(t, watcher=OutputWatcher(jax=jax))
                                for t in plan.tasks}, started_at=self._clock(),
                         tell=self._story.tell)
        self.current = gen
        self.starts = {}
        first = self._launcher_info if plan.generation == 0 else {}  # what ran, on what
        self._story.tell(ev.Launch(
            generation=plan.generation, launcher_pid=self._launcher_info.get("launcher_pid"),
            launcher_host=self._launcher_info.get("launcher_host"),
            tasks=tuple(ev.Placed(task=t.name, host=t.host, address=t.address, port=t.port,
                                  address_rule=t.address_rule, lifetime=t.lifetime)
                        for t in plan.tasks),
            command=first.get("command"), hosts=first.get("hosts")))
        gen.tell_phase()  # starting
        for task in plan.tasks:
            if task.host not in gen.lost_hosts:  # a dead link found by an earlier start
                self._start(gen, task)
        next_watch = self._clock()
        while True:
            self._turn(gen)
            if self._clock() >= next_watch:
                next_watch = self._clock() + 0.5
                for found in self._watch.silence(gen):
                    self._act(gen, found)
                self._story.write_due()  # progress held back, now due
                self.profiler.poll(gen, self._links)  # traces asked by `mgpu-launch profile`
                self.radar.tick(gen, self._links)  # and the straggler radar's, rarely
                self._peers.tick()  # the memory tier's offers waiting for a worker's save
                self._voice.refresh(self.snapshot())
            if self._decide(gen):
                break
        self._drain(gen)
        if gen.phase.stopping:
            self._story.tell(ev.TeardownDone(generation=plan.generation))
        gen.enter(Phase.ENDED)
        return gen

    def _turn(self, gen: Generation) -> None:
        """Take a stop request, then a batch of messages."""
        if self.stop_pending():
            self._handled_stops = self._stop_count
            self._teardown.on_stop_request(gen, self.stop_signal)
        message = self._next_message(POLL_S)
        # Drain a burst in one go: a flood of output lines must not delay
        # the exit report queued behind it by a loop turn per line.
        for handled in range(1, MAX_BATCH + 1):
            if message is None:
                break
            self._handle_safely(gen, message)
            # ...but act on a failure at once, before more lines are read
            # (and take no message the batch would not handle: it would be lost).
            message = None if gen.settled() or handled == MAX_BATCH else self._next_message(0)

    def _decide(self, gen: Generation) -> bool:
        """What the phase calls for now; True when the generation is over."""
        if gen.phase.stopping:
            if gen.all_terminal():
                return True
            if self._clock() > gen.teardown_deadline:
                self._teardown.give_up_on_stragglers(gen)
                return True
        elif gen.phase in (Phase.FAILING, Phase.TAKING_STACKS):
            if self._teardown.collecting_stacks(gen):
                return False  # a hung job: its stacks first, then the teardown
            self._teardown.after_failure(gen)
        elif gen.jobs_done():
            if not gen.services_left():
                return True
            # Servers (ps, PS-strategy workers) never exit by themselves.
            gen.enter(Phase.TEARING_DOWN)
            self._teardown.stop_tasks(gen, "finished", gen.plan.grace_s)
        return False

    def _drain(self, gen: Generation) -> None:
        """Handle what is still queued as a generation ends (in a flood, output
        that an exit went ahead of: the logs get a task's last lines), for at
        most DRAIN_S."""
        deadline = self._clock() + DRAIN_S
        while self._clock() < deadline and not self.stop_pending():
            message = self._next_message(0)
            if message is None:
                return
            self._handle_safely(gen, message)

    def _start(self, gen: Generation, task: Task) -> None:
        record = gen.records[task.name]
        self._story.happen(gen, ev.TaskStarting(generation=gen.plan.generation, task=task.name,
                                                host=task.host))
        record.started_at = record.last_activity = self._clock()
        link = self._links.get(task.host)
        sent = link is not None and link.send({
            "op": "start",
            "task": task.name,
            "generation": gen.plan.generation,
            "argv": list(task.argv),
            "cwd": task.cwd,
            "env": dict(task.env),
            "tf_config": task.tf_config_json(),
            "standby": self._policy.warm_standby,
            # The host's firewall rules for the job's ports (launcher.firewall).
            "firewall": seal.to_json() if (seal := gen.plan.firewall.get(task.host)) else None,
        })
        if not sent:
            self._host_lost(gen, task.host, "agent connection is closed")

    # ---------------------------------------------- between generations, mail

    def place_copies(self, plan: Plan) -> None:
        """The memory tier: before a restart, the newest save each host of the
        plan needs, in its memory (job/run/peerrelay.py)."""
        keep = next((t.env.get("MGPU_MEMORY_COPIES") for t in plan.tasks), None)
        if not keep:
            return
        hosts = [t.host for t in plan.tasks]
        self._peers.use_plan(hosts, int(keep))
        if plan.generation > 0:
            self._peers.prepare(hosts, lambda: self.wait(POLL_S))

    def wait(self, seconds: float) -> bool:
        """Sleep while draining events; True when a stop was requested meanwhile."""
        deadline = self._clock() + seconds
        while self._clock() < deadline:
            if self.stop_pending():
                return True
            self._peers.tick()  # an offer waiting for a worker's save, during a backoff too
            message = self._next_message(min(POLL_S, max(0.0, deadline - self._clock())))
            if message is not None and message.event == "output":
                self._output.line(None, message)
            elif message is not None and message.event in ("hello", "log"):  # a host came back,
                self._handle(None, message)  # its agent's word: no generation's (agent_log)
        return self.stop_pending()

    def _next_message(self, timeout: float) -> AgentMessage | None:
        """The next message from an agent, checked (`protocol`); None when none
        came within `timeout`. A malformed one is logged and skipped."""
        deadline = self._clock() + timeout
        while True:
            try:
                raw = self._events.get(timeout=max(0.0, deadline - self._clock()))
            except queue.Empty:
                return None
            try:
                message = AgentMessage(raw.host, check_message(raw.message), raw.link_id)
            except BadMessage as exc:
                self._refuse(raw, str(exc))
            else:
                if message.event == "ports_opened":  # sealed there: and on the other hosts
                    self._seal_ports(message)
                elif not self._peers.consumed(message):  # the memory tier's copies
                    return message
            if self._clock() >= deadline:
                return None

    def _seal_ports(self, message: AgentMessage | None, to: str | None = None) -> None:
        """Ports a host's tasks opened (sealed there): to the other hosts' agents;
        or (no message: a new agent's hello) every host's so far, to host `to`."""
        if message is not None:
            self._opened.setdefault(message.host, set()).update(message.message["ports"])
        sources = {message.host: message.message["ports"]} if message else self._opened
        for opened, ports in list(sources.items()) if self.current is not None else []:
            command = fwreport.seal_ports(self.current.plan, opened, sorted(ports))
            for host, link in list(self._links.items()):
                if command is not None and host != opened and to in (None, host):
                    link.send(command)

    def _refuse(self, raw: AgentMessage, why: str) -> None:
        self._bad_messages += 1
        if self._bad_messages <= MAX_BAD_MESSAGES_RECORDED:
            self._story.tell(ev.BadMessage(host=raw.host, reason=why))

    # --------------------------------------------------------------- messages

    def _handle_safely(self, gen: Generation, message: AgentMessage) -> None:
        """A message the checks let through may still not fit the current state
        (a late exit, a task started twice): it is logged, never fatal."""
        try:
            self._handle(gen, message)
        except IllegalTransition as exc:
            self._refuse(message, f"{message.event}: illegal transition {exc}")
        except Exception as exc:  # noqa: BLE001 - one message must not end a job of days
            self._refuse(message, f"{message.event}: {type(exc).__name__}: {exc}")

    def _handle(self, gen: Generation | None, message: AgentMessage) -> None:
        body = message.message
        event = message.event
        link = self._links.get(message.host)
        if link is not None and message.link_id and message.link_id != link.link_id:
            # A late message of a host's previous connection (it reconnected
            # since): its output may still be shown, nothing else is acted on.
            if event == "output":
                self._act(gen, self._output.line(gen, message))
            return
        if event == "agent_lost":
            if message.host in {t.host for t in gen.plan.tasks}:
                self._host_lost(gen, message.host, str(body.get("detail") or "connection closed"))
        elif event == "log":  # the agent's own diagnostics
            self._story.tell(ev.AgentLog(host=message.host, text=str(body.get("text", "")),
                                   notice=bool(body.get("notice"))))
        elif event == "hello":
            self._on_hello(message.host, body)
        elif event == "output":
            self._act(gen, self._output.line(gen, message))
        elif event == "heartbeat":
            for task_name, usage in body["tasks"].items():
                record = gen.records.get(task_name)
                if record is not None and record.task.host == message.host:
                    record.usage = usage
                    self._act(gen, self._watch.stopped(gen, record, usage.get("status"),
                                                       body.get("t")))
                    self._act(gen, self.radar.heartbeat(gen, record, usage, body.get("t")))
        else:
            self._handle_task(gen, message)

    def _handle_task(self, gen: Generation, message: AgentMessage) -> None:
        """A message about one task of this generation."""
        body, event = message.message, message.event
        name = body.get("task")
        record = gen.records.get(name) if name else None
        if event in ("profile", "profile_part"):
            self.profiler.on_message(message.host, body)
            return
        if event == "stacks" and record is not None and body.get("generation") is None:
            gen.stacks_pending.discard(name)  # the agent has no such task running
            return
        if record is None or body.get("generation") != gen.plan.generation:
            return  # a late message about a previous generation, or no task of ours
        if record.task.host != message.host:
            raise ValueError(f"{message.host} speaks for {record.task.label}")
        if event == "started":
            record.pid = body["pid"]
            start = body.get("start") or "cold"
            self.starts[name] = start
            self._story.happen(gen, ev.TaskStarted(
                generation=gen.plan.generation, task=name, host=record.task.host,
                pid=record.pid, start=start, start_reason=body.get("start_reason") or ""))
        elif event == "start_failed":
            error = str(body.get("error", ""))
            self._story.happen(gen, ev.StartFailed(generation=gen.plan.generation, task=name,
                                             host=record.task.host, error=error))
            self._failures.fail(gen, Found(record, Kind.START_FAILED, "agent", {"error": error},
                                           t=body.get("t")))
        elif event == "exited":
            self._on_exit(gen, record, body)
        elif event == "progress":
            self._intake.hear(gen, record, body["data"])
        elif event == "stacks":
            self._teardown.on_stacks(gen, record, body)

    def _on_hello(self, host: str, hello: dict[str, Any]) -> None:
        """A new agent reaped what an earlier one of this job left on its host
        (tasks that outlived a lost connection): say so, it explains a gap.
        It learns the ports the other hosts' tasks opened."""
        self._seal_ports(None, to=host)
        reaped = hello.get("reaped")
        if not isinstance(reaped, list) or not reaped:
            return
        tasks = sorted({str(r.get("task")) for r in reaped if isinstance(r, dict)})
        self._story.tell(ev.Reaped(host=host, tasks=tuple(tasks), count=len(reaped)))

    # -------------------------------------------------------- exits, failures

    def _on_exit(self, gen: Generation, record: TaskRecord, body: dict[str, Any]) -> None:
        self._output.flush(record)
        record.exit_code = body.get("code")
        record.signal = body.get("signal")
        stopping = bool(body.get("stopping"))
        stopped = gen.tearing_down or record.state is TaskState.STOPPING
        self._story.happen(gen, ev.TaskExited(
            generation=gen.plan.generation, task=record.task.name, host=record.task.host,
            exit_code=record.exit_code, signal=record.signal, stopped_by_launcher=stopping))
        tail = tuple(body.get("tail") or ())
        kind, how, facts = exit_of(body, record.task.host, record.task.port,
                                   chosen=gen.plan.ports_chosen)
        found = Found(record, kind, how, facts, last_lines=tail, t=body.get("t"),
                      error=body.get("error"))
        if stopped:
            if record.state is TaskState.STOPPED and not stopping and record.exit_code != 0:
                # It died by itself, maybe before what started the teardown (its
                # exit report waits for its output to drain): it may be the cause.
                self._failures.consider(gen, self._failures.of(gen, found))
            return
        if record.state is TaskState.SUCCEEDED:  # a job task done, or a service that may end
            return
        if self._worker_restarts_alone(gen, record):
            self._story.happen(gen, restarted_alone(self._failures.of(gen, found)))
            self._start(gen, record.task)
            return
        self._failures.fail(gen, found)

    def _worker_restarts_alone(self, gen: Generation, record: TaskRecord) -> bool:
        """Under ParameterServerStrategy a worker's death does not fail the job:
        the coordinator reschedules its closures; the worker is started again
        on the same address so the cluster regains its capacity."""
        if gen.plan.strategy != Strategy.PARAMETER_SERVER or record.task.role != "worker":
            return False
        gen.single_restarts[record.task.name] = gen.single_restarts.get(record.task.name, 0) + 1
        return gen.single_restarts[record.task.name] <= MAX_SINGLE_WORKER_RESTARTS

    def _host_lost(self, gen: Generation, host: str, detail: str, silent: bool = False) -> None:
        if host in gen.lost_hosts:
            return
        gen.lost_hosts.add(host)
        now = self._clock()
        gen.fence_until = max(gen.fence_until, tasks_over_by(
            lost_at=now, last_seen=getattr(self._links.get(host), "last_seen", now),
            lease_s=self._policy.heartbeat_timeout_s, silent=silent))
        victims = [r for r in gen.on_host(host) if not r.state.terminal]
        tearing_down = gen.tearing_down
        self._story.happen(gen, ev.HostLost(generation=gen.plan.generation, host=host,
                                      detail=detail))
        link = self._links.get(host)
        if link is not None:
            link.close()  # if the agent is merely stuck, EOF makes it kill its tasks
        for record in victims:
            found = Found(record, Kind.HOST_LOST, "lost", {"detail": detail})
            if not tearing_down:
                self._failures.fail(gen, found)
            elif gen.failure is not None:  # a primary cause, if what we have is a symptom
                self._failures.consider(gen, self._failures.of(gen, found))

    def _act(self, gen: Generation, found: Finding | None) -> None:
        """What a detector found: a host lost, a finished job's tail cut, or a
        task's failure (a collective abort's culprit is then looked for)."""
        if isinstance(found, HostSilent):
            self._host_lost(gen, found.host, found.detail, silent=True)
        elif isinstance(found, ev.TailCut):
            self._story.tell(found)
            gen.enter(Phase.TEARING_DOWN)
            self._teardown.stop_tasks(gen, "done", tail_grace(found, gen.plan))  # its line says it
        elif found is not None:
            self._failures.fail(gen, found)
            if traits(found.kind).blames_a_peer:
                self._output.blame(gen, found.record)

    def snapshot(self) -> list[Beside]:
        """What the supervisor alone knows of every task of the current generation
        (the live table shows it beside the run's model)."""
        gen = self.current
        return [] if gen is None else gen.beside(self._clock())
