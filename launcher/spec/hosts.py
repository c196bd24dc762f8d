"""The cluster file's hosts: each `hosts:` entry and the `ssh:` section.

Owns: the schema of a host entry (address, name, GPUs, roles, spare, TF
address, network interface, its overrides of `ssh:`) and of the `ssh:`
section, with the checks pydantic makes one field at a time. What spans
several hosts (distinct names, the roles a strategy needs) is checked by
launcher.spec.config over the whole file.

Must not import: anything of the launcher but launcher.spec.strict.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from .strict import Strict

ROLES = ("chief", "worker", "ps", "evaluator")
# A network interface's name as Linux allows it (at most 15 bytes, no `/` or blanks).
INTERFACE_NAME = re.compile(r"[A-Za-z0-9_.:@\-]{1,15}")
# What TF_CONFIG's `host:port` can hold: a host name, an IPv4 address, or [IPv6].
TF_ADDRESS = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+")


def interface_name(value: str | None) -> str | None:
    """A field validator: `network_interface` (of a host, or of the whole file)."""
    if value is not None and not INTERFACE_NAME.fullmatch(value):
        raise ValueError("expected an interface name such as eth1 or ib0 "
                         "(at most 15 characters, no blanks or /)")
    return value


class SSHSettings(Strict):
    user: str | None = None
    port: int = Field(default=22, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    host_key_policy: Literal["strict", "accept-new"] = "strict"
    config_file: str | None = "~/.ssh/config"
    connect_timeout_s: float = Field(default=10.0, gt=0)
    # From the agent's command to its first line (the login's rc files, a cold
    # Python start on a loaded host or an NFS home): a host silent this long is
    # named and the launch stops.
    hello_timeout_s: float = Field(default=30.0, gt=0)


class HostSpec(Strict):
    address: str = Field(min_length=1)
    # Display name used in output prefixes and log file names (default: address).
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.\-]+$")
    gpus: list[int] = Field(default_factory=list)
    roles: dict[Literal["chief", "worker", "ps", "evaluator"], int] = Field(
        default_factory=lambda: {"worker": 1}
    )
    python: str | None = None
    # A spare host runs nothing until another host is lost; then it takes over.
    spare: bool = False
    # `per_gpu`: one worker per entry of `gpus` instead of one over all of them.
    tasks_per_host: Literal["one", "per_gpu"] | None = None
    # The address other hosts reach this host's tasks at (TF_CONFIG), when it is
    # not the one SSH connects to; see launcher/spec/addresses.py for the order.
    tf_address: str | None = None
    # Put this interface's IPv4 address into TF_CONFIG (read by the host's agent).
    network_interface: str | None = None
    # Per-host overrides of the `ssh:` section.
    user: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None
    host_key_policy: Literal["strict", "accept-new"] | None = None
    config_file: str | None = None
    connect_timeout_s: float | None = Field(default=None, gt=0)

    @field_validator("roles")
    @classmethod
    def _counts_non_negative(cls, roles: dict[str, int]) -> dict[str, int]:
        for role, count in roles.items():
            if count < 0:
                raise ValueError(f"count of {role!r} must be 0 or more, got {count}")
        return roles

    @field_validator("tf_address")
    @classmethod
    def _tf_address(cls, value: str | None) -> str | None:
        if value is not None and not TF_ADDRESS.fullmatch(value):
            raise ValueError("expected a host name or IP address without a port "
                             "(each task's port is added to it), e.g. 10.0.1.5; IPv6 in "
                             "brackets")
        return value

    _interface = field_validator("network_interface")(interface_name)

    @field_validator("gpus")
    @classmethod
    def _gpu_ids(cls, gpus: list[int]) -> list[int]:
        if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
            raise ValueError("GPU ids must be distinct non-negative integers")
        return gpus

