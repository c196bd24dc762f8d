"""The OS name of the runtime's own threads in a task (steps, traces).

Standard library only; imported by the threads themselves, not at a task's start.
"""

from __future__ import annotations

import threading


def name_this_thread(name: str) -> None:
    """Give the calling thread its name in the OS too (/proc/.../comm, 15 bytes):
    the straggler radar leaves the launcher's own `mgpu-*` threads out."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as handle:
            handle.write(name[:15])
    except OSError:
        pass  # not Linux: nothing reads it there
