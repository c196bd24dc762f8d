"""A task whose TensorFlow server could not bind its port (something took it
between the launcher's plan and TF's bind) fails as `port_taken`, not as the
script's exception: the first in a job is free of max_restarts, twice in a row
stops the job (job/record/failkinds.py, classify.exit_of, recovery.decide_restart)."""

from __future__ import annotations

import json

from launcher.job.detect.blame import repeated_failure
from launcher.job.policy.recovery import Budget, decide_restart
from launcher.job.policy.restarts import JobSoFar, count_restart
from launcher.job.record import eventlines
from launcher.job.record import events as ev
from launcher.job.record.classify import exit_of
from launcher.job.record.failkinds import Kind, free_first, say
from launcher.job.record.states import Failure
from launcher.spec.config import RestartPolicy
from launcher.views import narrate

# As TensorFlow 2.x printed it, binding a port another socket listened on
# (tf.distribute.MultiWorkerMirroredStrategy() under TF_CONFIG), and the
# bootstrap's error report of it.
TAIL = (
    "E0000 00:00:1796602522.846976    4881 add_port.cc:83] Failed to add port to server: "
    "No address added out of total 1 resolved for '0.0.0.0:58945'",
    "E0000 00:00:1796602522.849009    4881 grpc_server_lib.cc:618] UNKNOWN: Could not start "
    "gRPC server",
    "E0000 00:00:1796602522.849565    4881 context_distributed_manager.cc:1061] Could not "
    "start gRPC server",
)
ERROR = {"type": "UnknownError", "message": "Could not start gRPC server",
         "traceback": '  File "/usr/lib/python3/site-packages/tensorflow/python/eager/'
                      'context.py", line 745, in ensure_initialized\n'
                      "    pywrap_tfe.TFE_EnableCollectiveOps(context_handle, server_def_str)\n"}


def _exit(tail=TAIL, error=ERROR, code=1, signal=None) -> dict:
    return {"code": code, "signal": signal, "error": error, "tail": list(tail)}


def test_the_add_port_line_names_the_port_taken():
    kind, how, facts = exit_of(_exit(), "host1", 20001, chosen=True)
    assert (kind, facts) == (Kind.PORT_TAKEN, {"port": 58945, "host": "host1"})
    assert say(kind, how, facts) == (
        "could not start: port 58945 on host1 was taken before its task bound it (something "
        "else listens there); the restart takes fresh ports")


def test_without_the_add_port_line_the_plans_port_is_said():
    kind, how, facts = exit_of(_exit(tail=("Traceback (most recent call last):",)),
                               "host1", 20001)
    assert kind == Kind.PORT_TAKEN and facts["port"] == 20001


def test_fixed_ports_say_which_to_free_and_promise_no_fresh_ones():
    kind, how, facts = exit_of(_exit(), "gpu7", 20001, chosen=False)
    words = say(kind, how, facts)
    assert "port 58945 on gpu7 was taken" in words
    # (`ports.base: auto` is refused for remote SSH hosts: it says nothing about their ports)
    assert "free port 58945 on gpu7, or set another `ports.base`" in words
    assert "fresh" not in words


def test_other_exits_are_not_a_port_taken():
    assert exit_of(_exit(error={"type": "ValueError", "message": "bad"}, tail=("x",)),
                   "h", 1)[0] == Kind.EXIT
    assert exit_of(_exit(signal=9, code=None), "h", 1)[0] == Kind.SIGNAL
    assert exit_of(_exit(code=0), "h", 1)[0] == Kind.EXIT  # a clean end is no failure


def _failure(generation: int, kind: str = Kind.PORT_TAKEN, port: int = 58945) -> Failure:
    return Failure(task="host0/worker0", host="host0", generation=generation, t=0.0, kind=kind,
                   reason=f"could not start: port {port} on host0 was taken", error=ERROR)


def test_the_first_port_taken_is_free_and_the_second_in_a_row_stops_the_job():
    first = [_failure(0)]
    assert free_first([f.kind for f in first])
    decision = decide_restart(Budget(max_restarts=1, spent=1), advanced=False, preempted=False,
                              repeated=repeated_failure(first), free=True)
    assert decision.restart and not decision.counts  # even with the budget spent

    again = [*first, _failure(1, port=12952)]  # fresh ports, taken again
    assert not free_first([f.kind for f in again])
    decision = decide_restart(Budget(max_restarts=3), advanced=False, preempted=False,
                              repeated=repeated_failure(again), free=False)
    assert not decision.restart and decision.stopped_by == "deterministic"
    assert "port 12952 on host0 was taken" in decision.message


def test_a_port_taken_after_another_failure_is_still_its_kinds_first():
    kinds = [Kind.EXIT, Kind.NONFINITE, Kind.PORT_TAKEN]
    assert free_first(kinds) and not free_first([*kinds, Kind.EXIT])
    assert not free_first([Kind.PORT_TAKEN, Kind.EXIT, Kind.PORT_TAKEN])


def test_the_free_restarts_line_says_why_by_the_kind():
    policy = RestartPolicy(max_restarts=1)
    job = JobSoFar(budget=Budget(max_restarts=1, total=1), active=["host0"])  # after decide_restart
    restart = count_restart(job, policy, counts=False, advanced=False, trained_s=1.0,
                            preempted=False, free=Kind.PORT_TAKEN)
    back = eventlines.from_record(json.loads(json.dumps(ev.to_record(restart, 1.0))))
    assert back.free == "port_taken"  # as events.jsonl keeps it
    said = narrate.line(back)
    assert said is not None and ("restart 1: the first port taken (not the script's bug), not "
                                 "counted against the 1 allowed without progress") in said[1]
    nan = count_restart(job, policy, counts=False, advanced=False, trained_s=1.0,
                        preempted=False, free=Kind.NONFINITE)
    assert "the first loss or weights gone non-finite, not counted" in narrate.line(nan)[1]


def test_the_plan_knows_whether_a_restart_takes_fresh_ports():
    """`chosen` words (fresh ports) where the launcher picks them: `ports.base:
    auto`, or simulated hosts (job/run/reach.py trades their busy fixed ports);
    `fixed` words on SSH hosts' fixed ports, which a restart binds again."""
    from tests.test_plan import TWO_HOSTS, plan_of

    assert not plan_of(TWO_HOSTS).ports_chosen  # ssh, ports.base 20000 by default
    loopback = "transport: ssh\nports: {base: auto}\nhosts:\n  - {address: 127.0.0.1}\n"
    assert plan_of(loopback, ports=[21000]).ports_chosen  # (refused for remote SSH hosts)
    local = "transport: local\nports: {base: 21000}\nhosts:\n  - {address: 127.0.0.1}\n"
    assert plan_of(local).ports_chosen
