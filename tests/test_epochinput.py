"""Which inputs' position in an epoch a restart can carry
(launcher/runtime/epochinput.py `why_not`), and the fact the replay rests on:
a seeded reshuffled dataset's order in its n-th iterator of a process
follows the iterators made before it, of the dataset or of its distributed copy;
and a bad batch skipped by its position (MGPU_SKIP_BATCHES), in tf_keras' own
DataHandler, where a skip can be exact."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf  # noqa: E402

from launcher.runtime.epochinput import why_not  # noqa: E402
from launcher.runtime.sentinel import exactness  # noqa: E402


def seeded():
    return tf.data.Dataset.range(16).shuffle(16, seed=7, reshuffle_each_iteration=True)


def test_a_seeded_pipeline_of_stateless_ops_is_carried():
    pipeline = seeded().map(lambda i: tf.random.stateless_uniform(
        [], seed=tf.stack([i, i]))).batch(4).prefetch(2)
    assert why_not(pipeline) == ""
    assert why_not(tf.data.Dataset.from_tensor_slices(np.arange(8)).repeat().batch(2)) == ""


@pytest.mark.parametrize("build, reason", [
    (lambda: tf.data.Dataset.range(8).shuffle(8), "its shuffle has no seed"),
    (lambda: tf.data.Dataset.from_generator(
        lambda: iter(range(4)), output_signature=tf.TensorSpec([], tf.int64)).batch(2),
     "reads a Python generator"),
    (lambda: seeded().map(lambda i: i + tf.cast(tf.random.uniform([], 0, 3, tf.int32), tf.int64)),
     "a random op without a stateless seed (RandomUniformInt) reads its data"),
    (lambda: seeded().map(lambda i: tf.py_function(lambda v: v, [i], tf.int64)),
     "calls Python (tf.py_function)"),
    (lambda: seeded().map(lambda i: i, num_parallel_calls=2, deterministic=False),
     "a parallel map or interleave is non-deterministic (deterministic=False)"),
    (lambda: seeded().batch(4).cache(), "it caches after a shuffle that reshuffles each epoch"),
])
def test_an_input_whose_order_a_restart_cannot_reproduce_is_named(build, reason):
    assert why_not(build()) == reason


def test_a_seeded_shuffles_nth_order_follows_the_iterators_made_before():
    def orders(dataset, made: int) -> list[int]:
        for _ in range(made):
            iter(dataset)  # made and dropped, nothing read
        return [int(v) for v in next(iter(dataset.batch(16)))]

    first = orders(seeded(), 0)
    third = orders(seeded(), 2)
    assert first != third and sorted(third) == list(range(16))
    again = seeded()
    assert [orders(again, 0), orders(again, 1)] == [first, third]




@pytest.mark.parametrize("flavor", ["tf_keras", "keras3"])
def test_saves_not_taken_mid_epoch_are_not_reported_as_checkpoints(tmp_path, flavor):
    """An input a restart cannot continue mid-epoch (arrays fit shuffles) keeps
    runtime.callbacks(save_freq=3)'s saves to epoch ends: the progress reports
    name a checkpoint only there, never one that was not written (tf_keras,
    and Keras 3 on TensorFlow: runtime/epochinput3.py)."""
    from tests.test_runtime_restores import run_script

    argv = ["phantom_saves.py"] + (["keras3"] if flavor == "keras3" else [])
    records, output = run_script(tmp_path, argv, 0,
                                 MGPU_CHECKPOINT_DIR=str(tmp_path / "ckpt"))
    named = [(r["step"], bool(r.get("epoch_end"))) for r in records  # the step reports'
             if r.get("checkpoint") and "step" in r]
    assert named == [(8, True), (16, True)], records
    assert [r["saved"] for r in records if "saved" in r] == [8, 16], records
    assert "is not taken: this fit's input cannot continue there" in output, output[-3000:]


# --- a bad batch skipped by its position (MGPU_SKIP_BATCHES) ----------------


def test_the_skip_list_reads_epoch_batch_pairs_and_leaves_out_the_rest():
    from launcher.runtime.epochinput import skip_list, skips_of

    assert skips_of("2:19, 3:5,x,4:,-1:2,5:6:7,8:9:10:11") == {(2, 19), (3, 5), (5, 6)}
    assert skips_of("") == frozenset()
    assert skip_list("2:19:100,3:5") == {(2, 19): 100, (3, 5): None}  # the step it went bad at


def _model(**compiled):
    import tf_keras as keras

    from launcher.runtime import epochinput

    epochinput.on_tf_keras(keras)  # the bootstrap's hooks (once per process)
    model = keras.Sequential([keras.layers.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", **compiled)
    return model


def _trained(model, dataset, epoch: int = 0, step: int = 0,
             epochs: int = 2) -> dict[int, list[int]]:
    """The batch each step of fit's epochs reads (one a step, as its train
    function does), fit resumed at (epoch, step) as a restore leaves it."""
    from tf_keras.src.engine import data_adapter

    from launcher.runtime import epochinput

    epochinput._resume.update(first=0, epoch=epoch, step=step, model=model)  # `_counters`
    handler = data_adapter.DataHandler(x=dataset, epochs=epochs, model=model,
                                       steps_per_execution=model._steps_per_execution)
    handler._initial_epoch, handler._initial_step = epoch, step
    seen: dict[int, list[int]] = {}
    for at, iterator in handler.enumerate_epochs():
        for _ in handler.steps():
            seen.setdefault(at, []).append(int(next(iterator)[0]))
    return seen


def test_a_skipped_batch_is_read_and_dropped_at_its_position_across_resumes(
        monkeypatch, capsys):
    monkeypatch.delenv("TF_CONFIG", raising=False)  # alone: the chief, who says it
    monkeypatch.setenv("MGPU_SKIP_BATCHES", "1:3,1:6")
    batches = tf.data.Dataset.range(8).batch(1)  # batch i holds i
    model = _model()
    assert _trained(model, batches) == {0: list(range(8)), 1: [0, 1, 2, 4, 5, 7]}
    # The optimizer's counter moved past each (no step trained here): later steps
    # keep their numbers.
    assert int(model.optimizer.iterations.numpy()) == 2
    # What the sentinel's `nonfinite` report tells the launcher: a skip is exact here.
    assert exactness(model) == {"nonfinite_exact": 1}
    said = capsys.readouterr().err
    assert "mgpu-launch: skipped batch 4 of epoch 2 (its loss went bad at step 1 " \
        "twice): not trained" in said, said
    assert "skipped batch 7 of epoch 2" in said, said
    # Positions are positions: a resume before a skipped batch skips it again, a
    # resume past it drops it with the batches before the save.
    assert _trained(model, batches, epoch=1, step=2) == {1: [2, 4, 5, 7]}
    assert _trained(model, batches, epoch=1, step=5) == {1: [5, 7]}


def test_a_resume_with_only_skipped_batches_left_goes_on_at_the_next_epoch(monkeypatch):
    # The bad batch was the epoch's last, the save just before it: tf_keras would
    # end an epoch that trained nothing with "Empty logs", on every restart.
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("MGPU_SKIP_BATCHES", "1:7")
    batches = tf.data.Dataset.range(8).map(lambda i: (tf.cast([i], tf.float32), [0.0])).batch(1)

    class Restored:  # what BackupAndRestore's training state says after a restore
        def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch, epoch, mode):
            return 1, 7

    model = _model()
    model._training_state = Restored()
    model.fit(batches, epochs=3, verbose=0)  # no ValueError: epoch 3 trained
    assert int(model.optimizer.iterations.numpy()) == 9  # the skip counted, 8 trained
    # Not the last one left: the epoch goes on as before.
    assert _trained(_model(), tf.data.Dataset.range(8).batch(1), epoch=1, step=6,
                    epochs=3)[1] == [6]


def test_a_batch_named_at_another_step_is_trained(monkeypatch, capsys):
    # Another `fit` of the script (a fine-tuning phase) numbers its epochs from 0
    # too: the batch at the position named is skipped only at the step that went bad.
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("MGPU_SKIP_BATCHES", "0:3:50")
    read_end, write_end = os.pipe()  # the progress channel: the launcher hears each
    monkeypatch.setenv("MGPU_PROGRESS_FD", str(write_end))
    batches = tf.data.Dataset.range(8).batch(1)
    assert _trained(_model(), batches, epochs=1) == {0: list(range(8))}
    assert "batch 4 of epoch 1 is trained, not skipped: the launcher skips the one that " \
        "went bad at step 50, this fit is at step 1 there" in capsys.readouterr().err
    monkeypatch.setenv("MGPU_SKIP_BATCHES", "0:3:1")  # here no step trains: step 1 it is
    assert _trained(_model(), batches, epochs=1) == {0: [0, 1, 2, 4, 5, 6, 7]}
    os.close(write_end)
    with os.fdopen(read_end) as channel:
        told = [json.loads(line) for line in channel]
    said = [(key, r[key]) for r in told for key in ("skip_not", "skip_done") if key in r]
    assert said == [("skip_not", [1, 0, 3]), ("skip_done", [1, 0, 3])], told


def test_a_batch_is_not_skipped_where_its_position_is_not_exact(monkeypatch, capsys):
    from launcher.runtime.epochinput import skip_blocker

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("MGPU_SKIP_BATCHES", "0:1")
    several = _model(steps_per_execution=2)
    # Four steps of two batches an epoch (this helper reads one a step): none dropped.
    assert _trained(several, tf.data.Dataset.range(8).batch(1)) == {0: [0, 1, 2, 3],
                                                                    1: [0, 1, 2, 3]}
    assert "are trained instead: steps_per_execution is 2" in capsys.readouterr().err
    assert exactness(several) == {"nonfinite_inexact": "steps_per_execution is 2: a step "
                                  "trains 2 batches"}
    unseeded = _model()
    shuffled = tf.data.Dataset.range(8).shuffle(8).batch(1)
    assert len(_trained(unseeded, shuffled)[0]) == 8
    assert skip_blocker(unseeded) == \
        "the input's position cannot be carried (its shuffle has no seed)"
    assert skip_blocker(object()) == "the input's position is not carried here (Keras 3)"


def test_the_sentinel_counts_a_batch_skipped_before_the_first_one_an_epoch_trains(
        monkeypatch):
    # Resumed at position 2 (two steps done), its batch skipped before position 3
    # trains: the step counter moved after on_epoch_begin read it. Position 3 is
    # step 4, as uninterrupted, not 3 (the bad step 3's again: a skip without replay).
    import math

    import tf_keras

    from launcher.runtime import sentinel

    reported = []
    monkeypatch.setattr(sentinel, "report", lambda step, *rest: reported.append(step))
    model = _model()
    model.optimizer.iterations.assign(2)
    watch = sentinel._loss_callback(tf_keras.callbacks)()
    watch.set_model(model)
    watch.on_epoch_begin(0)
    model.optimizer.iterations.assign_add(1)  # position 2 skipped (epochinput.count_skip)
    model._mgpu_skipped = frozenset({(0, 2)})
    watch.on_train_batch_begin(3)
    model.optimizer.iterations.assign_add(1)  # position 3 trained: step 4
    watch.on_train_batch_end(3, {"loss": math.nan})
    watch.on_epoch_end(0)
    assert reported == [4]


def _iterators() -> int:
    import gc

    gc.collect()
    return sum(type(found).__name__ == "OwnedIterator" for found in gc.get_objects())


def test_evaluates_input_is_let_go_when_evaluate_ends_as_without_the_launcher(monkeypatch):
    """fit's validation makes an iterator each epoch; the hooks must not keep it
    to the next one: under MultiWorkerMirroredStrategy a held one made every
    epoch's end 0.5-1.8 s slower and fit's return wait up to 5 s (its tf.data
    threads torn down late), on a validation over a repeated dataset."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    model = _model()
    data = tf.data.Dataset.from_tensor_slices((np.zeros((8, 1)), np.zeros((8, 1))))
    data = data.repeat().batch(2)
    before, alive = _iterators(), []
    import tf_keras as keras

    count = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: alive.append(_iterators() - before))
    model.fit(data, epochs=3, steps_per_epoch=4, validation_data=data, validation_steps=2,
              callbacks=[count], verbose=0)
    assert alive == [1, 1, 1]  # fit's own (one stream over its epochs), no evaluate's
