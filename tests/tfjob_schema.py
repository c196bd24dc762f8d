"""A strict check of a TFJob manifest against the training operator's published schema.

The schema is the one shipped on PyPI by the operator's own Python SDK,
`kubeflow-training` (generated from the operator's OpenAPI spec), and the
`kubernetes` client it depends on: every model class has `openapi_types`
(attribute -> type) and `attribute_map` (attribute -> JSON key). The manifest
is walked from `KubeflowOrgV1TFJob` down through `V1PodTemplateSpec`,
`V1Container`, ... : a key that is no field of the model, a value of the wrong
type or a missing required field (the models' setters refuse None for those)
is an error naming its path. No cluster is needed.

On top of the types, the values the operator documents (its Go API types,
kubeflow.org/v1 common_types.go and tensorflow_types.go) and the rules of its
TFJob validation webhook: replica types, restartPolicy, cleanPodPolicy,
successPolicy, a DNS-1035 name, a `tensorflow` container with an image in
every replica, at most one Chief/Master. And one core API rule the manifest
relies on: an env var has `value` or `valueFrom`, not both.
"""

from __future__ import annotations

import inspect
import re
from functools import cache
from typing import Any

from kubeflow.training import models as kubeflow_models
from kubeflow.training.constants import constants
from kubernetes.client import models as k8s_models

ROOT_MODEL = constants.TFJOB_MODEL  # "KubeflowOrgV1TFJob"
API_VERSION = constants.API_VERSION  # "kubeflow.org/v1"
KIND = constants.TFJOB_KIND
CONTAINER = constants.TFJOB_CONTAINER  # "tensorflow"

# TFJob replica types: the SDK's constants, plus Evaluator (the operator's
# TFJobReplicaTypeEval, which the SDK does not name).
REPLICA_TYPES = frozenset({constants.REPLICA_TYPE_CHIEF, constants.REPLICA_TYPE_MASTER,
                           constants.REPLICA_TYPE_WORKER, constants.REPLICA_TYPE_PS,
                           "Evaluator"})
CHIEF_TYPES = frozenset({constants.REPLICA_TYPE_CHIEF, constants.REPLICA_TYPE_MASTER})
# Values of the operator's string enums, by (model, JSON key). The SDK types them
# as plain `str`; KubeflowOrgV1ReplicaSpec.restart_policy's docstring lists the first
# (checked in tests/test_tfjob_schema.py).
ENUMS: dict[tuple[str, str], frozenset[str]] = {
    ("KubeflowOrgV1ReplicaSpec", "restartPolicy"):
        frozenset({"Always", "OnFailure", "Never", "ExitCode"}),
    ("KubeflowOrgV1RunPolicy", "cleanPodPolicy"): frozenset({"All", "Running", "None"}),
    ("KubeflowOrgV1TFJobSpec", "successPolicy"): frozenset({"", "AllWorkers"}),
}
# Written by the system, never by a manifest.
READ_ONLY = {(ROOT_MODEL, "status")}
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")

_LIST = re.compile(r"list\[(.+)\]")
_DICT = re.compile(r"dict\(([^,]+), (.+)\)")


def model_class(name: str) -> type:
    for module in (kubeflow_models, k8s_models):
        cls = getattr(module, name, None)
        if cls is not None and hasattr(cls, "openapi_types"):
            return cls
    raise LookupError(f"no model {name} in kubeflow.training or kubernetes.client")


@cache
def required_keys(cls: type) -> frozenset[str]:
    """JSON keys of the fields the generated setter refuses to set to None."""
    keys = set()
    for attribute, key in cls.attribute_map.items():
        setter = getattr(cls, attribute).fset
        if "must not be `None`" in inspect.getsource(setter):
            keys.add(key)
    return frozenset(keys)


def _check_value(value: Any, type_name: str, path: str, errors: list[str]) -> None:
    if (match := _LIST.fullmatch(type_name)) is not None:
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list ({type_name}), got {value!r}")
            return
        for i, item in enumerate(value):
            _check_value(item, match.group(1), f"{path}[{i}]", errors)
        return
    if (match := _DICT.fullmatch(type_name)) is not None:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a mapping ({type_name}), got {value!r}")
            return
        for key, item in value.items():
            if not isinstance(key, str):
                errors.append(f"{path}: key {key!r} is not a string")
            _check_value(item, match.group(2), f"{path}.{key}", errors)
        return
    ok: bool
    if type_name == "str":
        ok = isinstance(value, str)
    elif type_name == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif type_name == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif type_name == "bool":
        ok = isinstance(value, bool)
    elif type_name in ("date", "datetime"):
        ok = isinstance(value, str)
    elif type_name == "object":
        ok = True
    else:
        check_model(value, type_name, path, errors)
        return
    if not ok:
        errors.append(f"{path}: expected {type_name}, got {value!r}")


def check_model(value: Any, model: str, path: str, errors: list[str]) -> None:
    """Append to `errors` what in `value` does not fit model `model` (recursively)."""
    cls = model_class(model)
    where = path or "(top)"
    if not isinstance(value, dict):
        errors.append(f"{where}: expected a mapping ({model}), got {value!r}")
        return
    types_by_key = {key: cls.openapi_types[attr] for attr, key in cls.attribute_map.items()}
    for key, item in value.items():
        sub = f"{path}.{key}" if path else str(key)
        if key not in types_by_key:
            errors.append(f"{sub}: not a field of {model}")
            continue
        if (model, key) in READ_ONLY:
            errors.append(f"{sub}: set by the system, not in a manifest")
            continue
        if item is None:
            continue  # null: the field is unset (required ones are caught below)
        _check_value(item, types_by_key[key], sub, errors)
        allowed = ENUMS.get((model, key))
        if allowed is not None and item not in allowed:
            errors.append(f"{sub}: {item!r} is not one of {sorted(allowed)}")
    for key in sorted(required_keys(cls)):
        if value.get(key) is None:
            errors.append(f"{path + '.' if path else ''}{key}: required by {model}")
    if model == "V1EnvVar" and "value" in value and "valueFrom" in value:
        errors.append(f"{where}: has both value and valueFrom")
    if model == "V1SecretKeySelector" and isinstance(value.get("key"), str) \
            and not SECRET_KEY.fullmatch(value["key"]):
        errors.append(f"{where}.key: {value['key']!r} is not a valid Secret key")


def _operator_rules(manifest: dict[str, Any], errors: list[str]) -> None:
    """What the Kubernetes API and the operator's webhook add to the types."""
    if manifest.get("apiVersion") != API_VERSION:
        errors.append(f"apiVersion: {manifest.get('apiVersion')!r}, not {API_VERSION!r}")
    if manifest.get("kind") != KIND:
        errors.append(f"kind: {manifest.get('kind')!r}, not {KIND!r}")
    metadata = manifest.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not DNS_1035_LABEL.fullmatch(name):
        errors.append(f"metadata.name: {name!r} is not a DNS-1035 label")
    spec = manifest.get("spec")
    specs = spec.get("tfReplicaSpecs") if isinstance(spec, dict) else None
    if not isinstance(specs, dict):
        return  # reported by the type check
    if not specs:
        errors.append("spec.tfReplicaSpecs: no replica spec")
    for kind, replica in specs.items():
        where = f"spec.tfReplicaSpecs.{kind}"
        if kind not in REPLICA_TYPES:
            errors.append(f"{where}: unknown replica type {kind!r}, not one of "
                          f"{sorted(REPLICA_TYPES)}")
        try:
            containers = replica["template"]["spec"]["containers"]
        except (KeyError, TypeError):
            errors.append(f"{where}.template.spec.containers: required by the operator")
            continue
        if not isinstance(containers, list) or not containers:
            errors.append(f"{where}.template.spec.containers: required by the operator")
            continue
        for i, container in enumerate(containers):
            if isinstance(container, dict) and not container.get("image"):
                errors.append(f"{where}.template.spec.containers[{i}].image: required by the "
                              "operator")
        if not any(isinstance(c, dict) and c.get("name") == CONTAINER for c in containers):
            errors.append(f"{where}.template.spec.containers: no container named {CONTAINER!r}")
    if len(CHIEF_TYPES & set(specs)) > 1:
        errors.append("spec.tfReplicaSpecs: more than one Chief/Master")


def tfjob_errors(manifest: Any) -> list[str]:
    """Every problem of `manifest` (a parsed TFJob), each with its path; [] when valid."""
    errors: list[str] = []
    check_model(manifest, ROOT_MODEL, "", errors)
    if isinstance(manifest, dict):
        for key in ("apiVersion", "kind", "metadata", "spec"):
            if key not in manifest:
                errors.append(f"{key}: required in a manifest")
        _operator_rules(manifest, errors)
    return errors


def validate_tfjob(manifest: Any) -> None:
    """Raise AssertionError listing every problem of `manifest`."""
    errors = tfjob_errors(manifest)
    assert not errors, "not a valid TFJob:\n  " + "\n  ".join(errors)


DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def network_policy_errors(policy: Any) -> list[str]:
    """Every problem of `policy` (a parsed NetworkPolicy) against the Kubernetes
    client's V1NetworkPolicy model, and the API's rules the types miss."""
    errors: list[str] = []
    check_model(policy, "V1NetworkPolicy", "", errors)
    if not isinstance(policy, dict):
        return errors
    if policy.get("apiVersion") != "networking.k8s.io/v1":
        errors.append(f"apiVersion: {policy.get('apiVersion')!r}, not 'networking.k8s.io/v1'")
    if policy.get("kind") != "NetworkPolicy":
        errors.append(f"kind: {policy.get('kind')!r}, not 'NetworkPolicy'")
    name = (policy.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not DNS_1123_SUBDOMAIN.fullmatch(name):
        errors.append(f"metadata.name: {name!r} is not a DNS-1123 subdomain")
    spec = policy.get("spec") or {}
    if spec.get("podSelector") is None:
        errors.append("spec.podSelector: required by the API (an empty one selects all pods)")
    for rule in spec.get("ingress") or []:
        for port in rule.get("ports") or []:
            if port.get("protocol") not in ("TCP", "UDP", "SCTP"):
                errors.append(f"ingress port {port}: protocol not TCP, UDP or SCTP")
            number, end = port.get("port"), port.get("endPort")
            if isinstance(number, int) and not 1 <= number <= 65535:
                errors.append(f"ingress port {port}: port out of 1-65535")
            if end is not None and not (isinstance(number, int) and number <= end <= 65535):
                errors.append(f"ingress port {port}: endPort needs a numeric port <= it")
    for value in spec.get("policyTypes") or []:
        if value not in ("Ingress", "Egress"):
            errors.append(f"spec.policyTypes: {value!r} is not Ingress or Egress")
    return errors


def validate_network_policy(policy: Any) -> None:
    errors = network_policy_errors(policy)
    assert not errors, "not a valid NetworkPolicy:\n  " + "\n  ".join(errors)
