"""Wall time of a 2-worker job under mgpu-launch vs. the same job started by hand.

Runs them side by side, alternating, ROUNDS times each, and prints the
medians and their ratios: by hand, mgpu-launch with warm standbys
(`restart.warm_standby: auto`, the default) and without (`off`). Target:
launcher with standbys / by hand <= 1.0 (a standby costs the job CPU when it
imports TensorFlow beside the training tasks). "By hand" is what a user would
do without the launcher: two `python train.py` processes, each with its own
TF_CONFIG, and wait for both. The launcher runs the same 2 simulated hosts as
`--local 2`, from a cluster file that sets `restart.warm_standby`.

    python bench/overhead.py [--rounds 3] [--epochs 3] [--standby auto,off]

`--steps` measures instead what counting steps with no code costs
(`runtime.steps`: the optimizer's counter read by a thread every
`MGPU_STEPS_EVERY_S`): one task process, started as the agent starts it
(`python -m launcher.bootstrap`, a progress pipe), trains a Keras `fit` of
`--steps-count` steps with counting off (`0`), at the default (2 s) and at
0.05 s (40 times as often, to make any cost visible), alternating, and prints
the median steps/s of each and the ratios to "off". Target: default / off
within noise (>= 0.98). The `fit` keeps a `BackupAndRestore` saving every 100
steps: "off" still has the save and restore hooks (runtime/saves.py,
restores.py), "no hooks" runs without a progress channel, as by hand; their
ratio is the hooks' cost (target: within noise).

    python bench/overhead.py --steps [--rounds 5] [--steps-count 3000] [--jax]

`--jax` runs the same `fit` on Keras 3 with the JAX backend, whose counter is
read from the trainer's state during an epoch (needs the [jax] extra).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from launcher.transport.ports import free_ports  # noqa: E402  (the launcher's own picker)

SCRIPT = REPO / "examples" / "digits" / "train.py"


def base_env(workdir: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["TF_USE_LEGACY_KERAS"] = "1"
    env["MGPU_CHECKPOINT_DIR"] = os.path.join(workdir, "ckpt-by-hand")
    return env


def by_hand(epochs: int, workdir: str) -> float:
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    start = time.perf_counter()
    procs = []
    for index in range(2):
        env = base_env(workdir)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster,
                                       "task": {"type": "worker", "index": index}})
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), "--epochs", str(epochs)],
                                      env=env, cwd=workdir, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - start
    if codes != [0, 0]:
        raise SystemExit(f"by-hand run failed: exit codes {codes}")
    return elapsed


CLUSTER = """\
name: overhead-bench
transport: local
hosts: [{{address: 127.0.0.1, name: host0}}, {{address: 127.0.0.1, name: host1}}]
restart: {{warm_standby: {standby}}}
"""


def under_launcher(epochs: int, workdir: str, round_no: int, standby: str) -> float:
    env = base_env(workdir)
    del env["MGPU_CHECKPOINT_DIR"]
    config = os.path.join(workdir, f"{standby}.yaml")
    with open(config, "w") as handle:
        handle.write(CLUSTER.format(standby=standby))
    start = time.perf_counter()
    code = subprocess.call(
        [sys.executable, "-m", "launcher", "--quiet",
         "--run-dir", os.path.join(workdir, f"run{round_no}-{standby}"), config, str(SCRIPT),
         "--epochs", str(epochs)],
        env=env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"launcher run failed: exit code {code}")
    return elapsed


STEPS_SCRIPT = """\
import os, sys, time
import numpy as np
import tensorflow as tf
steps = int(sys.argv[1])
x = np.random.default_rng(0).normal(size=(4096, 32)).astype("float32")
y = (x.sum(axis=1) > 0).astype("float32")
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64)
model = tf.keras.Sequential([tf.keras.layers.Input((32,)),
                             tf.keras.layers.Dense(64, activation="relu"),
                             tf.keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
model.fit(data, epochs=1, steps_per_epoch=20, verbose=0)  # build, trace, warm up
# A backup every 100 steps, restored at the start: the save and restore hooks at work.
backup = tf.keras.callbacks.BackupAndRestore(backup_dir=os.path.join(os.getcwd(), "backup"),
                                             save_freq=100)
begin = time.perf_counter()
model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[backup])
print("STEPS_PER_S", steps / (time.perf_counter() - begin), flush=True)
"""

JAX_STEPS_SCRIPT = """\
import os, sys, time
os.environ["KERAS_BACKEND"] = "jax"
import keras
import numpy as np
steps = int(sys.argv[1])
x = np.random.default_rng(0).normal(size=(64 * steps, 32)).astype("float32")
y = (x.sum(axis=1) > 0).astype("float32")
model = keras.Sequential([keras.layers.Input((32,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
model.fit(x[:64 * 20], y[:64 * 20], batch_size=64, epochs=1, verbose=0)  # build, trace, warm up
begin = time.perf_counter()
model.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False)
print("STEPS_PER_S", steps / (time.perf_counter() - begin), flush=True)
"""


def steps_per_s(workdir: str, every_s: str | None, count: int, use_jax: bool = False) -> float:
    """One task's training throughput with the step counter read every `every_s`."""
    script = os.path.join(workdir, "steps_train.py")
    with open(script, "w") as handle:
        handle.write(JAX_STEPS_SCRIPT if use_jax else STEPS_SCRIPT)
    read_fd, write_fd = os.pipe()  # the progress channel, as the agent opens it
    env = base_env(workdir)
    if every_s is not None:  # None: by hand, no progress channel, so no hook at all
        env.update(MGPU_PROGRESS_FD=str(write_fd), MGPU_STEPS_EVERY_S=every_s)
    errors = open(os.path.join(workdir, "steps_train.err"), "w+")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "launcher.bootstrap", script, str(count)],
                            env=env, cwd=workdir, stdout=subprocess.PIPE, text=True,
                            stderr=errors, pass_fds=(write_fd,))
    os.close(write_fd)
    reports = 0
    with os.fdopen(read_fd, "rb") as channel:
        for _ in channel:
            reports += 1
    out, _ = proc.communicate()
    line = next((x for x in out.splitlines() if x.startswith("STEPS_PER_S ")), None)
    errors.seek(0)
    said = errors.read()[-3000:]
    errors.close()
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"steps run failed (exit {proc.returncode}, counting every "
                         f"{every_s or 'default'} s):\n{said}")
    if every_s not in ("0", None) and reports == 0:
        raise SystemExit("the step counter reported nothing: is runtime.steps installed?")
    return float(line.split()[1])


def compare_steps(rounds: int, count: int, use_jax: bool = False) -> None:
    settings: dict[str, str | None] = {"no hooks": None, "off": "0", "default": "",
                                       "every 0.05 s": "0.05"}
    rates: dict[str, list[float]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as workdir:
        for round_no in range(rounds):
            line = f"round {round_no + 1}:"
            for name, every in settings.items():
                rates[name].append(steps_per_s(workdir, every, count, use_jax))
                line += f"   {name} {rates[name][-1]:7.1f} steps/s"
            print(line, flush=True)
    off = statistics.median(rates["off"])
    keras = "Keras 3 on JAX" if use_jax else "Keras"
    print(f"\nmedian steps/s, one task, {keras} fit of {count} steps:")
    for name in settings:
        m = statistics.median(rates[name])
        target = "  (target >= 0.98)" if name in ("default", "no hooks") else ""
        print(f"  step counting {name:13} {m:7.1f}   ratio to off {m / off:.3f}{target}")
    print("  (`no hooks`: no progress channel, as by hand; `off`: the save and restore "
          "hooks, a backup every 100 steps, without step counting)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--standby", default="auto,off", help="restart.warm_standby settings")
    parser.add_argument("--steps", action="store_true",
                        help="measure the zero-code step counter's cost instead")
    parser.add_argument("--steps-count", type=int, default=3000)
    parser.add_argument("--jax", action="store_true",
                        help="with --steps: Keras 3 on JAX instead of TensorFlow")
    args = parser.parse_args()
    if args.steps:
        compare_steps(args.rounds, args.steps_count, args.jax)
        return
    settings = args.standby.split(",")
    hand: list[float] = []
    launched: dict[str, list[float]] = {s: [] for s in settings}
    with tempfile.TemporaryDirectory() as workdir:
        for round_no in range(args.rounds):
            hand.append(by_hand(args.epochs, workdir))
            line = f"round {round_no + 1}: by hand {hand[-1]:6.2f} s"
            for standby in settings:
                launched[standby].append(under_launcher(args.epochs, workdir, round_no,
                                                        standby))
                line += f"   mgpu-launch (standby {standby}) {launched[standby][-1]:6.2f} s"
            print(line, flush=True)
    h = statistics.median(hand)
    print(f"\nmedian wall time, 2 workers, {args.epochs} epochs of digits:")
    print(f"  by hand (TF_CONFIG):              {h:6.2f} s")
    for standby in settings:
        m = statistics.median(launched[standby])
        target = "  (target <= 1.0)" if standby == "auto" else ""
        print(f"  mgpu-launch, warm_standby {standby:4}:  {m:6.2f} s   ratio to by hand "
              f"{m / h:.3f}{target}")


if __name__ == "__main__":
    main()
