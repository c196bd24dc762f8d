"""The rule every section of the cluster file's schema follows (pydantic).

Owns: `Strict`, the base of every model of the cluster file (launcher.spec.config,
launcher.spec.hosts). Must not import: anything of the launcher.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # An unknown key is an error: a typo must never be silently ignored.
    # Strict: `max_restarts: true` or `port: "22"` is a mistake, not 1 or 22;
    # no inf or nan (`.inf` is no timeout: a timeout that never ends hangs a job).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
