"""The distribution strategies a job may use (`strategy:` in the cluster
file), named once: the launcher side and the shipped runtime compare against
these. Standard library only: shipped to the hosts with the agent.

`Strategy` is a `StrEnum`, so a member equals its YAML name (`config.strategy
== Strategy.PARAMETER_SERVER` holds for the string the config holds) and prints
as it, and it equals the `MGPU_STRATEGY` value a task's runtime reads.
"""

from __future__ import annotations

from enum import StrEnum


class Strategy(StrEnum):
    MULTI_WORKER_MIRRORED = "multi_worker_mirrored"
    PARAMETER_SERVER = "parameter_server"
    LEGACY_SERVER = "legacy_server"
    KERAS_DISTRIBUTION = "keras_distribution"


DEFAULT = Strategy.MULTI_WORKER_MIRRORED

# Every worker joins one collective (all-reduce, all-gather): one worker's loss
# stops them all, so the supervisor watches their output for collective aborts,
# and a plan needs at least one worker.
COLLECTIVE = frozenset({Strategy.MULTI_WORKER_MIRRORED, Strategy.KERAS_DISTRIBUTION})

# Keras 3 on JAX across processes, not TensorFlow.
ON_JAX = frozenset({Strategy.KERAS_DISTRIBUTION})


def framework(strategy: str) -> str:
    """What the job's tasks compute with, as a person names it."""
    return "JAX" if strategy in ON_JAX else "TensorFlow"
