"""The agent's process: its arguments, its start, its threads, its end.

Wires the parts (launcher/agent/__init__.py lists them) through their
constructors, checks that it may start (bundle.unsafe_start), reaps what an
earlier agent of the run left (leftovers, seal), says hello, then runs the
commands on its main thread until stdin closes (commands.read_commands).

- when stdin closes (the launcher died, or the SSH connection dropped), or on
  SIGTERM, every task is stopped (SIGTERM, then SIGKILL after --eof-grace)
  and the agent exits: no orphan outlives its launcher;
- with a lease (lease.py), the same when the launcher falls silent;
- a heartbeat every HEARTBEAT_EVERY_S: each task's CPU, RSS and status, and
  every few beats its host signals (health.py, for the straggler radar).

Standard library only; of the launcher, imports the package's __version__,
firewall, hostruns, netif and the agent's parts.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from launcher import __version__, firewall
from launcher.agent import bundle
from launcher.agent.commands import Commands, Lines, read_commands
from launcher.agent.files import makedirs_private
from launcher.agent.health import Health
from launcher.agent.hostfacts import installed_versions, load_psutil
from launcher.agent.lease import Lease
from launcher.agent.leftovers import PidRecords
from launcher.agent.memcopy import MemoryCopies, sweep
from launcher.agent.peercopy import PeerCopies
from launcher.agent.profiles import Profiles
from launcher.agent.protocol import Emitter
from launcher.agent.seal import Seal
from launcher.agent.spawn import Spawner
from launcher.agent.stacks import Stacks
from launcher.agent.standbys import Standbys
from launcher.agent.tasks import Tasks
from launcher.hostruns import (
    KEEP_RUNS,
    hold_lock,
    prune_now_and_then,
    remove_unused,
    runs_root,
)
from launcher.netif import ipv4_interfaces

HEARTBEAT_EVERY_S = 1.0
USAGE = ("usage: python -m launcher.agent --host NAME --run-dir DIR [--eof-grace SECONDS] "
         "[--lease SECONDS]")


class Agent:
    """The parts of one agent, wired; what happens at its end."""

    def __init__(self, host: str, run_dir: str, emit: Emitter, eof_grace_s: float) -> None:
        self.host = host
        self.run_dir = os.path.abspath(os.path.expanduser(run_dir))
        self.emit = emit
        self.eof_grace_s = eof_grace_s
        bundle.mark_used()
        self.lines = Lines()  # to the command thread: commands, and work to run there
        self.spawner = Spawner()
        self.records = PidRecords(self.run_dir, emit)
        self.seal = Seal(self.run_dir, self.spawner, emit)
        self.standbys = Standbys(self.spawner, self.records, emit, self.lines.put)
        self.tasks = Tasks(self.run_dir, self.spawner, self.standbys, self.seal,
                           self.records, emit)
        self.profiles = Profiles(self.run_dir, emit)
        self.tasks.on_profile = self.profiles.answered
        self.memory = MemoryCopies(self.run_dir, host, lambda text: emit("log", text=text),
                                   notice=lambda text: emit("log", text=text, notice=True))
        self.memory.report = lambda task, generation, data: emit(
            "progress", task=task, generation=generation, data=data)  # a copy's cost
        self.memory.before_low_thread = emit.start_handoff
        self.tasks.memory = self.memory
        self.memory.peers = PeerCopies(self.memory, host, emit)  # a copy in another host's
        self.commands = Commands(self.tasks, Stacks(emit), emit, self.profiles)
        self.commands.peers = self.memory.peers
        self.lease = Lease(emit)
        self.health = Health()  # host signals for the straggler radar, every few beats

    def heartbeat_forever(self) -> None:
        touched = time.monotonic()
        while True:
            if time.monotonic() - touched > bundle.BUNDLE_TOUCH_EVERY_S:
                touched = time.monotonic()
                bundle.mark_used()  # a job can run for longer than the prune age
            usage = self.tasks.usage()
            if self.health.due(time.monotonic()):
                for name, figures in self.health.sample(self.tasks.pids()).items():
                    usage.setdefault(name, {})["health"] = figures
            self.emit("heartbeat", tasks=usage)
            time.sleep(HEARTBEAT_EVERY_S)

    def shutdown(self) -> None:
        """stdin closed (or the lease ran out): stop every task, wait for them."""
        with self.spawner.lock:
            self.spawner.closing = True
        self.standbys.drop_all()
        self.tasks.stop(None, self.eof_grace_s)
        self.tasks.wait_all(self.eof_grace_s + 2.0)
        # The tasks are gone: so are their ports' rules (removed as the agent
        # exits; the launcher waits for the exit, not for the kernel).
        self.seal.unseal(wait=False)
        self.spawner.reap_all()  # tasks' and standbys': their threads may not get to it
        self.memory.close()  # the last copies, then the job's memory folder


def parse_args(argv: list[str]) -> tuple[str, str, float, float]:
    """(host, run_dir, eof_grace_s, lease_s). Only the launcher starts the agent;
    argparse would cost ~8 ms of every agent start (it loads re, gettext and shutil)."""
    options = {"--host": None, "--run-dir": None, "--eof-grace": "2.0", "--lease": "0"}
    rest = list(argv)
    while rest:
        flag = rest.pop(0)
        if flag not in options or not rest:
            raise SystemExit(f"{USAGE}\nbad argument: {flag!r}")
        options[flag] = rest.pop(0)
    if options["--host"] is None or options["--run-dir"] is None:
        raise SystemExit(f"{USAGE}\n--host and --run-dir are required")
    seconds = []
    for flag in ("--eof-grace", "--lease"):
        try:
            value = float(options[flag])
            if not 0 <= value < float("inf"):
                raise ValueError(value)
        except ValueError:
            raise SystemExit(f"{USAGE}\n{flag} wants seconds, got {options[flag]!r}") from None
        seconds.append(value)
    return options["--host"], options["--run-dir"], seconds[0], seconds[1]


def main(argv: list[str] | None = None) -> int:
    host, run_dir, eof_grace_s, lease_s = parse_args(sys.argv[1:] if argv is None else argv)
    # Ctrl-C in the launcher's terminal is the launcher's to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    emit = Emitter(sys.stdout.buffer)
    agent = Agent(host, run_dir, emit, eof_grace_s)
    makedirs_private(agent.run_dir)
    refusal = bundle.unsafe_start(bundle.CODE_DIR, agent.run_dir)
    if refusal:  # before any task: the launcher shows this stderr line with the exit code
        print(f"mgpu-launch agent: {refusal}", file=sys.stderr, flush=True)
        return bundle.EXIT_UNSAFE
    lock_fd = _hello(agent, lease_s)
    agent.lease.heard()
    threading.Thread(target=agent.heartbeat_forever, daemon=True).start()
    threading.Thread(target=_prune_runs, args=(emit, agent.run_dir), daemon=True).start()
    # The ports the tasks open beyond TF_CONFIG's, sealed as they open (agent/seal.py).
    threading.Thread(target=agent.seal.watch, args=(agent.tasks.tree_pids,), daemon=True).start()
    if lease_s:
        threading.Thread(target=agent.lease.watch, args=(lease_s, agent.shutdown),
                         daemon=True).start()
    # SIGTERM to the agent stops its tasks like a closed stdin does.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        # This thread is the command thread for the agent's whole life.
        read_commands(agent.commands, agent.lines, sys.stdin.buffer, agent.lease.heard)
    finally:
        agent.shutdown()
        emit.drain_handoff(2.0)  # the copies' last events, before the last word
        emit("bye")
        if lock_fd is not None:
            if not agent.tasks.asked:  # e.g. a launch refused after its agents started
                remove_unused(agent.run_dir, lock_fd)
            os.close(lock_fd)
    return 0


def _hello(agent: Agent, lease_s: float) -> int | None:
    """Reap an earlier agent's leftovers, say hello, say what was reaped;
    the run directory's lock (held for our life: never pruned meanwhile)."""
    emit = agent.emit
    reaped = agent.records.reap_leftovers()  # before any task of ours can start
    unsealed = firewall.reap(agent.run_dir)  # a killed agent's rules
    swept = firewall.sweep()  # those of killed agents of other runs that nobody reaped
    lock_fd = hold_lock(agent.run_dir)
    packages = installed_versions()
    emit("hello", host=agent.host, pid=os.getpid(), version=__version__,
         python=sys.executable, python_version=sys.version.split()[0],
         hostname=os.uname().nodename, run_dir=agent.run_dir,
         psutil=packages.pop("psutil") is not None, packages=packages,
         lease_s=lease_s or None, reaped=reaped,
         firewall={"backend": agent.seal.backend, "why": agent.seal.why,
                   "uid": os.getuid()},
         interfaces=ipv4_interfaces(load_psutil))  # name -> IPv4s: TF addresses by interface
    for item in reaped:  # after the hello: the SSH transport skips lines before it
        emit("log", text=f"killed leftover task {item['task']} (generation "
             f"{item['generation']}, pids {item['pids']}) of an earlier agent "
             f"(pid {item['agent_pid']}) of this run directory")
    if unsealed:
        emit("log", text=f"removed the firewall rules ({unsealed}) of an earlier agent "
             "of this run directory")
    for item in swept:
        emit("log", text=f"removed the firewall rules ({item}, gone) of another run")
    for name in sweep():  # after a crash: the memory tier's copies of dead agents
        emit("log", text=f"removed the memory checkpoints /dev/shm/{name} of an agent "
             "that died")
    return lock_fd


def _prune_runs(emit: Emitter, run_dir: str) -> None:
    """Old run folders of this host's `~/.mgpu-launch/runs` (launcher/hostruns.py),
    unless pruned lately."""
    root = runs_root(run_dir)
    if root is None:
        return
    try:
        keep = int(os.environ.get("MGPU_KEEP_RUNS", KEEP_RUNS))
    except ValueError:
        keep = KEEP_RUNS
    removed = prune_now_and_then(root, current=os.path.dirname(os.path.abspath(run_dir)),
                                 keep=keep)
    if removed:
        emit("log", text=f"removed {len(removed)} old run folder(s) from {root} (keeping the "
             f"{keep} most recent and any in use): {', '.join(sorted(removed))}")


def _exit_on_signal(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)
