"""Secret-looking `env:` names: which they are, and their values masked.

Owns: the rule that an `env:` name like `WANDB_API_KEY` or `DB_PASSWORD` holds
a secret, shown as *** wherever the launcher prints or records it (--dry-run,
check, the run directory's config.yaml) and read from a Kubernetes Secret in
an exported TFJob (launcher.tools.export).

Must not import: anything of the launcher (a rule over names, used by config,
plan and export alike).
"""

from __future__ import annotations

import re
from typing import Any

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL", re.IGNORECASE)
MASK = "***"


def looks_secret(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def redact_env(env: dict[str, Any]) -> dict[str, Any]:
    """`env` with the values of secret-looking names replaced by ***."""
    return {key: (MASK if looks_secret(key) else value) for key, value in env.items()}
