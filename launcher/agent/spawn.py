"""Every process the agent starts (tasks and standbys), and its process tree.

Owns the agent's one lock and its `closing` flag (once set, nothing new
starts), the tree of each process started (launcher.proctree: a cgroup of its
own where the agent may create one, else the tree recorded from /proc while
it lives), and the child's set-up: its own session, and SIGKILL when the
agent dies abruptly (PR_SET_PDEATHSIG).

PR_SET_PDEATHSIG fires when the *thread* that started the child ends, not
the process: every `popen` must run on the agent's one long-lived command
thread (launcher/agent/commands.py), never on a short-lived helper thread.

Standard library only; of the launcher, imports proctree alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading

from launcher.proctree import TaskTree, Tracker, cgroup_home

PR_SET_PDEATHSIG = 1
TOKEN_VAR = "MGPU_TASK_TOKEN"  # in each task's environment: finds its tree after a crash


def _pdeathsig_preexec():
    """In the child: own session, and SIGKILL if the agent itself dies abruptly."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not Linux
        libc = None

    def preexec() -> None:
        os.setsid()
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return preexec


class Spawner:
    """Starts processes in trees of their own; holds the agent's lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # the agent's tables: tasks, standbys, firewall state
        self.closing = False  # shutting down: no new task or standby may start
        self.preexec = _pdeathsig_preexec()
        self.tracker = Tracker()
        self.trees: list[TaskTree] = []  # every tree made: shutdown drops their cgroups
        self._cgroup_home: str | None | bool = False  # False: not looked for yet

    def new_tree(self, token: str) -> TaskTree:
        """A process tree for a task or standby with this token (launcher.proctree)."""
        if self._cgroup_home is False:
            self._cgroup_home = cgroup_home()
        tree = TaskTree(f"{TOKEN_VAR}={token}".encode(), self._cgroup_home or None)
        self.trees.append(tree)
        return tree

    def popen(self, argv: list[str], cwd: str | None, env: dict[str, str], stdin: int,
              pass_fd: int) -> tuple[subprocess.Popen, TaskTree]:
        """Start `argv` (stdout and stderr piped, `pass_fd` inherited) in a new
        tree for the token in `env`; on the command thread (see above)."""
        tree = self.new_tree(env[TOKEN_VAR])
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, pass_fds=(pass_fd,),
                preexec_fn=tree.preexec(self.preexec))
        except BaseException:
            tree.spawn_failed()
            raise
        tree.started(proc.pid)
        self.tracker.add(tree)
        return proc, tree

    def reaped(self, tree: TaskTree) -> None:
        """Its process is gone: kill what is left of its tree, stop tracking it."""
        tree.reap()
        self.tracker.remove(tree)

    def reap_all(self) -> None:
        """At shutdown: every tree's leftovers (their threads may not get to it)."""
        for tree in list(self.trees):
            tree.reap()
