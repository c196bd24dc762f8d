"""What counts as progress on disk: checkpoint series that move, not file times."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.job.detect.checkpoints import advanced, checkpoint_state


def test_tensorflow_and_keras3_checkpoints_are_read_and_other_files_ignored(tmp_path: Path):
    (tmp_path / "backup" / "chief").mkdir(parents=True)
    (tmp_path / "backup" / "chief" / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-7"\nall_model_checkpoint_paths: "ckpt-7"\n')
    (tmp_path / "k3").mkdir()
    (tmp_path / "k3" / "training_metadata.json").write_text(json.dumps({"epoch": 3, "batch": 0}))
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "events.out.tfevents.1").write_text("x")
    state = checkpoint_state(tmp_path)
    assert state == {"backup/chief/checkpoint": (7,), "k3/training_metadata.json": (3, 0)}


def test_advanced_means_a_series_moved_forward_or_appeared():
    before = {"a/checkpoint": (3,)}
    assert not advanced(before, {"a/checkpoint": (3,)})
    assert advanced(before, {"a/checkpoint": (4,)})
    assert advanced(before, {"a/checkpoint": (3,), "b/training_metadata.json": (0, 5)})
    assert not advanced(before, None) and not advanced(None, {})
    assert advanced(None, {"a/checkpoint": (1,)})


def test_an_invisible_directory_has_no_state(tmp_path: Path):
    assert checkpoint_state(tmp_path / "missing") is None


def test_hidden_folders_are_scratch_not_checkpoints(tmp_path: Path):
    scratch = tmp_path / "backup" / ".mgpu-saving-123"
    scratch.mkdir(parents=True)
    (scratch / "training_metadata.json").write_text(json.dumps({"epoch": 9, "batch": 0}))
    assert checkpoint_state(tmp_path) == {}


def test_a_workers_temporary_save_is_not_the_checkpoint(tmp_path: Path):
    """tf_keras under MultiWorkerMirroredStrategy: a worker other than the chief
    saves its copy into `workertemp_<i>` beside the chief's and deletes it right
    after. Seen mid-save, it is not the job's checkpoint moving: nobody resumes
    from it, and the chief may still be writing (restart.on_straggler: replace
    would end the generation then, and the restart resume from the save before)."""
    chief = tmp_path / "backup" / "chief"
    (chief / "workertemp_1").mkdir(parents=True)
    (chief / "checkpoint").write_text('model_checkpoint_path: "ckpt-2"\n')
    (chief / "workertemp_1" / "checkpoint").write_text('model_checkpoint_path: "ckpt-3"\n')
    before = {"backup/chief/checkpoint": (2,)}
    assert checkpoint_state(tmp_path) == before
    assert not advanced(before, checkpoint_state(tmp_path))
