"""Every sample of every epoch reaches the final weights once across a resume
in the middle of an epoch (launcher/runtime/epochinput.py), counted as a
user would: from the ids each training step saw, taking for each step the
last generation that trained it (a step trained again after a restart was
rolled back with the save it came after). Two workers, tf_keras `fit`, a
reshuffled dataset, `BackupAndRestore(save_freq=3)`, a kill -9 of worker 1
in the middle of epoch 1.
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


def run_killed(jobs: list[Job], workdir: Path, *cluster: str) -> tuple[Job, Path]:  # noqa: F811
    ids = workdir / "ids"
    ids.mkdir()
    job = launch(jobs, [*(cluster or ("--local", "2")), "--max-restarts", "1", "--no-live",
                        SCRIPT, str(workdir / "backup"), str(ids)], workdir)
    return job, ids


@pytest.mark.parametrize("given", ["seeded", "repeated", "generator"])
def test_a_mid_epoch_resume_trains_every_sample_of_every_epoch_once(
        workdir, jobs, monkeypatch, given):  # noqa: F811
    # Saves after steps 3, 6, 9, 12: killed after step 14, in the middle of
    # epoch 1 (steps 9-16), so the newest save is in the middle of it too.
    monkeypatch.setenv("SAVE_FREQ", "3")
    monkeypatch.setenv("KILL_AT_STEP", "14")
    monkeypatch.setenv("INPUT", given)
    job, ids = run_killed(jobs, workdir)
    assert job.finish(timeout=120) == 0, job.output[-3000:]
    summary = read_summary(job.run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 1, summary
    epochs = trained_per_epoch(ids)
    assert twice_and_never(epochs) == (0, 0), [sorted(e.items()) for e in epochs]
    assert all(set(epoch) == set(range(SAMPLES)) for epoch in epochs)
    resumed = summary["resumed"][0]
    said = job.output.count("cannot continue there after a restart (reads a Python generator)")
    if given == "generator":  # its epoch again from the start: resumed at its first step
        assert said == 2 and resumed["step"] == STEPS, (resumed, job.output[-3000:])
    else:  # in the middle of the epoch, where the newest save left it
        assert said == 0 and resumed["step"] == 12, resumed
    stream = "input is one stream over its epochs (a repeated dataset): 12 batches of it"
    assert job.output.count(stream) == (given == "repeated"), job.output[-3000:]


@pytest.mark.parametrize("given", ["seeded", "generator"])
def test_the_launchers_memory_interval_never_makes_a_resume_less_exact(
        workdir, jobs, monkeypatch, given):  # noqa: F811
    # The script saves at epoch ends only; the launcher adds a save to memory
    # every 3 steps (runtime/memcadence.py): killed after step 14, resumed at
    # 12; a generator's position cannot be carried: at its epoch's start (8).
    monkeypatch.setenv("KILL_AT_STEP", "14")
    monkeypatch.setenv("INPUT", given)
    cluster = workdir / "two.yaml"
    cluster.write_text("name: two\ntransport: local\nrestart: {backoff_s: 0}\n"
                       "checkpoint: {memory: true, memory_interval: 3}\n"
                       "hosts:\n" + "  - {address: 127.0.0.1}\n" * 2)
    job, ids = run_killed(jobs, workdir, str(cluster))
    assert job.finish(timeout=120) == 0, job.output[-3000:]
    summary = read_summary(job.run_dir)
    assert summary["resumed"][0]["step"] == (8 if given == "generator" else 12), summary
    said = "cannot continue there after a restart (reads a Python generator)" in job.output
    assert said == (given == "generator"), job.output[-3000:]
    epochs = trained_per_epoch(ids)
    assert twice_and_never(epochs) == (0, 0), [sorted(e.items()) for e in epochs]
