"""`keras: auto` restarts a tf.keras-era script once under tf_keras
(launcher/job/policy/keras_fallback.py): for real with TF's custom-loop tutorial, and
the rule itself over plans and failures."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from launcher.job.policy import keras_fallback
from launcher.job.record.classify import classify_exit
from launcher.job.record.states import Failure
from launcher.spec.config import local_config
from launcher.spec.plan import build_plan
from tests.conftest import SCRIPTS, read_events, read_summary, reported_steps, run_cli
from tests.test_strategies import explain

KERAS3_ERROR = {"type": "AttributeError", "message": "'SparseCategoricalAccuracy' object has "
                "no attribute 'reset_states'. Did you mean: 'reset_state'?", "traceback": ""}


@pytest.mark.e2e
def test_keras_auto_trains_tfs_custom_loop_tutorial_under_tf_keras(workdir: Path):
    run_dir = workdir / "run"
    result = run_cli(["--local", "1", "--max-restarts", "2", "--run-dir", str(run_dir),
                      str(SCRIPTS / "tutorial_ctl_tf_keras.py")], cwd=workdir,
                     TF_USE_LEGACY_KERAS="")
    assert result.returncode == 0, explain(result)
    assert "TRAINED" in result.stdout, explain(result)
    assert "generation 1 runs under tf_keras" in result.stdout, explain(result)
    summary = read_summary(run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 1, summary
    assert summary["keras_switched"]["generation"] == 1, summary
    assert summary["keras_switched"]["to"] == "tf_keras", summary
    assert "reset_states" in summary["keras_switched"]["why"], summary
    switched = [e for e in read_events(run_dir) if e["event"] == "keras_switched"]
    assert len(switched) == 1 and switched[0]["task"] == "host0/worker0", switched
    # A custom loop's `optimizer.apply_gradients`, counted with no runtime call: 2 x 4 steps.
    assert reported_steps(run_dir, generation=1)["worker0"][-1] == 8, read_events(run_dir)
    # The tutorial restores nothing: no resume point is claimed from the counted steps.
    assert summary["resumed"] == [] and "resumed at" not in result.stdout, summary


@pytest.mark.e2e
def test_keras_auto_trains_the_parameter_server_tutorials_functional_model(workdir: Path):
    # Keras 3 refuses `tf.reduce_mean` on a layer's output as the model is built:
    # no known text, but raised inside Keras 3, before a step, by tf.keras code.
    run_dir = workdir / "run"
    result = run_cli(["--local", "1", "--max-restarts", "1", "--run-dir", str(run_dir),
                      str(SCRIPTS / "tutorial_ps_functional.py")], cwd=workdir,
                     TF_USE_LEGACY_KERAS="")
    assert result.returncode == 0, explain(result)
    assert "TRAINED" in result.stdout and "generation 1 runs under tf_keras" in result.stdout
    summary = read_summary(run_dir)
    assert summary["restarts"] == 1 and summary["keras_switched"]["to"] == "tf_keras", summary
    assert "KerasTensor cannot be used" in summary["failures"][0]["error"]["message"], summary


def test_the_rule_beyond_the_texts_keras3_code_before_a_step_in_tf_keras_era_script():
    era = {"type": "ValueError", "message": "something new", "traceback": "",
           "raised_in_keras3": True, "script_uses_tf_keras": True}
    failure = _failure(era)
    assert keras_fallback.should_switch(_plan(), failure)
    assert not keras_fallback.should_switch(_plan(), failure, trained=True)  # it trained
    assert not keras_fallback.should_switch(_plan(keras="keras3"), failure)  # chosen
    for fact in ("raised_in_keras3", "script_uses_tf_keras"):  # either sign missing
        assert not keras_fallback.should_switch(_plan(), _failure(
            {k: v for k, v in era.items() if k != fact}))


def _plan(keras: str = "auto", strategy: str = "multi_worker_mirrored", env=None):
    loaded = local_config(1)
    update = {"keras": keras, "strategy": strategy, **({"env": env} if env else {})}
    loaded = replace(loaded, config=loaded.config.model_copy(update=update))
    return build_plan(loaded, ["train.py"], run_dir="/tmp/run", ports=[23456])


def _failure(error: dict) -> Failure:
    reason = classify_exit(1, None, error, ())
    return Failure(task="host0/worker0", host="host0", generation=0, t=0.0, kind="exit",
                   reason=reason, exit_code=1, error=error)


def test_the_switch_only_for_tf_keras_errors_under_keras_auto():
    failure = _failure(KERAS3_ERROR)
    assert keras_fallback.should_switch(_plan(), failure)
    switched = keras_fallback.under_tf_keras(_plan())
    assert all(t.env["TF_USE_LEGACY_KERAS"] == "1" and t.env["MGPU_KERAS"] == "tf_keras"
               for t in switched.tasks)
    # A job that asked for Keras 3 (by the key or by env) is never switched...
    assert not keras_fallback.should_switch(_plan(keras="keras3"), failure)
    assert not keras_fallback.should_switch(_plan(keras="tf_keras"), failure)
    assert not keras_fallback.should_switch(_plan(env={"TF_USE_LEGACY_KERAS": "0"}), failure)
    # ...nor one that failed of something else.
    other = _failure({"type": "ValueError", "message": "bad shape", "traceback": ""})
    assert not keras_fallback.should_switch(_plan(), other)
    assert not keras_fallback.should_switch(_plan(), None)
