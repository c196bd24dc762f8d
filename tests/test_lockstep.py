"""The out-of-step judgment (launcher/job/detect/lockstep.py) on positions recorded
from real two-worker runs of the scripts in tests/scripts/stuck_*.py (the
progress fields their tasks reported, as events.jsonl keeps them)."""

from __future__ import annotations

from launcher.job.detect.lockstep import (
    QUIET_S,
    Peer,
    Position,
    Positions,
    foresee,
    judge,
    mismatched,
    read,
)


def at(**data) -> Position:
    return read(data, Position())


def peers(*pairs, finished: tuple[str, ...] = ()) -> list[Peer]:
    return [Peer(name, position, finished=name in finished) for name, position in pairs]


# --------------------------------------------------------- recorded positions

def test_uneven_input_names_the_shorter_worker_and_the_fix():
    # stuck_uneven.py, at worker1's collective abort: 37 batches against 40
    # (the counters as last reported, two seconds before).
    worker0 = at(at="train", at_len=40, at_len_by="input", at_step=0, at_epoch=0, at_from=0,
                 step=25)
    worker1 = at(at="train", at_len=37, at_len_by="input", at_step=0, at_epoch=0, at_from=0,
                 step=24)
    found = judge(peers(("worker0", worker0), ("worker1", worker1)))
    assert found is not None and not found.strong  # a quiet spell before step 37: no proof
    assert (found.task, found.cause) == ("worker1", "uneven_input")
    at_the_end = judge(peers(("worker0", read({"step": 37}, worker0)),
                             ("worker1", read({"step": 37}, worker1))))
    assert at_the_end is not None and at_the_end.strong
    assert "has 37 batches an epoch and worker0 40" in found.reason
    assert "worker0 waits in step 38's all-reduce" in found.reason
    assert "repeat() the dataset and set steps_per_epoch" in found.reason


def test_evaluate_on_the_chief_only_while_the_other_trains():
    # stuck_chief_eval.py between two fits: worker0 evaluates, worker1 trains on.
    found = judge(peers(
        ("worker0", at(at="evaluate", at_len=20, at_len_by="steps_per_epoch", at_step=20,
                       at_epoch=0, at_from=0, at_ended=[0, 20], step=20)),
        ("worker1", at(at="train", at_len=20, at_len_by="steps_per_epoch", at_step=20,
                       at_epoch=1, at_from=20, at_ended=[0, 20], step=21))))
    assert found is not None and found.strong
    assert (found.task, found.cause) == ("worker0", "chief_only")
    assert found.reason.startswith(
        "entered evaluate() at step 20, worker1 went on training (epoch 2, step 21): "
        "evaluation runs on every worker under MultiWorkerMirroredStrategy")


def test_evaluate_on_the_chief_only_after_the_others_finished():
    found = judge(peers(
        ("worker0", at(at="evaluate", at_step=40, at_epoch=1, at_from=20, step=40)),
        ("worker1", at(at="outside", at_step=40, at_epoch=1, at_from=20, step=40)),
        finished=("worker1",)))
    assert found is not None and found.strong and found.task == "worker0"
    assert "worker1 had finished" in found.reason


def test_steps_per_epoch_per_worker():
    # stuck_steps.py: steps_per_epoch from each worker's own shard.
    found = judge(peers(
        ("worker0", at(at="train", at_len=40, at_len_by="steps_per_epoch", at_epoch=0,
                       step=30)),
        ("worker1", at(at="train", at_len=37, at_len_by="steps_per_epoch", at_epoch=0,
                       step=30))))
    assert found is not None and (found.task, found.cause) == ("worker1", "step_count")
    assert "runs 37 steps an epoch and worker0 40" in found.reason
    assert "same steps_per_epoch" in found.reason


def test_a_stopping_rule_per_worker_at_the_abort():
    # worker1's callback set stop_training after step 37; worker0 went on.
    workers = peers(
        ("worker0", at(at="train", at_len=100, at_epoch=0, step=38)),
        ("worker1", at(at="train", at_len=100, at_epoch=0, step=37, at_stopping=1)))
    assert judge(workers) is None  # steps read at different times mean nothing alone
    found = judge(workers, aborted=True)
    assert found is not None and not found.strong
    assert (found.task, found.cause) == ("worker1", "step_count")
    assert "stopped training after step 37 (a callback set stop_training)" in found.reason


def test_one_left_fit_mid_epoch_while_the_other_trains():
    training = at(at="train", at_len=100, at_epoch=0, at_epochs=1, step=37)
    left = at(at="outside", at_len=100, at_epoch=0, at_epochs=1, step=37)
    found = judge(peers(("worker0", training), ("worker1", left)))
    # Still running: it may be on its way to another fit (loading data).
    assert found is not None and not found.strong
    assert (found.task, found.cause) == ("worker1", "step_count")
    assert "left fit() after step 37, worker0 is still training (epoch 1, waiting in " \
           "step 38's all-reduce)" in found.reason
    exited = judge(peers(("worker0", training), ("worker1", left), finished=("worker1",)))
    assert exited is not None and exited.strong and exited.reason.startswith("exited after")


def test_epoch_ended_on_one_worker_only():
    behind = at(at="train", at_epoch=0, at_from=0, step=37, at_epochs=3)
    ahead = at(at="train", at_epoch=1, at_from=37, at_ended=[0, 37], step=37, at_epochs=3)
    found = judge(peers(("worker0", behind), ("worker1", ahead)))
    # worker0 has not ended epoch 1: not in a slow epoch-end callback (the end is
    # marked before them), so in step 38, which worker1 never runs.
    assert found is not None and found.strong and found.task == "worker1"
    assert "finished epoch 1 after 37 steps, worker0 is waiting in step 38's" in found.reason
    ended_too = read({"at_ended": [0, 37]}, behind)
    assert judge(peers(("worker0", ended_too), ("worker1", ahead))) is None


def test_a_distributed_call_on_the_chief_only_in_a_custom_loop():
    # stuck_ctl_eval.py at the abort: worker0 reduces its metric's result()
    # (after two eval_steps), worker1 is in its 11th train_step.
    workers = peers(
        ("worker0", at(at="outside", at_calls=13, at_call="strategy.reduce()", at_call_n=1,
                       step=10)),
        ("worker1", at(at="outside", at_calls=11, at_call="train_step", at_call_n=11,
                       step=11)))
    found = judge(workers)
    assert found is not None and not found.strong  # counts apart: maybe only slow
    assert (found.task, found.cause) == ("worker0", "chief_only")
    assert found.reason.startswith("is in strategy.reduce() (its distributed call 13, 1st of "
                                   "its kind), worker1 in train_step (its call 11)")
    # The same count but different calls: certain.
    level = peers(("worker0", at(at="outside", at_calls=11, at_call="eval_step", at_call_n=1)),
                  ("worker1", at(at="outside", at_calls=11, at_call="train_step",
                                 at_call_n=11)))
    assert judge(level).strong and judge(level).task == "worker0"


def test_a_custom_loop_that_ends_sooner_on_one_worker():
    shorter = at(at="outside", at_calls=37, at_call="train_step", at_call_n=37)
    longer = at(at="outside", at_calls=39, at_call="train_step", at_call_n=39)
    found = judge(peers(("worker0", longer), ("worker1", shorter)))
    # Weak: a call without collectives on one worker only offsets counts for good.
    assert found is not None and not found.strong
    assert (found.task, found.cause) == ("worker1", "step_count")
    assert "began 37 distributed calls (train_step), worker0 39" in found.reason
    # One apart is what a plain hang looks like too: the peer waits in the next call.
    one_apart = read({"at_calls": 38, "at_call_n": 38}, shorter)
    assert judge(peers(("worker0", longer), ("worker1", one_apart))) is None
    other_call = read({"at_call": "eval_step", "at_call_n": 1}, one_apart)
    assert judge(peers(("worker0", longer), ("worker1", other_call))) is None
    assert judge(peers(("worker0", longer), ("worker1", read({"at_calls": 39}, shorter)))) \
        is None


def test_different_lengths_are_foreseen_once_every_worker_trains():
    worker0 = at(at="train", at_len=40, at_len_by="input", at_epoch=0, step=0)
    worker1 = at(at="train", at_len=37, at_len_by="input", at_epoch=0, step=0)
    ahead = foresee(peers(("worker0", worker0), ("worker1", worker1)))
    assert ahead is not None and ahead.task == "worker1" and ahead.cause == "uneven_input"
    assert foresee(peers(("worker0", worker0), ("worker1", Position()))) is None
    assert foresee(peers(("worker0", worker0), ("worker1", read({"at_len": 40}, worker1)))) \
        is None


# ----------------------------------------------------- healthy: never stuck

def test_healthy_positions_are_no_finding():
    same = at(at="train", at_len=20, at_epoch=1, at_from=20, step=30)
    assert judge(peers(("worker0", same), ("worker1", read({"step": 28}, same)))) is None
    evaluating = at(at="evaluate", at_epoch=1, step=40)
    assert judge(peers(("worker0", evaluating), ("worker1", evaluating))) is None
    # The last epoch's end: worker1 exited, worker0 finishes its fit.
    last = at(at="train", at_len=20, at_epoch=1, at_epochs=2, at_from=20, step=40)
    found = judge(peers(("worker0", last), ("worker1", last), finished=("worker1",)))
    assert found is None or not found.strong
    # One worker not reporting yet (tracing its first step), or a single worker.
    assert judge(peers(("worker0", same), ("worker1", Position()))) is None
    assert judge(peers(("worker0", same))) is None


def test_a_peer_outside_keras_may_be_on_its_way():
    # worker1 loads its evaluation data (slowly) while worker0 already evaluates.
    found = judge(peers(("worker0", at(at="evaluate", at_step=40, step=40)),
                        ("worker1", at(at="outside", at_step=40, step=40))))
    assert found is not None and not found.strong


def test_a_save_on_one_worker_may_be_slow_only():
    found = judge(peers(("worker0", at(at="save", step=20)),
                        ("worker1", at(at="train", at_epoch=1, step=20))))
    assert found is not None and not found.strong and found.cause == "chief_only"
    assert "call save() on every worker" in found.reason


def test_mismatched_collectives_in_tensorflows_words():
    assert mismatched(["E0000 base_collective_executor.cc:252] BaseCollectiveExecutor::"
                       "StartAbort INTERNAL: Collective instance 301 expected type 0 and "
                       "data_type 9 but got type 0 and data_type 1"])
    assert mismatched(["StartAbort INVALID_ARGUMENT: Shape mismatch in the collective "
                       "instance 266. Op at device ..."])
    assert not mismatched(["StartAbort UNAVAILABLE: failed to connect to all addresses"])


# ------------------------------------------------------------- the tracker

def test_positions_keep_the_longest_pause_after_the_first_step():
    positions = Positions()
    positions.take("worker0", {"at": "train", "at_step": 0}, now=0.0)
    positions.take("worker0", {"step": 1}, now=12.0)  # the first step: tracing
    assert positions.quiet_needed() == 3 * 12.0
    positions.take("worker0", {"step": 1}, now=20.0)  # nothing new: no move
    assert positions.moved_at == 12.0 and positions.quiet_s(30.0) == 18.0
    fresh = Positions()
    assert fresh.quiet_needed() == QUIET_S and fresh.quiet_s(5.0) == 0.0


def test_read_ignores_what_it_cannot_use():
    position = read({"at": "train", "at_epoch": "two", "at_ended": [1], "step": True}, Position())
    assert position == Position(phase="train")
    assert read({"at_step": 7}, read({"step": 9}, Position())).step == 9
