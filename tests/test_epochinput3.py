"""A Keras 3 `fit` resumed in the middle of an epoch trains what the
uninterrupted one trained next (launcher/runtime/epochinput3.py): in-process,
real Keras 3 on TensorFlow, `BackupAndRestore(save_freq=3)`, a `fit`
interrupted after a save and resumed by a fresh model over the same backup
directory. Counted as a user would: the ids each training step read, keeping
of the interrupted run the steps its last save holds."""

from __future__ import annotations

import importlib
import json
import os

import numpy as np
import pytest

# Keras 3 on TensorFlow here, for this import only: a KERAS_BACKEND left in
# os.environ reaches every task the rest of the session starts (the JAX
# example's own setdefault("KERAS_BACKEND", "jax") then loses to it).
_backend = os.environ.get("KERAS_BACKEND")
os.environ["KERAS_BACKEND"] = "tensorflow"
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

if _backend is None:
    del os.environ["KERAS_BACKEND"]
else:
    os.environ["KERAS_BACKEND"] = _backend

from launcher.runtime import epochinput3  # noqa: E402
from launcher.runtime.sentinel import exactness  # noqa: E402

SAMPLES, BATCH, EPOCHS = 32, 4, 3  # 8 steps an epoch
STEPS = SAMPLES // BATCH
READ = tf.Variable(tf.zeros([BATCH], tf.int64))  # the ids the last step trained


@pytest.fixture(autouse=True, scope="module")
def hooks():
    for name, hook in epochinput3.HOOKS.items():  # the bootstrap's (once per process)
        if ".backend." not in name or ".tensorflow." in name:  # as imported on TensorFlow
            hook(importlib.import_module(name))


class Recorded(keras.Model):
    def train_step(self, data):
        READ.assign(tf.cast(data[0][:, 0], tf.int64))
        return super().train_step(data)


def _model() -> keras.Model:
    inputs = keras.Input((1,))
    model = Recorded(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    return model


def seeded() -> tf.data.Dataset:
    return tf.data.Dataset.range(SAMPLES).shuffle(SAMPLES, seed=7, reshuffle_each_iteration=True)


def _batches(dataset: tf.data.Dataset) -> tf.data.Dataset:
    return dataset.map(lambda i: (tf.cast(tf.reshape(i, [1]), tf.float32),
                                  tf.zeros([1]))).batch(BATCH)


class Interrupted(Exception):
    pass


class Log(keras.callbacks.Callback):
    """(epoch, batch, ids) of each step; raises at the start of `stop`."""

    def __init__(self, stop: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.seen: list[tuple[int, int, list[int]]] = []
        self.stop, self.epoch = stop, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.stop:
            raise Interrupted  # a kill after the save before it

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append((self.epoch, batch, sorted(READ.numpy().tolist())))


def _fit(data, backup=None, stop=None, **kwargs) -> tuple[keras.Model, list]:
    model, log = _model(), Log(stop)
    callbacks = [log] + ([keras.callbacks.BackupAndRestore(str(backup), save_freq=3)]
                         if backup else [])
    try:
        model.fit(data(), epochs=EPOCHS, verbose=0, callbacks=callbacks, **kwargs)
    except Interrupted:
        pass
    return model, log.seen


def _resumed(tmp_path, data, stop=(1, 5), **kwargs) -> tuple[keras.Model, list, list]:
    """The steps that reached the final weights (the interrupted run's up to
    its last save, then the resumed run's), and the resumed run's alone."""
    first, seen = _fit(data, tmp_path, stop, **kwargs)
    saved = json.loads((tmp_path / "training_metadata.json").read_text())
    done = (saved["epoch"], saved.get("mgpu_batches", 0) - 1)
    model, again = _fit(data, tmp_path, **kwargs)
    return model, [s for s in seen if (s[0], s[1]) <= done] + again, again


def test_a_resumed_epoch_trains_the_rest_of_its_seeded_order_once(tmp_path):
    data = lambda: _batches(seeded())  # noqa: E731
    model, kept, again = _resumed(tmp_path, data)
    # Saved after batch 3 of epoch 1 (save_freq=3 over 8-batch epochs): on from batch 4.
    assert [(e, b) for e, b, _ in again][:2] == [(1, 4), (1, 5)]
    for epoch in range(EPOCHS):
        ids = [i for e, _, batch in kept if e == epoch for i in batch]
        assert sorted(ids) == list(range(SAMPLES)), epoch  # each sample once
    _, uninterrupted = _fit(data)
    assert kept == uninterrupted  # the same batches, in the same order
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * STEPS
    assert exactness(model) == {"nonfinite_exact": 1}


def test_a_stream_an_unknown_length_and_a_distributed_fit_continue_where_saved(tmp_path):
    stream = lambda: _batches(seeded().repeat())  # noqa: E731
    _, kept, _ = _resumed(tmp_path / "stream", stream, steps_per_epoch=STEPS)
    assert kept == _fit(stream, steps_per_epoch=STEPS)[1]
    unknown = lambda: _batches(seeded().filter(lambda i: True))  # noqa: E731 - length unknown
    _, kept, _ = _resumed(tmp_path / "unknown", unknown, stop=(2, 2))
    assert kept == _fit(unknown)[1]
    # Under a strategy Keras 3 reads a batch first (its symbolic build).
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        data = lambda: _batches(seeded())  # noqa: E731
        _, kept, _ = _resumed(tmp_path / "strategy", data, stop=(2, 2))
        assert kept == _fit(data)[1]


def test_a_named_batch_is_dropped_at_its_step_and_trained_at_another(tmp_path, monkeypatch):
    data = lambda: _batches(seeded())  # noqa: E731
    _, uninterrupted = _fit(data)
    # Epoch 1's batch 6 (step 15) went bad twice: the resumed run drops it there.
    monkeypatch.setenv("MGPU_SKIP_BATCHES", "1:6:15")
    model, kept, again = _resumed(tmp_path / "skip", data)
    assert kept == [s for s in uninterrupted if (s[0], s[1]) != (1, 6)]
    assert (1, 6) not in [(e, b) for e, b, _ in again]
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * STEPS  # later steps keep theirs
    # The same position at another step (another fit's): trained.
    monkeypatch.setenv("MGPU_SKIP_BATCHES", "1:6:3")
    assert _fit(data)[1] == uninterrupted
    # Resumed with nothing left of its epoch but the batch to skip (saved after
    # batch 6, the bad one the last): on at the next epoch, the step counts kept.
    monkeypatch.delenv("MGPU_SKIP_BATCHES")
    _, seen = _fit(data, tmp_path / "tail", stop=(1, 7))
    monkeypatch.setenv("MGPU_SKIP_BATCHES", "1:7:16")
    model, again = _fit(data, tmp_path / "tail")
    assert [(e, b) for e, b, _ in again][0] == (2, 0)
    assert [s for s in seen if (s[0], s[1]) <= (1, 6)] + again == \
        [s for s in uninterrupted if (s[0], s[1]) != (1, 7)]
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * STEPS


def test_an_input_whose_order_a_restart_cannot_reproduce_is_named(tmp_path):
    unseeded = lambda: _batches(tf.data.Dataset.range(SAMPLES).shuffle(SAMPLES))  # noqa: E731
    model, _ = _fit(unseeded)
    assert exactness(model) == {"nonfinite_inexact": "the input's position cannot be "
                                "carried (its shuffle has no seed)"}
    arrays = _model()
    arrays.fit(np.arange(8.0).reshape(-1, 1), np.zeros((8, 1)), batch_size=4, epochs=1, verbose=0)
    assert exactness(arrays)["nonfinite_inexact"].endswith(
        "(it is not a tf.data dataset (Keras 3 carries those only))")


def test_an_input_a_restart_cannot_carry_is_saved_at_epoch_ends_and_trained_once(
        tmp_path, monkeypatch, capsys):
    """An unseeded shuffle: its mid-epoch saves are not taken (said once), the
    epoch's end is, and the resume trains the interrupted epoch from its
    start: every sample of it once."""
    from launcher.runtime import epochinput

    monkeypatch.setattr(epochinput, "_said", set())  # said once per process: this test's
    unseeded = lambda: _batches(tf.data.Dataset.range(SAMPLES).shuffle(SAMPLES))  # noqa: E731
    _, seen = _fit(unseeded, tmp_path, stop=(1, 5))
    # Interrupted at batch 5 of epoch 1: the newest save is epoch 0's end
    # (not batch 2 of epoch 1, save_freq=3's), its batches done not written.
    saved = json.loads((tmp_path / "training_metadata.json").read_text())
    assert saved["epoch"] == 1 and epochinput3.KEY not in saved, saved
    model, again = _fit(unseeded, tmp_path)
    kept = [s for s in seen if s[0] == 0] + again
    assert [(e, b) for e, b, _ in again][0] == (1, 0)
    for epoch in range(EPOCHS):
        ids = [i for e, _, batch in kept if e == epoch for i in batch]
        assert sorted(ids) == list(range(SAMPLES)), epoch  # each sample once
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * STEPS
    err = capsys.readouterr().err
    assert err.count("mgpu-launch: a save in the middle of an epoch") == 1, err
    assert "this fit's input cannot continue there after a restart (its shuffle has no " \
        "seed); saves are taken at epoch ends instead" in err, err
