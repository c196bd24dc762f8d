"""`mgpu-launch check CLUSTER.yaml`: would a run start on this cluster?

For every host at once, through the same agents a run uses: reachable and
authenticated; Python, TensorFlow, Keras and tf-keras versions (and the Keras
backend with jax and jaxlib versions, checked under keras_distribution), differences
between hosts flagged; the planned ports free (each host briefly listens on
its own); every host able to reach every task's TF_CONFIG address and port;
the checkpoint directory shared (a nonce written from one host, read on the
others) and its free space; GPUs visible; then a tiny collective across every
task on the job's own plan (launcher/job/run/check_collective.py; `--no-collective`
skips it). Prints one row per host, one line per task of the collective, the
problems host by host, and a verdict. Exit 0 only when the run would start, 2
otherwise.

Small probes run on the hosts as `python -c` through the agent's `exec_check`
op (standard library only). The hosts are reached by the launch's own steps
(launcher/job/run/reach.py: addresses, plan, connect, hellos). Owns only this
report: never starts training.

Must not import: supervisor.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from .. import firewall
from ..job.run import check_collective, fwreport
from ..job.run.check_collective import CollectiveReport, task_addresses
from ..job.run.reach import Reach
from ..spec.allocation import AllocationError, systems
from ..spec.config import ConfigError, LoadedConfig, keras_backend
from ..spec.plan import Plan, PlanError
from ..spec.transports import traits
from ..strategy import ON_JAX
from ..transport import AgentLink, AgentMessage, Transport
from ..transport.factory import make_transport
from . import check_json, exits, loading, script_dirs, usage
from .check_scripts import LISTEN, PROBE, READ_NONCE, REMOVE, UNLINK, WRITE_NONCE
from .check_verdict import HostReport, judge_probe, judge_versions, render

PROBE_TIMEOUT_S = 30.0  # one probe on one host: a few socket connects and a stat
PEER_TIMEOUT_S = 3.0  # a TCP connect between two hosts of one cluster

class Agents:
    """Send ops to connected agents and collect their answers from one queue."""

    def __init__(self, links: dict[str, AgentLink], events: queue.Queue[AgentMessage]) -> None:
        self.links = links
        self.events = events
        self._ids = 0

    def python(self, host: str) -> str:
        return str(self.links[host].hello["python"])

    def exec_all(self, argv_of: dict[str, list[str]], timeout: float = PROBE_TIMEOUT_S
                 ) -> dict[str, dict[str, Any] | None]:
        """Run one command per host at once; each host's parsed JSON stdout (or None)."""
        waiting: dict[str, str] = {}
        for host, argv in argv_of.items():
            self._ids += 1
            ident = f"check-{self._ids}"
            if self.links[host].send({"op": "exec_check", "id": ident, "argv": argv,
                                      "timeout_s": timeout}):
                waiting[ident] = host
        results: dict[str, dict[str, Any] | None] = {h: None for h in argv_of}
        for message in self._collect(lambda: bool(waiting), timeout + 5):
            body = message.message
            if message.event == "exec_result" and body.get("id") in waiting:
                host = waiting.pop(body["id"])
                results[host] = _last_json(body.get("stdout", "")) or {
                    "error": (body.get("stderr") or "").strip()[-300:] or f"exit {body['code']}"}
            elif message.event == "agent_lost":
                for ident in [i for i, h in waiting.items() if h == message.host]:
                    waiting.pop(ident)
        return results

    def _collect(self, pending, timeout: float):
        deadline = time.monotonic() + timeout
        while pending() and time.monotonic() < deadline:
            try:
                yield self.events.get(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                continue

    def start_listeners(self, ports_of: dict[str, list[int]], timeout: float = PROBE_TIMEOUT_S
                        ) -> dict[str, dict[str, Any] | None]:
        """Start LISTEN on each host; return its report once it prints it."""
        for host, ports in ports_of.items():
            self.links[host].send({"op": "start", "task": "check-listen", "generation": 0,
                                   "argv": [self.python(host), "-c", LISTEN, json.dumps(ports)],
                                   "env": {}, "tf_config": "{}"})
        reports: dict[str, dict[str, Any] | None] = {h: None for h in ports_of}
        pending = set(ports_of)
        for message in self._collect(lambda: bool(pending), timeout):
            body = message.message
            if message.host not in pending or body.get("task") not in (None, "check-listen"):
                continue
            if message.event == "output" and body.get("stream") == "stdout":
                reports[message.host] = _last_json(body.get("text", ""))
                pending.discard(message.host)
            elif message.event in ("start_failed", "exited", "agent_lost"):
                pending.discard(message.host)
        return reports

    def stop_listeners(self, hosts: Sequence[str], timeout: float = 5.0) -> None:
        """Stop the listeners and wait (bounded) until they exit: the collective
        after them binds the same ports."""
        pending = {h for h in hosts if self.links[h].send(
            {"op": "stop", "tasks": ["check-listen"], "grace_s": 1.0})}
        for message in self._collect(lambda: bool(pending), timeout):
            if message.event == "agent_lost" or (
                    message.event == "exited" and message.message.get("task") == "check-listen"):
                pending.discard(message.host)


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


# ---------------------------------------------------------------- the run


def run_check(loaded: LoadedConfig, collective_timeout_s: float | None = (
        check_collective.DEFAULT_TIMEOUT_S), script_dirs: Sequence[tuple[str, str]] = ()
        ) -> tuple[list[HostReport], str, CollectiveReport | None]:
    """Check every host; (one report per host, the checkpoint dir checked, the
    collective's report: None when `collective_timeout_s` is None or no host
    could be reached)."""
    config = loaded.config
    run_dir = (tempfile.mkdtemp(prefix="mgpu-check-") if traits(config.transport).simulated
               else f"check-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    # The launch's own steps: each host's TF_CONFIG address by its rules
    # (tf_address, network_interface, the ssh config's HostName), the job's own
    # plan of generation 0 (`ports.base: auto`: ports free here now, as a launch
    # picks them), the agents, and the plan again with the interfaces' addresses.
    reach, unaddressed = Reach.each(loaded, ["<check>"], run_dir)
    reports = {h.name: HostReport(h) for h in reach.targets}
    for host, reason in unaddressed.items():
        reports[host].problems.append(reason)
    first = reach.plan(0)
    for task in first.tasks:
        if isinstance(config.ports.base, int) and task.port:
            reports[task.host].ports.append(task.port)
    connected, problems = reach.connect_each(make_transport(config, checking=True), first)
    for host, reasons in problems.items():
        reports[host].problems.extend(reasons)
    collective = None
    try:
        for name, hello in connected.hellos().items():
            reports[name].hello = hello
            _judge_tf_ports(reports[name], config.security.tf_ports)
        if connected.links:
            agents = Agents(connected.links, connected.events)
            collective = _probe(agents, reports, connected.plan, collective_timeout_s)
            _probe_script_dirs(agents, reports, script_dirs)
        if traits(config.transport).ssh:
            _time_logins(connected.transport, [reports[name] for name in connected.links])
    finally:
        connected.close()
    backend = keras_backend(config)  # the tasks' KERAS_BACKEND, when the config sets one
    for report in reports.values():
        report.keras_backend = backend or report.keras_backend
    judge_versions(list(reports.values()), config.keras,
                   backend if config.strategy in ON_JAX else None)
    return list(reports.values()), connected.plan.checkpoint_dir, collective


def _judge_tf_ports(report: HostReport, mode: str) -> None:
    """Would the job's TF ports be sealed on this host? Under `cluster`, a host
    that cannot seal them cannot start the run."""
    assert report.hello is not None
    report.tf_ports, sealed = fwreport.reachability(mode, report.hello)
    if mode == "cluster" and not sealed:
        info = report.hello.get("firewall")
        why = str(info.get("why") if isinstance(info, dict) else "the agent is too old to say")
        report.problems.append(f"TF ports cannot be sealed (security.tf_ports: cluster): "
                               f"{why}; fix: {firewall.fix_for(why)}")


def _time_logins(transport: Transport, reports: list[HostReport]) -> None:
    """Time one `true` per host, all hosts at once."""
    def measure(report: HostReport) -> None:
        report.login_s = transport.time_command(report.host.name)

    threads = [threading.Thread(target=measure, args=(r,), daemon=True) for r in reports]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=PROBE_TIMEOUT_S)


def _probe(agents: Agents, reports: dict[str, HostReport], plan: Plan,
           collective_timeout_s: float | None) -> CollectiveReport | None:
    hosts = list(agents.links)
    checkpoint_dir = plan.checkpoint_dir
    # 1. Each host listens on its planned ports; one host writes the nonce.
    listen = {h: reports[h].ports for h in hosts if reports[h].ports}
    names, peers = _peers(plan, _listen(agents, listen, reports))
    writer = hosts[0]
    nonce, nonce_name = secrets.token_hex(16), f".mgpu-check-{secrets.token_hex(4)}"
    wrote = agents.exec_all({writer: [agents.python(writer), "-c", WRITE_NONCE,
                                      json.dumps([checkpoint_dir, nonce_name, nonce])]})
    if not (wrote[writer] or {}).get("ok"):
        error = (wrote[writer] or {}).get("error", "no answer")
        reports[writer].problems.append(f"cannot write to the checkpoint dir: {error}")
        writer_name = None
    else:
        writer_name = writer
    # 2. Every host: reach the others' ports, read the nonce, look for GPUs.
    argv_of = {}
    for host in hosts:
        args = {"peers": [[a, p] for h, a, p in peers if h != host],
                "peer_timeout": PEER_TIMEOUT_S, "checkpoint_dir": checkpoint_dir,
                "nonce": nonce, "nonce_name": nonce_name}
        argv_of[host] = [agents.python(host), "-c", PROBE, json.dumps(args)]
    results = agents.exec_all(argv_of)
    for host in hosts:
        judge_probe(reports[host], results[host], names, checkpoint_dir, writer_name)
    # 3. The listeners free the ports; the collective runs on them.
    agents.stop_listeners(list(listen))
    collective = None
    if collective_timeout_s is not None:
        lacking = _without_framework(plan.strategy, [reports[h] for h in hosts])
        if lacking:
            collective = CollectiveReport(plan.strategy, "", skipped=lacking)
        else:
            collective = check_collective.run_collective(agents.links, agents.events, plan,
                                                         collective_timeout_s)
        for host, problem in collective.problems:
            reports[host].problems.append(problem)
    # 4. Clean up: the nonce, the agents' run directories.
    cleanup = {h: [agents.python(h), "-c", REMOVE, json.dumps(
        [os.path.join(checkpoint_dir, nonce_name) if h == writer else None,
         str(agents.links[h].hello.get("run_dir"))])] for h in hosts}
    agents.exec_all(cleanup, timeout=10)
    return collective


def _probe_script_dirs(agents: Agents, reports: dict[str, HostReport],
                       dirs: Sequence[tuple[str, str]]) -> None:
    """A note on each host that does not see a file written, from the first
    host, into a checkpoint directory the script names: its tasks would not
    resume from the saves made there (docs/fault-tolerance.md)."""
    hosts = list(agents.links)
    if len(hosts) < 2:
        return
    writer = hosts[0]
    for folder, call in dirs:
        nonce, name = secrets.token_hex(16), f".mgpu-check-{secrets.token_hex(4)}"
        wrote = agents.exec_all({writer: [agents.python(writer), "-c", WRITE_NONCE,
                                          json.dumps([folder, name, nonce])]})
        if not (wrote[writer] or {}).get("ok"):
            continue  # not writable from here: the run would say more
        seen = agents.exec_all({h: [agents.python(h), "-c", READ_NONCE,
                                    json.dumps([folder, name, nonce])] for h in hosts[1:]})
        for host in hosts[1:]:
            if not (seen[host] or {}).get("seen"):
                reports[host].notes.append(
                    f"the script's checkpoint directory {folder} ({call}) is not shared: a "
                    f"file written there from {writer} is not visible here, so its tasks "
                    "would not resume from the saves made there; use checkpoint.dir "
                    "(runtime.checkpoint_dir()) or another shared directory")
        agents.exec_all({writer: [agents.python(writer), "-c", UNLINK,
                                  json.dumps(os.path.join(folder, name))]}, timeout=10)


def _listen(agents: Agents, listen: dict[str, list[int]], reports: dict[str, HostReport]
            ) -> dict[str, list[int]]:
    """Start the listeners; each host's ports that listen (busy ones are problems)."""
    listening = agents.start_listeners(listen) if listen else {}
    open_ports: dict[str, list[int]] = {}
    for host, report in listening.items():
        if report is None:
            reports[host].problems.append("could not listen on the planned ports (no report)")
            continue
        reports[host].busy = report.get("busy", {})
        for port, error in reports[host].busy.items():
            reports[host].problems.append(
                f"port {port} is busy ({error}): stop what holds it, or change `ports.base`")
        open_ports[host] = report.get("listening", [])
    return open_ports


def _peers(plan: Plan, open_ports: dict[str, list[int]]
           ) -> tuple[dict[str, str], list[tuple[str, str, int]]]:
    """Peers are reached on exactly the TF_CONFIG addresses the tasks will use:
    ("address:port" -> "host1/worker1", [(host, address, port)])."""
    names: dict[str, str] = {}
    peers: list[tuple[str, str, int]] = []
    addresses = task_addresses(plan)
    for task in plan.tasks:
        address = addresses.get(task.label)
        if address and task.port in open_ports.get(task.host, ()):
            peers.append((task.host, address.rpartition(":")[0].strip("[]"), task.port))
            names[f"{peers[-1][1]}:{task.port}"] = task.label
    return names, peers


def _without_framework(strategy: str, reports: list[HostReport]) -> str:
    """Why the collective cannot even start (its framework is missing on a host), or ""."""
    name, label = ("jax", "jax") if strategy in ON_JAX else (
        "tensorflow", "TensorFlow")
    missing = [r.host.name for r in reports
               if not (r.jax if name == "jax" else r.packages()).get(name)]
    return f"{label} is not installed on {', '.join(missing)} (see problems)" if missing else ""


def main(argv: list[str]) -> int:
    parser = usage.Parser(
        prog="mgpu-launch check",
        description="Check every host of a cluster before a run: SSH, versions, ports, "
        "reachability of every task's TF_CONFIG address, shared checkpoint dir, GPUs, and a "
        "tiny collective across every task. Exit 0 when the run would start.")
    parser.add_argument("cluster", nargs="?", help="the cluster YAML")
    loading.add_allocation_options(parser, lambda system: f"check the nodes of the "
                                   f"{system.title} allocation this runs in (no YAML)")
    parser.add_argument("--local", type=int, metavar="N",
                        help="check N simulated hosts on this machine (no YAML)")
    parser.add_argument("--no-collective", dest="collective", action="store_false",
                        help="skip the tiny collective across every task (faster)")
    parser.add_argument("--script", metavar="PATH",
                        help="the training script: warn when a checkpoint directory it names "
                        "(BackupAndRestore, ModelCheckpoint, CheckpointManager) is not shared")
    parser.add_argument("--collective-timeout", type=float, metavar="S",
                        default=check_collective.DEFAULT_TIMEOUT_S,
                        help="bound on the collective, TensorFlow start-up included "
                        "(default %(default)g s); tasks still missing then are named")
    parser.add_argument("--json", action="store_true",
                        help="print the verdict as one JSON object (hosts, problems, "
                        "collective) instead of the table; same exit codes")
    args = parser.parse_args(argv[1:])
    if sum((args.cluster is not None, bool(args.allocation), args.local is not None)) != 1:
        options = ", ".join(f"--{system.name}" for system in systems())
        parser.error(f"give a cluster YAML, {options} or --local N")
    if args.local is not None and args.local < 1:
        parser.error("--local needs a number of hosts >= 1")
    if args.collective_timeout <= 0:
        parser.error("--collective-timeout needs a number of seconds > 0")
    if args.script and not os.path.isfile(args.script):
        parser.error(f"--script: no such file: {args.script}")
    try:
        loaded = loading.load_cluster(args.cluster, args.local, args.allocation)
    except ConfigError as exc:
        return _cannot_check(f"mgpu-launch: {exc}", args.json)
    except AllocationError as exc:
        return _cannot_check(f"mgpu-launch check: {exc}", args.json)
    try:
        reports, checkpoint_dir, collective = run_check(
            loaded, args.collective_timeout if args.collective else None,
            script_dirs.checkpoint_dirs(args.script) if args.script else ())
    except PlanError as exc:
        return _cannot_check(f"mgpu-launch: cannot plan the job: {exc}", args.json)
    if args.json:
        print(check_json.dumps(check_json.verdict(reports, checkpoint_dir, collective)))
    else:
        print(render(reports, checkpoint_dir, isinstance(loaded.config.ports.base, int),
                     collective))
    return exits.READY if not any(r.problems for r in reports) else exits.NOT_READY


def _cannot_check(message: str, as_json: bool) -> int:
    """The check could not run: the reason on stderr (and as JSON on stdout)."""
    print(message, file=sys.stderr)
    if as_json:
        print(check_json.error(message))
    return exits.NOT_READY
