"""Which inputs' position in an epoch a restart can carry
(launcher/runtime/epochinput.py `why_not`), and the fact the replay rests on:
a seeded reshuffled dataset's order in its n-th iterator of a process
follows the iterators made before it, of the dataset or of its distributed copy."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from launcher.runtime.epochinput import why_not  # noqa: E402


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




def test_saves_not_taken_mid_epoch_are_not_reported_as_checkpoints(tmp_path):
    """An input a restart cannot continue mid-epoch (arrays fit shuffles) keeps
    runtime.callbacks(save_freq=3)'s saves to epoch ends: the progress reports
    name a checkpoint only there, never one that was not written."""
    from tests.test_runtime_restores import run_script

    records, output = run_script(tmp_path, ["phantom_saves.py"], 0,
                                 MGPU_CHECKPOINT_DIR=str(tmp_path / "ckpt"))
    named = [(r["step"], bool(r.get("epoch_end"))) for r in records  # the step reports'
             if r.get("checkpoint") and "step" in r]
    assert named == [(8, True), (16, True)], records
    assert [r["saved"] for r in records if "saved" in r] == [8, 16], records
    assert "is not taken: this fit's input cannot continue there" in output, output[-3000:]
