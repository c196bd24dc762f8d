"""Keras 3 `fit` on JAX resumed in the middle of an epoch (launcher/runtime/
epochinput3.py): the launcher does not carry the input's position there, so
a mid-epoch save is taken only where a new process reads the epoch in the
same order (arrays that `fit` does not shuffle); otherwise the epoch's end is
saved instead and a resume trains the epoch again from its start: nothing
twice, nothing never. Run as a task runs it (`python -m launcher.bootstrap`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, SCRIPTS

SCRIPT = str(SCRIPTS / "jax_midsave.py")


def _run(backup: Path, shuffle: str, stop: int, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": str(REPO), **env}
    env.pop("TF_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "launcher.bootstrap", SCRIPT, str(backup),
                           shuffle, str(stop)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=240)


def test_a_jax_fit_with_no_callback_of_its_own_trains_as_a_task(tmp_path):
    """As a task of the launcher (a progress channel: the loss sentinel on),
    a Keras 3 `fit` on JAX with no batch callback of its own: Keras would run
    the sentinel's off the training thread, which raced JAX's donated buffers
    ("Buffer has been deleted or donated" at the second step); on JAX it runs
    on the training thread."""
    with open(tmp_path / "progress", "w") as channel:
        done = subprocess.run(
            [sys.executable, "-m", "launcher.bootstrap", SCRIPT, str(tmp_path / "b"), "false",
             "-1"], env={**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": str(REPO),
                         "PLAIN": "1", "MGPU_PROGRESS_FD": str(channel.fileno())},
            pass_fds=(channel.fileno(),), cwd=REPO, capture_output=True, text=True,
            timeout=240)
    assert done.returncode == 0 and "DONE" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize("call, why", [
    (((np.zeros(4), np.zeros(4)), {"shuffle": False}), ""),
    (((np.zeros(4),), {"shuffle": None}), ""),  # Keras tests its truth: in order
    (((), {"x": {"a": np.zeros(4)}, "shuffle": False}), ""),
    (((np.zeros(4), np.zeros(4), 2, 1, 0, None, 0.0, None, False), {}), ""),  # positional
    (((np.zeros(4),), {}), "fit shuffles its arrays (shuffle=True)"),
    (((np.zeros(4),), {"shuffle": False, "steps_per_epoch": 2}), "steps_per_epoch cuts"),
    ((((i for i in range(3)),), {"shuffle": False}), "not carried on Keras 3's jax"),
])
def test_which_jax_fits_read_an_epoch_in_one_order(call, why):
    from launcher.runtime.epochinput3 import order_elsewhere

    said = order_elsewhere("jax", *call)
    assert why in said if why else said == "", said


@pytest.mark.parametrize("shuffle, resumed_at", [("false", 4), ("true", 0)])
def test_a_jax_fit_resumes_mid_epoch_only_where_its_order_is_the_same(
        tmp_path, shuffle, resumed_at):
    """Interrupted as epoch 2's 6th batch begins (its save_freq=3 save made
    after its 4th), then run again: in order (`shuffle=False`) it resumes at
    the 5th batch; shuffled (fit's default) that save was not taken, said
    once, and the epoch is trained again from its first batch (before: from
    its 5th, in another order: some samples twice, others never)."""
    first = _run(tmp_path / "backup", shuffle, stop=13)
    assert first.returncode == 3, first.stderr[-3000:]
    said = "a save in the middle of an epoch (BackupAndRestore's save_freq, the " \
        "launcher's memory_interval) is not taken"
    if shuffle == "true":
        assert first.stderr.count(said) == 1, first.stderr[-3000:]
        assert "(fit shuffles its arrays (shuffle=True) and Keras 3's jax backend draws " \
            "another order in a new process)" in first.stderr, first.stderr[-3000:]
    else:
        assert said not in first.stderr, first.stderr[-3000:]
    again = _run(tmp_path / "backup", shuffle, stop=-1)
    assert again.returncode == 0, again.stderr[-3000:]
    batches = [tuple(map(int, line.split()[1:])) for line in again.stdout.splitlines()
               if line.startswith("BATCH")]
    assert batches == [(1, b) for b in range(resumed_at, 8)], again.stdout[-2000:]
