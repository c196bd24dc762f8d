"""Unit tests of the runtime's pure parts: hooks, guards, plain models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from launcher.runtime import guards, hooks, keras_patch, server, strategies


def test_post_import_hook_runs_once_on_first_import(tmp_path: Path, monkeypatch):
    (tmp_path / "mgpu_probe_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hooks.when_imported("mgpu_probe_mod", lambda module: seen.append(module.VALUE))
    import mgpu_probe_mod  # noqa: F401

    assert seen == [1]
    hooks.when_imported("mgpu_probe_mod", lambda module: seen.append("now"))  # already loaded
    assert seen == [1, "now"]
    monkeypatch.delitem(sys.modules, "mgpu_probe_mod")


def test_multi_worker_job_reads_the_task_environment(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("MGPU_NUM_WORKERS", "2")
    monkeypatch.setenv("MGPU_STRATEGY", "multi_worker_mirrored")
    assert keras_patch.multi_worker_job()
    monkeypatch.setenv("MGPU_STRATEGY", "parameter_server")
    assert not keras_patch.multi_worker_job()
    monkeypatch.setenv("MGPU_STRATEGY", "multi_worker_mirrored")
    monkeypatch.setenv("MGPU_NUM_WORKERS", "1")
    assert not keras_patch.multi_worker_job()
    # Started by hand, without the launcher: TF_CONFIG decides.
    monkeypatch.delenv("MGPU_NUM_WORKERS")
    monkeypatch.delenv("MGPU_STRATEGY")
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                                                "task": {"type": "worker", "index": 1}}))
    assert keras_patch.multi_worker_job()
    assert not keras_patch.is_chief()


def test_refusal_names_the_fix_first():
    # The launcher shows the first ~200 characters as the root cause.
    assert "keras: tf_keras" in keras_patch.refusal_message("3.99.0")[:200]
    assert "MultiWorkerMirroredStrategy()" in guards.single_host_strategy_message(
        "MirroredStrategy")[:200]


def test_single_host_strategy_guard(monkeypatch):
    class Mirrored:
        def __init__(self, devices=None):
            self.devices = devices

    module = types.SimpleNamespace(MirroredStrategy=Mirrored)
    guards.on_mirrored(module)
    monkeypatch.setenv("MGPU_TASK_TYPE", "worker")
    monkeypatch.delenv("MGPU_ALLOW_SINGLE_HOST_STRATEGY", raising=False)
    monkeypatch.setenv("MGPU_NUM_WORKERS", "1")
    assert Mirrored(["/cpu:0"]).devices == ["/cpu:0"]  # one worker: fine
    monkeypatch.setenv("MGPU_NUM_WORKERS", "2")
    with pytest.raises(guards.SingleHostStrategyError, match="runtime.strategy()"):
        Mirrored()
    monkeypatch.setenv("MGPU_TASK_TYPE", "evaluator")  # outside the training cluster
    assert Mirrored().devices is None
    monkeypatch.setenv("MGPU_TASK_TYPE", "worker")
    monkeypatch.setenv("MGPU_ALLOW_SINGLE_HOST_STRATEGY", "1")
    assert Mirrored().devices is None


def test_heartbeat_setting(monkeypatch):
    for raw, expected in (("3", 3.0), ("0.5", 0.5), ("", None), ("0", None), ("x", None)):
        monkeypatch.setenv("MGPU_TF_HEARTBEAT_S", raw)
        assert guards.heartbeat_s() == expected


def test_cpu_devices_wanted(monkeypatch):
    monkeypatch.delenv("MGPU_CPU_DEVICES", raising=False)
    assert strategies.cpu_devices_wanted(None) == 1
    monkeypatch.setenv("MGPU_CPU_DEVICES", "4")
    assert strategies.cpu_devices_wanted(None) == 4
    assert strategies.cpu_devices_wanted(2) == 2
    with pytest.raises(ValueError):
        strategies.cpu_devices_wanted(0)


def test_server_refuses_a_task_outside_the_cluster(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"ps": ["a:1"]},
                                                "task": {"type": "evaluator", "index": 0}}))
    with pytest.raises(SystemExit, match="not in TF_CONFIG's cluster"):
        server.task_from_env()


def test_save_model_saves_the_template_not_the_parallel_wrapper(tmp_path: Path, monkeypatch):
    """The multi_gpu_model mistake: a wrapper saved and reloaded nests the model."""
    import keras

    from launcher import runtime

    monkeypatch.delenv("TF_CONFIG", raising=False)
    template = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d1"),
                                 keras.layers.Dense(1, name="d2")], name="template")
    # What multi_gpu_model(template, gpus=2) built: slice, call per slice, concatenate.
    inputs = keras.Input((4,))
    halves = [keras.layers.Lambda(lambda x, i=i: x[i::2], output_shape=(4,))(inputs)
              for i in range(2)]
    wrapper = keras.Model(inputs, keras.layers.Concatenate(axis=0)(
        [template(half) for half in halves]), name="parallel")
    assert runtime.plain_model(wrapper) is template
    assert runtime.plain_model(template) is template

    path = tmp_path / "out" / "model.keras"
    assert runtime.save_model(wrapper, str(path)) == str(path)
    reloaded = keras.saving.load_model(path)
    assert [layer.name for layer in reloaded.layers] == ["d1", "d2"]
    assert not any(hasattr(layer, "layers") for layer in reloaded.layers)  # nothing nested


def test_the_bootstrap_watches_what_each_runtime_module_hooks():
    # The bootstrap registers the hooks by the module names they watch and
    # imports a runtime module only when one of them is (hooks.Deferred).
    import importlib

    from launcher import bootstrap
    from launcher.runtime import steps
    from launcher.strategy import Strategy

    for source, watched in bootstrap.WATCHED.items():
        module = importlib.import_module(f"launcher.runtime.{source}")
        assert tuple(module.HOOKS) == watched, source
    assert bootstrap.WATCHED["guards"][2] == guards.COLLECTIVE
    assert bootstrap._KERAS_DISTRIBUTION == Strategy.KERAS_DISTRIBUTION
    assert steps.EVERY_S_DEFAULT > 0  # _counting_steps' shortcut


def test_a_deferred_hook_runs_the_real_one_and_only_warns_when_it_breaks(capfd):
    seen = []
    module = types.ModuleType("mgpu_probe_deferred")
    module.HOOKS = {"x": lambda watched: seen.append(watched.__name__)}
    sys.modules["mgpu_probe_deferred"] = module
    try:
        hooks._run_all([hooks.Deferred("mgpu_probe_deferred", "x")])(module)
        hooks._run_all([hooks.Deferred("mgpu_probe_deferred", "missing")])(module)
    finally:
        del sys.modules["mgpu_probe_deferred"]
    assert seen == ["mgpu_probe_deferred"]
    assert "mgpu_probe_deferred.HOOKS['missing'] skipped" in capfd.readouterr().err


def test_a_task_that_imports_neither_tensorflow_nor_keras_loads_no_hook_module(tmp_path):
    # Every task starts through the bootstrap, once per host on a fan-out: a
    # plain script pays for none of the runtime's hook modules, and loading the
    # step counter still wires it to the saves and restores (whoever loads it).
    script = tmp_path / "plain.py"
    script.write_text(
        "import sys\n"
        "hooked = ('keras_compat', 'keras_jax', 'guards', 'steps', 'saves', 'restores',\n"
        "          'position', 'calls', 'memtier')\n"
        "print(sorted(m for m in hooked if 'launcher.runtime.' + m in sys.modules))\n"
        "print(sorted(m for m in ('typing', 'pkgutil', 'json', 'signal', 'launcher.strategy')\n"
        "             if m in sys.modules))\n"
        "from launcher.runtime import restores, saves, steps\n"
        "print(steps.saves_pending is saves.pending, steps.first_epoch is restores.first_epoch)\n")
    read, write = os.pipe()
    repo = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": repo, "MGPU_PROGRESS_FD": str(write),
           "TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                                    "task": {"type": "worker", "index": 1}})}
    out = subprocess.run([sys.executable, "-m", "launcher.bootstrap", str(script)], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         pass_fds=(write,))
    os.close(write)
    os.close(read)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "[]", "True True"]


# Read in the module teardown, after every exit handler (the bootstrap's last).
FROZEN_AT_TEARDOWN = """\
import gc, json, os, sys, types
if sys.argv[1:] == ["tf"]:
    sys.modules["tensorflow"] = types.ModuleType("tensorflow")  # a stand-in: loaded

class Probe:
    def __del__(self, write=os.write, frozen=gc.get_freeze_count):
        write(1, b"frozen %d\\n" % (frozen() > 0))

class Cycle:
    def __del__(self, write=os.write):
        write(1, b"cycle finalized\\n")

json._probe = Probe()  # freed with the json module, by its count
gc.disable()  # no collection of its own: the garbage below is the end's to collect
cycle = Cycle()
cycle.me = cycle
del cycle
"""


@pytest.mark.parametrize("loaded", ["tf", "plain"])
def test_a_clean_end_with_tensorflow_loaded_leaves_the_teardown_no_collections(
        tmp_path, loaded):
    # The teardown's collections over TensorFlow's objects are 1-3 s of a task's
    # exit: once the program is over they are collected once and frozen; a plain
    # script's are not. The garbage there was is finalized, and what the
    # teardown frees by reference counts still runs its __del__.
    script = tmp_path / "end.py"
    script.write_text(FROZEN_AT_TEARDOWN)
    read, write = os.pipe()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
           "MGPU_PROGRESS_FD": str(write)}
    out = subprocess.run([sys.executable, "-m", "launcher.bootstrap", str(script), loaded],
                         env=env, cwd=tmp_path, capture_output=True, timeout=60,
                         pass_fds=(write,))
    os.close(write)
    with os.fdopen(read, "rb") as said:
        told = said.read()
    assert out.returncode == 0, out.stderr
    assert b'{"over": 1}' in told, told
    assert sorted(out.stdout.decode().splitlines()) == [
        "cycle finalized", f"frozen {int(loaded == 'tf')}"], out


# A save (position's save phase, as Keras' save_weights gets it) that a SIGTERM
# hits halfway: it ends, then the task dies by that SIGTERM. Before the save,
# and with no save open, a SIGTERM ends it at once.
SAVE_HIT_BY_SIGTERM = """
import os, signal, sys
from launcher.runtime import guards, position
guards.give_sigterm_back()

class Model:
    def save_weights(self, path):
        os.kill(os.getpid(), signal.SIGTERM)  # a stop, halfway through the file
        with open(path, "w") as f:
            f.write("whole")

position.keep_phase(Model, "save_weights", position.SAVE, None)
Model().save_weights(sys.argv[1])
print("after the save", flush=True)
"""


def test_a_sigterm_during_a_save_ends_the_task_at_the_saves_end(tmp_path: Path):
    saved = tmp_path / "latest.weights.h5"
    run = subprocess.run([sys.executable, "-c", SAVE_HIT_BY_SIGTERM, str(saved)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert run.returncode == -15, (run.returncode, run.stderr)  # by the SIGTERM itself
    assert saved.read_text() == "whole"  # the file written to its end
    assert "after the save" not in run.stdout  # and not one step further
    at_once = subprocess.run(
        [sys.executable, "-c", "import os, signal, time\n"
         "from launcher.runtime import guards\nguards.give_sigterm_back()\n"
         "guards.hold_sigterm(); guards.release_sigterm()\n"
         "os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)"],
        capture_output=True, text=True, timeout=20,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert at_once.returncode == -15, at_once.stderr
