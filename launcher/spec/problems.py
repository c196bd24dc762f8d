"""A cluster file's problems, each in one line: the file, the YAML line, the
key path and what was expected.

Owns: `ConfigError`; the reading of the YAML text with the line of every key
(launcher.spec.yamldoc underneath); the translation of YAML and pydantic
errors into words (an unknown key with the closest allowed one, a role that
does not exist, a file that is not UTF-8). launcher.spec.config calls it; the
schema itself is not known here (the root model comes in as an argument).

Must not import: anything of the launcher but launcher.spec.yamldoc and
launcher.spec.hosts (the role names).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from .hosts import ROLES
from .yamldoc import YamlProblem, load_document


class ConfigError(Exception):
    """A cluster file that cannot be used. `problems` holds one line per issue."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        listing = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"invalid cluster config {source}:\n{listing}")


def read_yaml(text: str, source: str) -> tuple[Any, dict[tuple, int]]:
    """The document and the 1-based YAML line of every key path (('hosts', 0,
    'roles'), ...). Rejects duplicate keys, which PyYAML would silently
    collapse, and documents too deep or too big (launcher.spec.yamldoc).
    Raises ConfigError, or yaml.YAMLError for text that is not YAML."""
    try:
        document = load_document(text)
    except YamlProblem as exc:
        where = f"{source}:{exc.line}" if exc.line else source
        raise ConfigError(source, [f"{where}: {dotted(exc.path)}: {exc.message}"]) from None
    if document.duplicates:
        raise ConfigError(source, [f"{source}:{line}: {dotted(path)}: duplicate key"
                                   for path, line in document.duplicates])
    return document.data, document.lines


def not_yaml(exc: yaml.YAMLError, source: str) -> str:
    """The line of a YAML syntax error, and where the construct it broke began."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{source}:{mark.line + 1}" if mark else source
    problem = getattr(exc, "problem", None) or str(exc)
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and start is not None and mark is not None and start.line != mark.line:
        problem += f" ({context} started at line {start.line + 1})"
    return f"{where}: not valid YAML: {problem}"


def dotted(path: tuple) -> str:
    """A key path as the user reads it: `hosts[0].roles`."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def line_for(lines: dict[tuple, int], path: tuple) -> int | None:
    """The YAML line of `path`, or of its nearest parent that has one."""
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def _model_for(root: type[BaseModel], path: tuple) -> type[BaseModel] | None:
    """The pydantic model that owns the mapping at `path` (for key suggestions)."""
    model: type[BaseModel] | None = root
    for part in path:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        annotation = field.annotation
        args = getattr(annotation, "__args__", ()) or ()
        candidates = [annotation, *args]
        model = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
    return model


UNION_TAGS = ("(word)", "(settings)")


def describe(error: dict, root: type[BaseModel]) -> tuple[tuple, str]:
    """One pydantic error of a document validated as `root`: (key path, words)."""
    # A tagged union's tag (config.py: `sentinel`'s word or settings) is no key.
    loc = tuple(p for p in error["loc"] if p not in ("[key]", *UNION_TAGS))
    kind = error["type"]
    if kind == "extra_forbidden":
        parent, key = loc[:-1], loc[-1]
        model = _model_for(root, parent)
        allowed = sorted(model.model_fields) if model else []
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return loc, f"unknown key {key!r}{hint} (expected one of: {', '.join(allowed)})"
    if kind == "missing":
        return loc, "required key is missing"
    if kind == "literal_error" and "[key]" in error["loc"]:
        return loc, f"unknown role {loc[-1]!r} (expected one of: {', '.join(ROLES)})"
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    got = error.get("input")
    if kind not in ("missing",) and not isinstance(got, dict | list):
        message += f" (got {got!r})"
    return loc, message


def not_utf8(path: Path, raw: bytes, offset: int) -> str:
    """Where a cluster file stops being UTF-8: line, key and byte."""
    line = raw.count(b"\n", 0, offset) + 1
    start = raw.rfind(b"\n", 0, offset) + 1
    key = re.match(rb"\s*-?\s*([A-Za-z0-9_.\-]+)\s*:", raw[start:offset + 1])
    named = f"{key.group(1).decode()}: " if key else ""
    return (f"{path}:{line}: {named}not UTF-8 text (byte 0x{raw[offset]:02x} at column "
            f"{offset - start + 1}): save the file as UTF-8")
