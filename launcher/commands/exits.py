"""The exit codes of every command, in one table.

They are public (README, docs/operations.md, docs/drill.md): scripts and CI
steps branch on them. Every command returns one of these, under its own name
for it where the command gives the code its own meaning:

- 0 `OK`: the job finished; check `READY`; drill `PASSED` (every fault);
  stop: stopped; profile: every task traced; status, logs, report, export,
  simulate: done.
- 1 `FAILED`: the job failed; drill: a fault failed; stop `NOT_STOPPED`;
  profile `PARTIAL` (some tasks traced); `status --watch`: the job did not
  succeed; simulate: an sshd exited.
- 2 `USAGE`: bad configuration or usage, a host not reached or not fit (the
  run command, drill), no such run directory; check `NOT_READY`.
- 128 + N (`by_signal`): stopped by signal N; 130 (`INTERRUPTED`): Ctrl-C.

Standard library only, imports nothing.
"""

from __future__ import annotations

OK = 0
FAILED = 1
USAGE = 2
INTERRUPTED = 130  # 128 + SIGINT

READY, NOT_READY = OK, USAGE  # check: would a run start?
PASSED = OK  # drill: every fault survived (FAILED: one was not)
NOT_STOPPED = FAILED  # stop: the launcher is still there
PARTIAL = FAILED  # profile: some tasks' traces are missing


def by_signal(signum: int) -> int:
    """A run stopped by signal `signum` exits 128 + it, as a shell reports a killed process."""
    return 128 + signum
