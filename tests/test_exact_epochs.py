"""Every sample of every epoch reaches the final weights once across a resume
in the middle of an epoch (launcher/runtime/epochinput.py), counted as a
user would: from the ids each training step saw, taking for each step the
last generation that trained it (a step trained again after a restart was
rolled back with the save it came after). Two workers, tf_keras `fit`, a
kill -9 of worker 1 in the middle of epoch 1, five shapes of the script at
once (their jobs side by side), and
Keras 3's `fit` on TensorFlow beside them (runtime/epochinput3.py) with the
first shape and both generator ones:

- its own `BackupAndRestore(save_freq=3)` over a seeded reshuffled dataset,
  over a Python generator (its position cannot be carried: the epoch again
  from its start, said), and over the seeded dataset through a `filter`
  (its length unknown, no steps_per_epoch: tf_keras' own resume failed with
  a TypeError on every restore; its mid-epoch saves are not taken, said);
- epoch saves only, with the launcher's `memory_interval: 3` (its saves to
  memory), over the seeded dataset `repeat()`ed with `steps_per_epoch` (one
  stream over the epochs), and over the generator.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, read_summary
from tests.test_faults import Job, jobs, launch  # noqa: F401 - `jobs` is a fixture

pytestmark = pytest.mark.e2e

SCRIPT = str(SCRIPTS / "exact_epochs.py")
SAMPLES, STEPS, EPOCHS = 64, 8, 3


def trained_per_epoch(ids_dir: Path) -> list[Counter]:
    """The ids of the steps whose updates reached the final weights, per epoch."""
    last: dict[tuple[int, int], tuple[int, list[int]]] = {}  # (step, worker): (generation, ids)
    for path in ids_dir.glob("g*-w*.jsonl"):
        generation, worker = (int(part[1:]) for part in path.stem.split("-"))
        for line in path.read_text().splitlines():
            record = json.loads(line)
            key = (record["step"], worker)
            if key not in last or last[key][0] < generation:
                last[key] = (generation, record["ids"])
    epochs = [Counter() for _ in range(EPOCHS)]
    for (step, _), (_, ids) in last.items():
        epochs[(step - 1) // STEPS].update(ids)
    return epochs


def twice_and_never(epochs: list[Counter]) -> tuple[int, int]:
    twice = sum(n - 1 for epoch in epochs for n in epoch.values() if n > 1)
    never = sum(1 for epoch in epochs for i in range(SAMPLES) if i not in epoch)
    return twice, never


# No warm standbys: eight tasks on two cores leave a standby no CPU to finish
# its import before the restart, which starts cold and drops it (15-27 s of
# import thrown away a task, measured); every start here is cold either way.
# LOCAL_CLUSTER: `--local 2`'s cluster.
NO_STANDBY = "restart: {warm_standby: 'off'}\n"
LOCAL_CLUSTER = ("name: local\ntransport: local\nports: {base: auto}\n" + NO_STANDBY
                 + "hosts:\n" + "".join(f"  - {{address: 127.0.0.1, name: host{i}}}\n"
                                         for i in range(2)))
MEMORY_CLUSTER = ("name: two\ntransport: local\nrestart: {backoff_s: 0, warm_standby: 'off'}\n"
                  "checkpoint: {memory: true, memory_interval: 3}\n"
                  "hosts:\n" + "  - {address: 127.0.0.1}\n" * 2)
CANNOT = "cannot continue there after a restart (reads a Python generator)"
UNKNOWN = ("cannot continue there after a restart (its length is unknown and fit was given "
           "no steps_per_epoch)")
STREAM = "input is one stream over its epochs (a repeated dataset): 12 batches of it"
# Saves after steps 3, 6, 9, 12 (its own save_freq, or the launcher's to
# memory): killed after step 14, in the middle of epoch 1 (steps 9-16), so the
# newest save is in the middle of it too. (input, save_freq or memory,
# the step it resumes at, whether CANNOT is said: once a generation)
SHAPES = {
    "seeded": ("seeded", "save_freq", 12, False),
    "generator": ("generator", "save_freq", STEPS, True),
    "repeated": ("repeated", "memory", 12, False),
    "memory_generator": ("generator", "memory", STEPS, True),
    # tf_keras cannot resume an input of unknown length in the middle (a TypeError on
    # every restore): its mid-epoch saves are not taken, the epoch's end is
    "unknown": ("unknown", "save_freq", STEPS, False),
    "keras3": ("seeded", "save_freq", 12, False),  # Keras 3 on TensorFlow: epochinput3.py
    "keras3_generator": ("generator", "save_freq", STEPS, True),
    "keras3_memory_generator": ("generator", "memory", STEPS, True),
}


def test_a_mid_epoch_resume_trains_every_sample_of_every_epoch_once(
        workdir, jobs, monkeypatch):  # noqa: F811
    monkeypatch.setenv("KILL_AT_STEP", "14")
    started: dict[str, tuple[Job, Path]] = {}
    for name, (given, saves, *_expected) in SHAPES.items():
        folder = workdir / name
        (folder / "ids").mkdir(parents=True)
        monkeypatch.setenv("INPUT", given)  # read as each job starts
        monkeypatch.setenv("KERAS", "3" if name.startswith("keras3") else "")
        if saves == "save_freq":
            monkeypatch.setenv("SAVE_FREQ", "3")
            (folder / "two.yaml").write_text(LOCAL_CLUSTER)
        else:
            monkeypatch.delenv("SAVE_FREQ", raising=False)
            (folder / "two.yaml").write_text(MEMORY_CLUSTER)
        cluster = [str(folder / "two.yaml")]
        started[name] = (launch(jobs, [*cluster, "--max-restarts", "1", "--no-live", SCRIPT,
                                       str(folder / "backup"), str(folder / "ids")], folder),
                         folder / "ids")
    for name, (job, ids) in started.items():
        _given, _saves, resume, said = SHAPES[name]
        assert job.finish(timeout=240) == 0, (name, job.output[-3000:])
        summary = read_summary(job.run_dir)
        failures = [e["reason"] for e in job.events("failure_detected")]
        assert summary["status"] == "succeeded" and summary["restarts"] == 1, (name, failures)
        epochs = trained_per_epoch(ids)
        assert twice_and_never(epochs) == (0, 0), (name, [sorted(e.items()) for e in epochs])
        assert all(set(epoch) == set(range(SAMPLES)) for epoch in epochs), name
        assert summary["resumed"][0]["step"] == resume, (name, summary["resumed"])
        assert (job.output.count(CANNOT) in (1, 2)) if said else CANNOT not in job.output, \
            (name, job.output[-3000:])
        assert (STREAM in job.output) == (name == "repeated"), (name, job.output[-3000:])
        assert (UNKNOWN in job.output) == (name == "unknown"), (name, job.output[-3000:])
