"""Every sample of every epoch reaches the final weights once across a resume
in the middle of an epoch on FEWER workers than the save was made with
(issue #51): two simulated local hosts, `restart: {on_host_loss: shrink}`,
tf_keras `fit` (and Keras 3's on TensorFlow) with its own
`BackupAndRestore(save_freq=3)` over the seeded reshuffled dataset of
tests/scripts/exact_epochs.py; host1 is lost (its agent killed) in the
middle of epoch 1, after the save at step 12, so generation 1 runs on host0
alone. The seeded dataset is auto-sharded by DATA: MultiWorkerMirroredStrategy
splits each global batch among the workers, so the batches and their order
are the same on two workers or one, and the position carries as is. (Over
TFRecord files, sharded by FILE, it does not: the same ids in 4 TFRecord
files gave 19 samples twice and 19 never under tf_keras, 17 and 17 under
Keras 3; docs/fault-tolerance.md, "What exactly once does not cover".)

Counted per sample, as a user would: a step is one global batch of 8 (the
dataset is batched by 8 before MultiWorkerMirroredStrategy splits it, so an
epoch is 8 steps on two workers and on one); for each step, the ids that
every worker of the last generation that trained it recorded (a step
trained again after the restart was rolled back with the save it came
after; a worker gone with its host trained nothing of the steps after it).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, read_summary, wait_for
from tests.test_exact_epochs import EPOCHS, SAMPLES, STEPS, twice_and_never
from tests.test_faults import jobs, launch  # noqa: F401 - `jobs` is a fixture

pytestmark = pytest.mark.e2e

SCRIPT = str(SCRIPTS / "exact_epochs.py")
SHRINK_CLUSTER = ("name: shrink\ntransport: local\nports: {base: auto}\n"
                  "restart: {on_host_loss: shrink, min_workers: 1, backoff_s: 0, "
                  "warm_standby: 'off'}\n"
                  "hosts:\n" + "".join(f"  - {{address: 127.0.0.1, name: host{i}}}\n"
                                       for i in range(2)))
HOLD = 14  # worker 1 stops after step 14 (epoch 1: steps 9-16; the newest save at 12)


def trained_per_epoch(ids_dir: Path, resumed: dict[int, int]) -> list[Counter]:
    """The ids of the steps whose updates reached the final weights, per
    epoch: each step's ids from every worker of the generation that trained
    it last (the worker count may differ between generations), unless a later
    generation resumed from a save before it (`resumed`: generation -> the
    step of the save it resumed from)."""
    steps: dict[int, dict[int, list[int]]] = {}  # step: {generation: ids of all its workers}
    for path in ids_dir.glob("g*-w*.jsonl"):
        generation, _worker = (int(part[1:]) for part in path.stem.split("-"))
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if all(record["step"] <= at for later, at in resumed.items() if later > generation):
                steps.setdefault(record["step"], {}).setdefault(generation, []).extend(
                    record["ids"])
    epochs = [Counter() for _ in range(EPOCHS)]
    for step, by_generation in steps.items():
        epochs[(step - 1) // STEPS].update(by_generation[max(by_generation)])
    return epochs


def recorded(path: Path, step: int) -> bool:
    return path.exists() and any(json.loads(line)["step"] == step
                                 for line in path.read_text().splitlines())


# (input, the step it resumes at, trained twice and never)
SHAPES = {
    # the seeded reshuffled dataset: auto-sharded by DATA, each global batch split among
    # the workers, so the 4 global batches dropped at the resume are the ones trained
    "seeded": ("seeded", 12, (0, 0)),
    "keras3": ("seeded", 12, (0, 0)),  # Keras 3's fit on TensorFlow (runtime/epochinput3.py)
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_resume_on_fewer_workers_trains_every_sample_once(
        workdir, jobs, monkeypatch, shape):  # noqa: F811
    given, resume, counts = SHAPES[shape]
    monkeypatch.setenv("HOLD_AT_STEP", str(HOLD))
    monkeypatch.setenv("SAVE_FREQ", "3")
    monkeypatch.delenv("KILL_AT_STEP", raising=False)
    monkeypatch.setenv("INPUT", given)
    monkeypatch.setenv("KERAS", "3" if shape.startswith("keras3") else "")
    ids = workdir / "ids"
    ids.mkdir()
    (workdir / "shrink.yaml").write_text(SHRINK_CLUSTER)
    job = launch(jobs, [str(workdir / "shrink.yaml"), "--no-live", SCRIPT,
                        str(workdir / "backup"), str(ids)], workdir)
    # Worker 1 records step 14 and then holds (its save at step 12 done before).
    wait_for(lambda: recorded(ids / "g0-w1.jsonl", HOLD), timeout=240,
             what=f"worker 1 past step {HOLD}")
    job.agent("host1").kill()  # the whole simulated host: its task dies with its agent
    assert job.finish(timeout=240) == 0, job.output[-3000:]
    summary = read_summary(job.run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 1, summary["failures"]
    assert summary["failures"][0]["kind"] == "host_lost"
    relaunch = job.events("launch", generation=1)[0]
    assert [t["host"] for t in relaunch["tasks"]] == ["host0"]
    assert summary["resumed"][0]["step"] == resume, summary["resumed"]
    epochs = trained_per_epoch(ids, {r["generation"]: r["saved_step"]
                                     for r in summary["resumed"]})
    shown = [sorted(e.items()) for e in epochs]
    assert twice_and_never(epochs) == counts, shown
    assert [len(set(epoch)) for epoch in epochs] == [SAMPLES, SAMPLES - counts[1], SAMPLES], shown
    job.assert_nothing_left()
