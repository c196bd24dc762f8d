"""The host's evidence of why a task ended (launcher/agent/evidence.py), read
from the files a kernel keeps: cgroup v2's memory.events, v1's
memory.oom_control, /proc/vmstat. Files faked here; the real kernel's in
tests/test_oom_e2e.py."""

from __future__ import annotations

from launcher.agent import evidence


def test_oom_kills_in_a_v2_cgroup_and_on_the_host(monkeypatch):
    files = {"/proc/7/cgroup": "0::/job.slice/task\n",
             "/sys/fs/cgroup/job.slice/task/memory.events": "low 0\nmax 3\noom 1\noom_kill 2\n",
             "/sys/fs/cgroup/job.slice/task/memory.max": "536870912\n",
             evidence.VMSTAT: "pgfault 9\noom_kill 5\n"}
    monkeypatch.setattr(evidence, "_read", lambda path, limit=65536: files.get(path, ""))
    notes = evidence.at_start(7)
    assert evidence.at_exit(notes) == {}  # nothing happened while it ran
    files["/sys/fs/cgroup/job.slice/task/memory.events"] = "oom 2\noom_kill 3\n"
    files[evidence.VMSTAT] = "oom_kill 6\n"
    assert evidence.at_exit(notes) == {"oom": {"in_cgroup": 1, "on_host": 1,
                                               "limit_bytes": 536870912}}


def test_a_v1_memory_controller_and_unreadable_files_say_nothing_wrong(monkeypatch):
    files = {"/proc/8/cgroup": "12:pids:/a\n4:memory:/slurm/job_5\n0::/a\n",
             "/sys/fs/cgroup/memory/slurm/job_5/memory.oom_control":
                 "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"}
    monkeypatch.setattr(evidence, "_read", lambda path, limit=65536: files.get(path, ""))
    notes = evidence.at_start(8)
    assert notes["oom"]["cgroup"] == "/sys/fs/cgroup/memory/slurm/job_5"
    files["/sys/fs/cgroup/memory/slurm/job_5/memory.oom_control"] = "oom_kill 1\n"
    assert evidence.at_exit(notes) == {"oom": {"in_cgroup": 1}}  # no limit file: no limit said
    assert evidence.at_exit(evidence.at_start(9)) == {}  # a process gone: nothing


def test_only_the_tasks_own_cgroup_makes_a_sigkill_an_oom():
    """The host's counter counts any process's kill: a clue in the words, not a
    verdict; a bad limit from an agent never raises."""
    from launcher.job.record.classify import exit_of
    from launcher.job.record.failkinds import Kind, say

    killed = {"code": None, "signal": 9, "tail": [], "error": None}
    kind, how, facts = exit_of({**killed, "evidence": {"oom": {"on_host": 2}}})
    assert kind == Kind.SIGNAL and "killed 2 process(es) on its host" in say(kind, how, facts)
    for limit in ("max", 2**80, -1):
        kind, how, facts = exit_of({**killed, "evidence": {"oom": {"in_cgroup": 1,
                                                                   "limit_bytes": limit}}})
        assert kind == Kind.OOM and facts == {"limit": "unknown"}
    assert exit_of({**killed, "evidence": {}})[:2] == (Kind.SIGNAL, "sigkill")
    assert exit_of({"code": 1, "signal": None, "evidence": {"oom": {"in_cgroup": 1}}})[0] \
        == Kind.EXIT  # an exit, not a SIGKILL: not the OOM killer's
