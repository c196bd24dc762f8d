"""The TFJob schema check of tests/tfjob_schema.py: it reads the operator's SDK,
accepts what the exporter writes, and fails, naming the path, on what the
operator would refuse."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
from kubeflow.training import models
from kubernetes.client import V1Container, V1SecretKeySelector

from launcher.spec.config import load_config
from launcher.tools.export import tfjob_manifest
from tests.tfjob_schema import ENUMS, REPLICA_TYPES, required_keys, tfjob_errors, validate_tfjob

CLUSTER = """\
name: digits
checkpoint: {dir: /shared/ckpt}
env: {HF_TOKEN: abc, TF_CPP_MIN_LOG_LEVEL: "2"}
hosts:
  - {address: node1, roles: {chief: 1}, gpus: [0]}
  - {address: node2, gpus: [0, 1]}
"""
WORKER = ("spec", "tfReplicaSpecs", "Worker")
CONTAINER = (*WORKER, "template", "spec", "containers", 0)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> dict:
    path: Path = tmp_path_factory.mktemp("schema") / "cluster.yaml"
    path.write_text(CLUSTER)
    return tfjob_manifest(load_config(path), ["train.py"], pvc="shared", namespace="ml")


def _at(node, path: tuple):
    for key in path:
        node = node[key]
    return node


def test_the_schema_is_the_sdks():
    """Required fields come from the SDK's models; the enum values we check agree
    with what the SDK documents."""
    assert required_keys(models.KubeflowOrgV1TFJobSpec) == {"runPolicy", "tfReplicaSpecs"}
    assert required_keys(V1Container) == {"name"}
    assert required_keys(V1SecretKeySelector) == {"key"}
    documented = models.KubeflowOrgV1ReplicaSpec.restart_policy.__doc__
    for value in ENUMS[("KubeflowOrgV1ReplicaSpec", "restartPolicy")]:
        assert value in documented
    assert {"Chief", "Worker", "PS"} <= REPLICA_TYPES


def test_the_exported_manifest_is_valid(manifest: dict):
    assert tfjob_errors(manifest) == []
    validate_tfjob(manifest)


def _set(path: tuple, value) -> Callable[[dict], None]:
    def change(m: dict) -> None:
        _at(m, path[:-1])[path[-1]] = value
    return change


def _delete(path: tuple) -> Callable[[dict], None]:
    def change(m: dict) -> None:
        del _at(m, path[:-1])[path[-1]]
    return change


def _rename_replica(new: str) -> Callable[[dict], None]:
    def change(m: dict) -> None:
        specs = m["spec"]["tfReplicaSpecs"]
        specs[new] = specs.pop("Worker")
    return change


def _two_chiefs(m: dict) -> None:
    m["spec"]["tfReplicaSpecs"]["Master"] = copy.deepcopy(m["spec"]["tfReplicaSpecs"]["Chief"])


BROKEN = {
    "unknown key": (_set((*CONTAINER, "imagePullPolcy"), "Always"),
                    "spec.tfReplicaSpecs.Worker.template.spec.containers[0].imagePullPolcy: "
                    "not a field of V1Container"),
    "unknown top key": (_set(("spec", "tfReplicaSpec"), {}),
                        "spec.tfReplicaSpec: not a field of KubeflowOrgV1TFJobSpec"),
    "wrong type": (_set(("spec", "runPolicy", "backoffLimit"), "3"),
                   "spec.runPolicy.backoffLimit: expected int, got '3'"),
    "bool for int": (_set((*WORKER, "replicas"), True),
                     "spec.tfReplicaSpecs.Worker.replicas: expected int, got True"),
    "list expected": (_set((*CONTAINER, "command"), "python3 train.py"),
                      "containers[0].command: expected a list (list[str])"),
    "quantity as int": (_set((*CONTAINER, "resources", "limits", "nvidia.com/gpu"), 2),
                        "limits.nvidia.com/gpu: expected str, got 2"),
    "misspelt replica type": (_rename_replica("Wroker"),
                              "spec.tfReplicaSpecs.Wroker: unknown replica type 'Wroker'"),
    "lower-case replica type": (_rename_replica("worker"), "unknown replica type 'worker'"),
    "missing required": (_delete(("spec", "runPolicy")),
                         "spec.runPolicy: required by KubeflowOrgV1TFJobSpec"),
    "missing container name": (_delete((*CONTAINER, "name")),
                               "containers[0].name: required by V1Container"),
    "missing secret key": (_delete((*CONTAINER, "env", 0, "valueFrom", "secretKeyRef", "key")),
                           "secretKeyRef.key: required by V1SecretKeySelector"),
    "restart policy": (_set((*WORKER, "restartPolicy"), "OnError"),
                       "spec.tfReplicaSpecs.Worker.restartPolicy: 'OnError' is not one of"),
    "clean pod policy": (_set(("spec", "runPolicy", "cleanPodPolicy"), "Runing"),
                         "spec.runPolicy.cleanPodPolicy: 'Runing' is not one of"),
    "success policy": (_set(("spec", "successPolicy"), "AllWorker"),
                       "spec.successPolicy: 'AllWorker' is not one of"),
    "value and valueFrom": (_set((*CONTAINER, "env", 0, "value"), "abc"),
                            "containers[0].env[0]: has both value and valueFrom"),
    "no tensorflow container": (_set((*CONTAINER, "name"), "main"),
                                "Worker.template.spec.containers: no container named "
                                "'tensorflow'"),
    "no image": (_delete((*CONTAINER, "image")),
                 "Worker.template.spec.containers[0].image: required by the operator"),
    "two chiefs": (_two_chiefs, "more than one Chief/Master"),
    "bad name": (_set(("metadata", "name"), "Digits_1"), "metadata.name: 'Digits_1' is not"),
    "kind": (_set(("kind",), "PyTorchJob"), "kind: 'PyTorchJob', not 'TFJob'"),
    "status": (_set(("status",), {}), "status: set by the system"),
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_a_broken_manifest_fails_with_its_path(manifest: dict, what: str):
    change, expected = BROKEN[what]
    broken = copy.deepcopy(manifest)
    change(broken)
    errors = tfjob_errors(broken)
    assert any(expected in error for error in errors), errors
    with pytest.raises(AssertionError, match="not a valid TFJob"):
        validate_tfjob(broken)


def test_not_a_mapping():
    assert tfjob_errors([]) == ["(top): expected a mapping (KubeflowOrgV1TFJob), got []"]
