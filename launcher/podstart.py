"""A task in a pod of a Kubeflow Trainer v2 TrainJob: `python -m launcher.podstart SCRIPT ARGS`.

Owns the translation of what Kubernetes gives a trainer pod into what the launcher
gives a task over SSH, then hands over to the bootstrap (the error file, the Keras
fixes, the guards, the script as `__main__`), as under the launcher:

- `JOB_COMPLETION_INDEX` (the pod's index in the JobSet's one Indexed Job) picks
  the task: in task order, the chief first when there is one, then the workers;
- `MGPU_TF_CLUSTER` (written by `mgpu-launch export --to trainjob` from the
  launcher's own plan: every pod's `<trainjob>-node-0-<i>.<trainjob>:<port>`, so
  the job's size) is TF_CONFIG's `cluster`; TF_CONFIG, MGPU_TASK_TYPE,
  MGPU_TASK_INDEX and MGPU_HOST are set from the two;
- `MGPU_RESTART_ATTEMPT` (the JobSet's restart attempt, through the downward API)
  is MGPU_GENERATION;
- under `strategy: keras_distribution`, Trainer's JAX runtime variables
  (`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`) become the
  `KERAS_DISTRIBUTION_*` values `keras.distribution.initialize()` reads; without
  them, they follow from the cluster and the index, as the launcher's plan does.

A pod whose environment does not fit (no index, an index past the cluster, a
cluster that is no JSON) exits 2 with one line saying what to fix, before any
import of TensorFlow.

Shipped floor: standard library and the bootstrap only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

from launcher.bootstrap import main as run_bootstrap

CLUSTER_ENV = "MGPU_TF_CLUSTER"
INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by Kubernetes in every pod of an Indexed Job
RESTART_ENV = "MGPU_RESTART_ATTEMPT"
TASK_ROLES = ("chief", "worker")  # the roles a trainer pod can be (one replicated job)
KERAS_DISTRIBUTION = "keras_distribution"  # launcher.strategy.Strategy.KERAS_DISTRIBUTION
EXIT_USAGE = 2


class PodStartError(Exception):
    """The pod's environment does not describe a task of the job."""


def _cluster(environ: Mapping[str, str]) -> dict[str, list[str]]:
    text = environ.get(CLUSTER_ENV)
    if not text:
        raise PodStartError(f"{CLUSTER_ENV} is not set: start pods from the TrainJob that "
                            "`mgpu-launch export --to trainjob` wrote (its runtime sets it)")
    try:
        cluster = json.loads(text)
    except ValueError as exc:
        raise PodStartError(f"{CLUSTER_ENV} is not JSON ({exc}): re-export the TrainJob") \
            from None
    if (not isinstance(cluster, dict) or not any(cluster.get(r) for r in TASK_ROLES)
            or not all(isinstance(v, list) for v in cluster.values())):
        raise PodStartError(f"{CLUSTER_ENV} names no chief or worker addresses: re-export "
                            "the TrainJob")
    return cluster


def _index(environ: Mapping[str, str], size: int) -> int:
    text = environ.get(INDEX_ENV, "")
    if not text.isdigit():
        raise PodStartError(f"{INDEX_ENV}={text!r}: not a pod of an Indexed Job (a "
                            "TrainJob's pods have it; to try by hand, set it to 0.."
                            f"{size - 1})")
    index = int(text)
    if index >= size:
        raise PodStartError(f"{INDEX_ENV}={index}, but the job has {size} task(s): the "
                            f"TrainJob's numNodes must be {size}, as exported (re-export "
                            "after changing the hosts)")
    return index


def task_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What this pod's task gets on top of the pod's environment."""
    cluster = _cluster(environ)
    tasks = [(role, i) for role in TASK_ROLES for i in range(len(cluster.get(role, [])))]
    index = _index(environ, len(tasks))
    role, role_index = tasks[index]
    env = {
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": role,
                                                              "index": role_index}}),
        "MGPU_TASK_TYPE": role,
        "MGPU_TASK_INDEX": str(role_index),
        "MGPU_HOST": cluster[role][role_index].rsplit(":", 1)[0],
        "MGPU_GENERATION": environ.get(RESTART_ENV) or "0",
    }
    if environ.get("MGPU_STRATEGY") == KERAS_DISTRIBUTION:
        env.update(_keras_distribution(environ, cluster, index))
    return env


def _keras_distribution(environ: Mapping[str, str], cluster: Mapping[str, list[str]],
                        index: int) -> dict[str, str]:
    """KERAS_DISTRIBUTION_*: from Trainer's JAX runtime when it set its variables
    (a single coordinator address is what Keras takes from it), else every process's
    address in TF_CONFIG's order, process 0 the coordinator (launcher.spec.taskenv)."""
    addresses = [a for role in TASK_ROLES for a in cluster.get(role, [])]
    if environ.get("JAX_NUM_PROCESSES"):
        count, process = environ["JAX_NUM_PROCESSES"], environ.get("JAX_PROCESS_ID", "")
        if count != str(len(addresses)) or process != str(index):
            raise PodStartError(f"Trainer's JAX_NUM_PROCESSES={count} and JAX_PROCESS_ID="
                                f"{process} disagree with the exported job ({len(addresses)} "
                                f"processes, this pod's index {index}): re-export the TrainJob")
        return {"KERAS_DISTRIBUTION_JOB_ADDRESSES": environ.get("JAX_COORDINATOR_ADDRESS")
                or addresses[0],
                "KERAS_DISTRIBUTION_NUM_PROCESSES": count,
                "KERAS_DISTRIBUTION_PROCESS_ID": process}
    return {"KERAS_DISTRIBUTION_JOB_ADDRESSES": ",".join(addresses),
            "KERAS_DISTRIBUTION_NUM_PROCESSES": str(len(addresses)),
            "KERAS_DISTRIBUTION_PROCESS_ID": str(index)}


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m launcher.podstart SCRIPT [ARGS...]")
    try:
        env = task_env(os.environ)
    except PodStartError as exc:
        print(f"mgpu-launch podstart: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USAGE)
    os.environ.update(env)
    print(f"mgpu-launch podstart: {env['MGPU_HOST']} is {env['MGPU_TASK_TYPE']} "
          f"{env['MGPU_TASK_INDEX']} (generation {env['MGPU_GENERATION']})",
          file=sys.stderr, flush=True)
    run_bootstrap()  # sys.argv[1:] is SCRIPT ARGS, as for `python -m launcher.bootstrap`


if __name__ == "__main__":
    main()
