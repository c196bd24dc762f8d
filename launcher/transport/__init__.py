"""Transports: how the supervisor gets a pipe to one agent per host.

Owns the small protocol every transport implements (`Transport`: connect,
connect_each, time_command, close) and the host-by-host error it raises;
tests/test_transports_contract.py checks that every transport has it. Local,
SSH and Slurm transports are siblings; the supervisor never knows which one it
talks to.

Must not import: supervisor, cli.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Protocol

from ..spec.target import HostTarget
from .link import AgentLink, AgentMessage


class HostProblem(Exception):
    """One host could not be used; `reason` says why and what to do."""

    def __init__(self, host: str, reason: str):
        self.host = host
        self.reason = reason
        super().__init__(f"{host}: {reason}")


class TransportError(Exception):
    """Some hosts could not be reached or prepared: every one of them is listed."""

    def __init__(self, problems: Sequence[HostProblem]):
        self.problems = list(problems)
        lines = "\n".join(f"  {p.host}: {p.reason}" for p in self.problems)
        count = len(self.problems)
        super().__init__(f"{count} host{'s' if count > 1 else ''} not ready:\n{lines}")


def every_host(
    links: dict[str, AgentLink], problems: Sequence[HostProblem]
) -> dict[str, AgentLink]:
    """`connect`'s rule on what `connect_each` got: every host's link, or none
    (the links made are closed) and a TransportError naming each failed host."""
    if problems:
        for link in links.values():
            link.close()
        raise TransportError(problems)
    return links


class Transport(Protocol):
    def connect(
        self, hosts: Sequence[HostTarget], run_dir: str, events: queue.Queue[AgentMessage]
    ) -> dict[str, AgentLink]:
        """Start one agent per host (in parallel) and wait for each one's hello.

        Raises TransportError naming every host that failed; on error, agents
        already started are shut down.
        """
        ...

    def connect_each(
        self, hosts: Sequence[HostTarget], run_dir: str, events: queue.Queue[AgentMessage]
    ) -> tuple[dict[str, AgentLink], list[HostProblem]]:
        """Like `connect`, but keep the hosts that worked: (links, problems)."""
        ...

    def time_command(self, host: str, command: str = "true",
                     timeout: float = 30.0) -> float | None:
        """Seconds one command takes on `host` the way this transport runs
        commands there (None when it failed or did not end within `timeout`)."""
        ...

    def close(self) -> None:
        """Release connections (agents stop their tasks when their stdin closes)."""
        ...


__all__ = ["AgentLink", "AgentMessage", "HostProblem", "Transport", "TransportError",
           "every_host"]
