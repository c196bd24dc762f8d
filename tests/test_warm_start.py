"""Warm starts (launcher.standby): a real agent hands a task to a standby
interpreter that has imported TensorFlow, and the script cannot tell.

One agent (module scope) runs a probe script cold (its first start) and warm
(the next start, taken by the standby the agent kept), and the two views are
compared: argv, __file__, __name__, cwd, sys.path[0], environment, priority,
exit code, an uncaught exception's report. A script that sets a variable read
at import gets a cold start and says why; a standby dies with its agent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher import bootstrap, standby
from launcher.agent.standbys import Standbys
from launcher.spec.config import ClusterConfig
from tests.agentproc import AgentProc, agent_env
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parent.parent
# The bootstrap spawned the standby; the task's own per-start values differ.
PER_START_VALUES = {"MGPU_TASK_TOKEN", "MGPU_PROGRESS_FD", "MGPU_ERROR_FILE", "MGPU_STACKS_FILE",
                    "MGPU_GENERATION"}

PROBE = '''\
import json, os, sys
tf_context = None
if "tensorflow" in sys.modules:  # a warm start: imported by the standby, no context yet
    from tensorflow.python.eager import context
    tf_context = context._context is not None and context._context._context_handle is not None
with open("/proc/self/autogroup") as handle:
    group_nice = handle.read().split()[-1]
view = {"argv": sys.argv, "file": __file__, "name": __name__, "cwd": os.getcwd(),
        "path0": sys.path[0], "env": dict(os.environ), "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "group_nice": group_nice, "stdin": sys.stdin.read(),
        "tf": "tensorflow" in sys.modules, "tf_context": tf_context}
print("VIEW " + json.dumps(view), flush=True)
if sys.argv[1] == "raise":
    def inner():
        raise ValueError("boom from the probe")
    inner()
sys.exit(int(sys.argv[1]))
'''

# The digits example's way to pick tf_keras: a default taken before TensorFlow's import.
DEFAULT_KERAS = '''\
"""Picks tf_keras unless the environment says otherwise."""
import json, os, sys
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf
print("VIEW " + json.dumps({"dense": tf.keras.layers.Dense.__module__,
                            "legacy": os.environ.get("TF_USE_LEGACY_KERAS")}), flush=True)
sys.exit(3)  # a failure: the agent starts this task's standby at once
'''

# Dies of an exception with TensorFlow loaded: the bootstrap's quick exit must
# still do what the interpreter's exit does for the script.
FAILS_LATE = '''\
import atexit, sys, threading, time
import tensorflow as tf
log = open("fails_late.out", "w")  # never closed: its buffer must reach the disk
log.write("written before the failure\\n")
writer = tf.summary.create_file_writer("events", flush_millis=600_000)  # never flushed
with writer.as_default():
    tf.summary.scalar("loss", 0.5, step=1)
atexit.register(lambda: print("atexit ran", flush=True))
worker = threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", flush=True)))
worker.start()
raise RuntimeError("late failure with " + tf.__name__)
'''


def test_a_keras_on_jax_task_gets_no_standby(tmp_path: Path):
    """The agent's standbys compare the task's MGPU_STRATEGY with the strategies'
    table (launcher/strategy.py): Keras on JAX has no TensorFlow to import ahead."""
    standbys = Standbys(None, None, None, None)
    argv = [sys.executable, "-m", "launcher.bootstrap", "absent.py"]

    def problem(strategy: str) -> str:
        spec = {"standby": "auto", "argv": argv, "cwd": str(tmp_path),
                "env": {"MGPU_STRATEGY": strategy}}
        return standbys.problem("worker0", spec, {})

    assert problem("keras_distribution") == "Keras on JAX: no TensorFlow to import ahead"
    assert problem("multi_worker_mirrored") == ""  # an absent script fails warm or cold alike


def test_the_import_time_rule_and_the_script_check(tmp_path):
    base = {"PATH": "/bin", "TF_CPP_MIN_LOG_LEVEL": "2", "MGPU_GENERATION": "0"}
    assert standby.start_env_differences(base, {**base, "MGPU_GENERATION": "1",
                                                "TF_CONFIG": "{}"}) == []
    assert standby.start_env_differences(base, {**base, "CUDA_VISIBLE_DEVICES": "1",
                                                "TF_CPP_MIN_LOG_LEVEL": "0"}) == [
        "CUDA_VISIBLE_DEVICES", "TF_CPP_MIN_LOG_LEVEL"]
    python = sys.executable
    assert standby.standby_argv([python, "-u", "-m", "launcher.bootstrap", "t.py", "x"]) == [
        python, "-u", "-m", "launcher.bootstrap", "--standby"]
    assert standby.standby_argv([python, "-m", "launcher.runtime.server"]) is None
    assert bootstrap.STANDBY_FLAG == standby.FLAG
    for text, setting in (("off", "off"), ("auto", "auto"), ('"off"', "off")):  # YAML: off is False
        config = yaml.safe_load(f"hosts: [{{address: a}}]\nrestart: {{warm_standby: {text}}}")
        assert ClusterConfig.model_validate(config).restart.warm_standby == setting
    assert ClusterConfig.model_validate({"hosts": [{"address": "a"}]}).restart.warm_standby \
        == "auto"

    def problem(source: str, env: dict[str, str]) -> str:
        script = tmp_path / "s.py"
        script.write_text(source)
        return standby.env_write_problem(str(script), standby.script_env_writes(str(script)),
                                         env)

    env = {"TF_USE_LEGACY_KERAS": "1"}
    assert problem("import os\nos.environ.setdefault('TF_USE_LEGACY_KERAS', '1')\n", env) == ""
    assert problem("import os\nos.environ['TF_USE_LEGACY_KERAS'] = '1'\n", env) == ""
    assert problem("import os\nos.environ['TF_CONFIG'] = '{}'\n", env) == ""
    assert "TF_USE_LEGACY_KERAS itself (line 2)" in problem(
        "import os\nos.environ.setdefault('TF_USE_LEGACY_KERAS', '1')\n", {})
    assert "CUDA_VISIBLE_DEVICES" in problem(
        "import os\ndef main():\n    os.environ.update(CUDA_VISIBLE_DEVICES='0')\n", env)
    assert "computes" in problem("import os\nfor k in 'AB':\n    os.environ[k] = '1'\n", env)
    assert "LD_PRELOAD" in problem("from os import putenv\nputenv('LD_PRELOAD', 'x')\n", env)
    assert "LD_PRELOAD" in problem("import os as o\no.unsetenv('LD_PRELOAD')\n", env)
    # A script that names nothing of the environment is not parsed (its first start
    # is ~3 ms cheaper); one whose non-ASCII name folds into `environ` still is.
    assert problem("print('hello')\n", {}) == ""
    assert "CUDA_VISIBLE_DEVICES" in problem(
        "import os\nos.\uff45nviron['CUDA_VISIBLE_DEVICES'] = '0'\n", env)

    # Leading defaults: taken ahead by the standby, so such a script stays warm.
    def presets(source: str) -> list:
        script = tmp_path / "p.py"
        script.write_text(source)
        return [p[:3] for p in standby.leading_presets(str(script))]

    digits_like = '"""Doc."""\nimport argparse\nimport os\n' \
        'os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")\nimport numpy\n' \
        'os.environ.setdefault("KERAS_HOME", "/k")\n'
    assert presets(digits_like) == [("TF_USE_LEGACY_KERAS", "1", "setdefault")]
    script = str(tmp_path / "p.py")
    found = standby.with_presets({}, standby.leading_presets(script))
    assert found == {"TF_USE_LEGACY_KERAS": "1"}
    assert standby.env_write_problem(script, standby.script_env_writes(script), found) != ""
    assert standby.with_presets({"TF_USE_LEGACY_KERAS": "0"}, standby.leading_presets(script)) \
        == {"TF_USE_LEGACY_KERAS": "0"}  # the environment's value wins, as in the script
    # Not ahead: after a third-party import, an explicit assignment, a name read at
    # process start.
    assert presets("import numpy\nimport os\nos.environ.setdefault('A', '1')\n") == []
    assert presets("import os\nos.environ['KERAS_BACKEND'] = 'jax'\n") == []
    assert presets("import os\nos.environ.setdefault('PYTHONHASHSEED', '0')\n") == []
    assert presets("import os\nos.environ.setdefault('A', str(1))\n") == []


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    root = tmp_path_factory.mktemp("warm")
    (root / "probe.py").write_text(PROBE)
    (root / "default_keras.py").write_text(DEFAULT_KERAS)
    (root / "fails_late.py").write_text(FAILS_LATE)
    for name in ("CUDA_VISIBLE_DEVICES", "KERAS_BACKEND"):
        (root / f"sets_{name}.py").write_text(
            f"import os\nos.environ[{name!r}] = 'x'\nprint('ran', flush=True)\n")
    proc = AgentProc(root / "run", eof_grace_s=1.0)
    proc.hello()
    yield proc
    proc.close()


def run(agent: AgentProc, task: str, generation: int, script: str, *args: str) -> dict:
    """Start `script` as `task`, wait for its exit; its started and exited events."""
    agent.send({"op": "start", "task": task, "generation": generation, "standby": "auto",
                "argv": [sys.executable, "-m", "launcher.bootstrap", script, *args],
                "cwd": str(agent.run_dir.parent), "tf_config": '{"cluster": {}}',
                "env": {"TF_CPP_MIN_LOG_LEVEL": "2", "MGPU_GENERATION": str(generation)}})
    started = agent.wait_event("started", task=task, generation=generation)
    exited = agent.wait_event("exited", task=task, generation=generation, timeout=120)
    views = [json.loads(line[5:]) for line in agent.output(task) if line.startswith("VIEW ")]
    return {"started": started, "exited": exited, "view": views[-1] if views else None}


def ready_standbys(agent: AgentProc, task: str) -> int:
    """How many standbys of `task` have said they are ready (TensorFlow imported)."""
    return len([m for m in agent.events("log")
                if m.get("text", "").startswith(f"standby of {task} ready")])


def standby_ready(agent: AgentProc, task: str, count: int = 1) -> None:
    wait_for(lambda: ready_standbys(agent, task) >= count, timeout=120,
             what=f"standby {count} of {task} ready")


def comparable(view: dict) -> dict:
    view = dict(view)
    view["env"] = {k: v for k, v in view["env"].items() if k not in PER_START_VALUES}
    for key in ("tf", "tf_context"):
        view.pop(key)
    return view


def test_a_script_sees_the_same_under_a_cold_and_a_warm_start(agent):
    cold = run(agent, "worker0", 0, "probe.py", "3")
    standby_ready(agent, "worker0")
    warm = run(agent, "worker0", 1, "probe.py", "3")
    assert cold["started"]["start"] == "cold"
    assert "no standby yet" in cold["started"]["start_reason"]
    assert warm["started"]["start"] == "warm", warm["started"]
    assert warm["view"]["tf"] and warm["view"]["tf_context"] is False  # no device touched
    assert not cold["view"]["tf"]
    assert comparable(warm["view"]) == comparable(cold["view"])
    assert warm["view"]["argv"][0].endswith("probe.py") and warm["view"]["name"] == "__main__"
    assert warm["view"]["env"]["MGPU_GENERATION"] == "1"
    assert cold["exited"]["code"] == warm["exited"]["code"] == 3


def test_an_uncaught_exception_is_reported_the_same_way(agent):
    cold = run(agent, "worker1", 0, "probe.py", "raise")
    standby_ready(agent, "worker1")
    warm = run(agent, "worker1", 1, "probe.py", "raise")
    assert (cold["started"]["start"], warm["started"]["start"]) == ("cold", "warm")
    assert cold["exited"]["code"] == warm["exited"]["code"] == 1
    assert cold["exited"]["error"] == warm["exited"]["error"]
    assert cold["exited"]["error"]["type"] == "ValueError"
    assert "in inner" in warm["exited"]["error"]["traceback"]
    tails = [[line for line in r["exited"]["tail"]  # the traceback's lines of the script
              if line.startswith(("  File \"probe.py\"", "ValueError"))] for r in (cold, warm)]
    assert len(tails[1]) == 3 and tails[1][-1] == "ValueError: boom from the probe"
    assert tails[0] == tails[1]


def test_a_leading_default_is_taken_ahead_and_the_start_is_warm(agent):
    cold = run(agent, "worker2", 0, "default_keras.py")
    standby_ready(agent, "worker2")
    warm = run(agent, "worker2", 1, "default_keras.py")
    assert (cold["started"]["start"], warm["started"]["start"]) == ("cold", "warm"), warm
    assert cold["view"] == warm["view"]  # the same Keras, the same environment value
    assert warm["view"]["dense"].startswith("tf_keras.") and warm["view"]["legacy"] == "1"
    assert cold["exited"]["code"] == warm["exited"]["code"] == 3


def test_a_start_is_cold_at_once_when_its_standby_is_still_importing(agent):
    # worker3 fails at once: its standby is started then, and the next start
    # comes before TensorFlow is imported in it. That start must not wait for it.
    run(agent, "worker3", 0, "probe.py", "3")
    early = run(agent, "worker3", 1, "probe.py", "3")
    assert early["started"]["start"] == "cold", early["started"]
    assert "standby was not ready" in early["started"]["start_reason"]
    assert not early["view"]["tf"]  # a fresh interpreter, not the importing standby
    standby_ready(agent, "worker3", ready_standbys(agent, "worker3") + 1)  # started after it
    late = run(agent, "worker3", 2, "probe.py", "3")
    assert late["started"]["start"] == "warm", late["started"]
    assert late["view"]["tf"]


def test_a_failed_task_exits_quickly_and_loses_nothing(agent):
    result = run(agent, "ps0", 0, "fails_late.py")
    assert result["exited"]["code"] == 1
    assert result["exited"]["error"]["type"] == "RuntimeError"
    tail = result["exited"]["tail"]
    assert "RuntimeError: late failure with tensorflow" in tail, tail
    # As at a normal exit: non-daemon threads joined, then atexit, open files flushed.
    assert tail.index("thread done") < tail.index("atexit ran"), tail
    out = agent.run_dir.parent / "fails_late.out"
    assert out.read_text() == "written before the failure\n"
    # The summary writer's buffered event reached its file, as at a normal exit.
    from tensorflow.core.util import event_pb2  # noqa: PLC0415 - only this test needs TF here

    (events_file,) = (agent.run_dir.parent / "events").glob("events.out.tfevents.*")
    tags = [value.tag for record in _tf_records(events_file.read_bytes())
            for value in event_pb2.Event.FromString(record).summary.value]
    assert tags == ["loss"], tags


@pytest.mark.parametrize("name", ["CUDA_VISIBLE_DEVICES", "KERAS_BACKEND"])
def test_a_script_that_sets_an_import_time_variable_starts_cold(agent, name):
    task = "chief0" if name == "CUDA_VISIBLE_DEVICES" else "evaluator0"
    for generation in (0, 1):
        result = run(agent, task, generation, f"sets_{name}.py")
        assert result["started"]["start"] == "cold"
        assert f"sets {name} itself (line 2)" in result["started"]["start_reason"]
        assert result["exited"]["code"] == 0
    # ...and no standby is kept for it: only tasks and standbys of other tasks are recorded.
    records = [json.loads(p.read_text()) for p in (agent.run_dir / "pids").glob("*.json")]
    assert task not in {r["task"] for r in records}


def test_the_cli_records_a_cold_start_and_why_in_events_and_summary(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os\nos.environ['KERAS_BACKEND'] = 'jax'\nprint('done')\n")
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "--local", "1", "--quiet", "--run-dir", str(run_dir),
         str(script)], cwd=tmp_path, env=agent_env(), capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    started = [e for e in events if e["event"] == "task_started"]
    assert [e["start"] for e in started] == ["cold"]
    assert "sets KERAS_BACKEND itself" in started[0]["start_reason"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [t["start"] for t in summary["tasks"].values()] == ["cold"]


def test_a_standby_dies_with_its_agent(tmp_path):
    (tmp_path / "quick.py").write_text("raise SystemExit(1)\n")  # a failure: a standby follows
    agent = AgentProc(tmp_path / "run")
    try:
        agent.hello()
        run(agent, "worker0", 0, "quick.py")
        pids = tmp_path / "run" / "pids"
        records = wait_for(lambda: [json.loads(p.read_text()) for p in pids.glob("*.json")],
                           timeout=20, what="the standby's pid record")
        assert [(r["task"], r["generation"]) for r in records] == [("worker0", None)]
        standby_pid = records[0]["pid"]
        assert _alive(standby_pid)
        os.kill(agent.proc.pid, signal.SIGKILL)
        wait_for(lambda: not _alive(standby_pid), timeout=10,
                 what=f"the standby {standby_pid} to die with its agent")
    finally:
        agent.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def _tf_records(data: bytes) -> list[bytes]:
    """The records of a TFRecord file: length (8 bytes), its CRC (4), data, CRC (4)."""
    records, at = [], 0
    while at + 12 <= len(data):
        length = int.from_bytes(data[at:at + 8], "little")
        records.append(data[at + 12:at + 12 + length])
        at += 12 + length + 4
    return records
