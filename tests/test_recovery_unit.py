"""Unit tests of the pure parts of fault handling: restart policy and exit/output reading."""

from __future__ import annotations

import signal

import pytest

from launcher.job.detect.blame import innermost_frame
from launcher.job.policy.recovery import (
    MAX_FREE_RESTARTS_IN_A_ROW,
    Budget,
    HostInfo,
    NotEnoughHosts,
    backoff_delay,
    choose_hosts,
    decide_restart,
    restart_counts,
)
from launcher.job.record.classify import OutputWatcher, classify_exit, exit_kind, exit_words
from launcher.job.record.failkinds import say
from launcher.job.run.protocol import check_message

HOSTS = [HostInfo("a", 1, False), HostInfo("b", 1, False), HostInfo("c", 2, False),
         HostInfo("s1", 1, True), HostInfo("s2", 1, True)]

# Lines as TensorFlow 2.21 prints them (measured on this machine).
UNHEALTHY = ("E0000 00:00:1795363543.292824   11641 base_collective_executor.cc:252] "
             "BaseCollectiveExecutor::StartAbort UNAVAILABLE: Error reported from "
             "/job:worker/task:1: The following tasks are unhealthy (stopped sending "
             "heartbeats):")
RESET = ("E0000 00:00:1795363543.292824   11641 base_collective_executor.cc:252] "
         "BaseCollectiveExecutor::StartAbort UNAVAILABLE: recvmsg:Connection reset by peer")
DEADLINE = ("E0000 00:00:1795365039.425205    2428 base_collective_executor.cc:252] "
            "BaseCollectiveExecutor::StartAbort DEADLINE_EXCEEDED: Deadline Exceeded")
CUINIT = ("E0000 00:00:1795363540.1 11641 cuda_executor.cc:1309] failed call to cuInit: "
          "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)")


# ------------------------------------------------------------------ choose_hosts


def test_nothing_lost_keeps_the_hosts():
    choice = choose_hosts(HOSTS, ["a", "b", "c"], set(), "wait", 1)
    assert choice.active == ("a", "b", "c") and choice.message == ""


def test_a_spare_replaces_a_lost_host_whatever_the_policy():
    for policy in ("wait", "shrink"):
        choice = choose_hosts(HOSTS, ["a", "b", "c"], {"b"}, policy, 4)
        assert choice.active == ("a", "c", "s1")
        assert choice.message == "s1 replaces b"


def test_spares_in_use_or_lost_are_not_taken_again():
    choice = choose_hosts(HOSTS, ["a", "s1", "c"], {"a", "s2"}, "shrink", 1)
    assert choice.active == ("c", "s1")
    assert "continuing without a" in choice.message


def test_wait_keeps_the_lost_host_and_says_so():
    choice = choose_hosts(HOSTS[:3], ["a", "b", "c"], {"b"}, "wait", 1)
    assert choice.active == ("a", "b", "c")
    assert choice.message == "waiting for b to come back"


def test_shrink_drops_the_lost_host_while_enough_workers_remain():
    choice = choose_hosts(HOSTS[:3], ["a", "b", "c"], {"c"}, "shrink", 2)
    assert choice.active == ("a", "b")
    assert choice.message == "continuing without c (2 worker(s) left)"


def test_shrink_below_min_workers_is_an_error_that_says_why():
    with pytest.raises(NotEnoughHosts, match="1 worker\\(s\\) left, fewer than "
                       "restart.min_workers=2"):
        choose_hosts(HOSTS[:3], ["a", "c"], {"c"}, "shrink", 2)


# ------------------------------------------------------------------- the budget


def test_restart_counts_only_without_progress_or_preemption():
    assert restart_counts(advanced=False, preempted=False)
    assert not restart_counts(advanced=True, preempted=False)
    assert not restart_counts(advanced=False, preempted=True)


def test_budget_spends_only_counted_restarts():
    budget = Budget(2)
    assert not budget.exhausted
    budget = budget.after(counts=False, advanced=True).after(counts=True)
    assert budget.spent == 1 and not budget.exhausted
    assert budget.after(counts=True).exhausted


def test_a_crash_loop_stops_after_max_restarts_with_a_message():
    budget, restarts = Budget(3), 0
    while True:
        decision = decide_restart(budget, advanced=False, preempted=False)
        if not decision.restart:
            break
        budget, restarts = decision.budget, restarts + 1
    assert restarts == 3
    assert "crash loop" in decision.message and "max_restarts=3" in decision.message


def test_progress_makes_a_restart_free():
    budget = Budget(1).after(counts=True)
    decision = decide_restart(budget, advanced=True, preempted=False)
    assert decision.restart and not decision.counts and decision.budget.spent == 1


def test_preemptions_are_free_but_not_endless():
    budget, restarts = Budget(1), 0
    while True:
        decision = decide_restart(budget, advanced=False, preempted=True)
        if not decision.restart:
            break
        assert not decision.counts
        budget, restarts = decision.budget, restarts + 1
    assert restarts == MAX_FREE_RESTARTS_IN_A_ROW
    assert "exit 42" in decision.message
    # Progress in between resets the streak.
    assert Budget(1, free_in_a_row=5).after(counts=False, advanced=True).free_in_a_row == 0


def test_max_total_restarts_caps_even_free_restarts():
    budget = Budget(1, max_total=2)
    for _ in range(2):
        decision = decide_restart(budget, advanced=True, preempted=False)
        assert decision.restart
        budget = decision.budget
    decision = decide_restart(budget, advanced=True, preempted=False)
    assert not decision.restart and decision.stopped_by == "max_total_restarts"
    assert "max_total_restarts=2" in decision.message


def test_a_repeated_failure_without_progress_is_deterministic():
    decision = decide_restart(Budget(5), advanced=False, preempted=False,
                              repeated="KeyError at a.py:3 in f")
    assert not decision.restart and decision.stopped_by == "deterministic"
    # With progress in between it is a new failure, however alike.
    assert decide_restart(Budget(5), advanced=True, preempted=False, repeated="x").restart


def test_backoff_doubles_to_its_cap():
    assert [backoff_delay(i, 1.0, 10.0) for i in range(6)] == [1, 2, 4, 8, 10, 10]
    assert backoff_delay(3, 0.0, 10.0) == 0.0


def test_innermost_frame_reads_the_last_frame_of_a_traceback():
    error = {"type": "ValueError", "traceback":
             '  File "/a/train.py", line 9, in <module>\n    main()\n'
             '  File "/a/lib.py", line 4, in load\n    raise ValueError\n'}
    assert innermost_frame(error) == ("ValueError", "/a/lib.py", "4", "load")
    assert innermost_frame({"type": "X", "traceback": ""}) is None
    assert innermost_frame(None) is None


def test_max_restarts_zero_never_restarts():
    for advanced, preempted in ((False, False), (True, False), (False, True)):
        decision = decide_restart(Budget(0), advanced, preempted)
        assert not decision.restart and decision.message == ""


# ----------------------------------------------------------------- classify_exit


@pytest.mark.parametrize(("code", "signum", "error", "lines", "expected"), [
    (None, signal.SIGKILL, None, [], "killed (SIGKILL"),
    (137, None, None, [], "out-of-memory killer"),
    (None, signal.SIGSEGV, None, [], "killed by signal 11 (SIGSEGV)"),
    (42, None, None, [], "preempted: saved a checkpoint"),
    (1, None, {"type": "DeadlineExceededError", "message": "x"}, [], "collective timed out"),
    (1, None, {"type": "UnavailableError", "message": "x"}, [], "gRPC UNAVAILABLE"),
    (1, None, None, ["tensorflow...UnavailableError: Collective ops is aborted"],
     "gRPC UNAVAILABLE"),
    (1, None, {"type": "ValueError", "message": "bad shape"}, [],
     "Python exception ValueError: bad shape"),
    (3, None, None, ["something"], "exited with code 3"),
])
def test_classify_exit(code, signum, error, lines, expected):
    assert expected in classify_exit(code, signum, error, lines)


DRILL_TERM = {"signal": signal.SIGTERM, "t": 100.0, "by": "the drill"}
DRILL_KILL = {"signal": signal.SIGKILL, "t": 103.2, "by": "the drill"}


@pytest.mark.parametrize(("code", "signum", "signalled", "expected"), [
    (None, signal.SIGKILL, [DRILL_TERM, DRILL_KILL],
     "preempted (SIGTERM from the drill, then SIGKILL after 3.2 s)"),
    (None, signal.SIGTERM, [DRILL_TERM], "preempted (SIGTERM from the drill)"),
    (None, signal.SIGKILL, [DRILL_KILL], "killed (SIGKILL from the drill)"),
    (137, None, [DRILL_KILL], "killed (SIGKILL from the drill)"),
    # a SIGKILL nobody asked its agent for: the kernel's OOM killer, or a user
    (None, signal.SIGKILL, [DRILL_TERM], "killed (SIGKILL: by a user, or the kernel's"),
    (42, None, [DRILL_TERM], "preempted: saved a checkpoint and asked to be restarted"),
])
def test_a_signal_the_launcher_sent_is_said_as_whose(code, signum, signalled, expected):
    """The drill's kill and preemption (issue 53 item 5), from the exit report's
    `signalled` as the launcher's protocol check leaves it."""
    exited = check_message({"ev": "exited", "task": "worker1", "generation": 0, "code": code,
                            "signal": signum, "signalled": signalled, "t": 104.0})
    how, facts = exit_words(code, signum, None, [], exited["signalled"])
    assert say(exit_kind(code, signum), how, facts) == expected or \
        say(exit_kind(code, signum), how, facts).startswith(expected)


def test_a_python_error_is_not_mistaken_for_a_peer_failure():
    # The error file wins over lines that mention UNAVAILABLE in passing.
    reason = classify_exit(1, None, {"type": "KeyError", "message": "'x'"},
                           ["retrying after UNAVAILABLE"])
    assert reason.startswith("Python exception KeyError")


# ----------------------------------------------------------------- OutputWatcher


def test_watcher_names_the_culprit_on_the_line_after_the_abort():
    watcher = OutputWatcher()
    alarm = watcher.feed(UNHEALTHY)
    assert alarm is not None and alarm.kind == "peer_unhealthy" and alarm.code == "UNAVAILABLE"
    assert watcher.culprit is None
    assert watcher.feed("/job:worker/replica:0/task:1") is None  # no second alarm
    assert watcher.culprit == ("worker", 1)


def test_watcher_reads_a_culprit_on_the_same_line():
    watcher = OutputWatcher()
    watcher.feed(UNHEALTHY + " /job:chief/replica:0/task:0")
    assert watcher.culprit == ("chief", 0)


def test_watcher_after_a_kill_9_alarms_without_a_culprit():
    watcher = OutputWatcher()
    alarm = watcher.feed(RESET)
    assert alarm is not None and alarm.kind == "collective_abort"
    assert alarm.code == "UNAVAILABLE" and "Connection reset" in alarm.line
    watcher.feed("The error could be from a previous operation. Restart your program.")
    assert watcher.culprit is None


def test_watcher_reports_a_deadline_once():
    watcher = OutputWatcher()
    assert watcher.feed(DEADLINE).code == "DEADLINE_EXCEEDED"
    assert watcher.feed(DEADLINE) is None and watcher.feed(RESET) is None


def test_watcher_ignores_harmless_tensorflow_errors():
    watcher = OutputWatcher()
    for line in (CUINIT, "Epoch 1/6", "WARNING: All log messages before absl::InitializeLog()",
                 "job:worker/replica:0/task:1 is mentioned in passing"):
        assert watcher.feed(line) is None
    assert watcher.alarm is None and watcher.culprit is None


# As JAX 0.10.2's coordination service prints it (measured here, process 1 stopped).
JAX_UNHEALTHY = ("E1123 13:18:18.777113   10631 coordination_service.cc:1549] [1181] Use error "
                 "polling to propagate the following error to all tasks: UNAVAILABLE: The "
                 "following tasks are unhealthy (stopped sending heartbeats):")


def test_watcher_of_a_jax_task_alarms_on_unhealthy_and_reads_the_process_id():
    watcher = OutputWatcher(jax=True)
    alarm = watcher.feed(JAX_UNHEALTHY)
    assert alarm is not None and alarm.kind == "peer_unhealthy"
    assert watcher.feed("1") is None
    assert watcher.culprit == ("process", 1)
    # A TensorFlow task's watcher neither alarms on that line nor reads bare numbers.
    plain = OutputWatcher()
    assert plain.feed(JAX_UNHEALTHY) is None and plain.feed("1") is None
    assert plain.culprit is None


def test_a_silently_lost_hosts_tasks_are_over_after_its_lease_and_grace():
    """job/policy/fence.py: the next generation waits out a cut host's lease."""
    from launcher.job.policy.fence import tasks_over_by

    # Last heard at 100, lost (no heartbeat for 10 s) at 110.1: its agent may
    # have heard us until 102, its lease out by 112.2, SIGKILL at 114.2.
    assert tasks_over_by(lost_at=110.1, last_seen=100.0, lease_s=10.0, silent=True) \
        == pytest.approx(114.7)
    # A dropped connection: the agent saw the EOF (or died): its grace only.
    assert tasks_over_by(lost_at=110.1, last_seen=100.0, lease_s=10.0, silent=False) \
        == pytest.approx(112.6)
