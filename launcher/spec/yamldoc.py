"""Read a YAML document safely, with the line of every key path.

Owns the guards between a hostile or huge cluster file and the machine: a
bounded nesting depth (Python's recursion ends far sooner than YAML's), a bound
on what aliases expand to (a 2 KB "billion laughs" file names 10^9 values), no
recursive aliases, and duplicate keys (PyYAML silently keeps the last one).
Every walk is linear in the file: an alias is counted, never followed twice.

Uses libyaml when PyYAML has it (10,000-host files); the pure-Python loader
otherwise. Must not import any other launcher module (config imports this).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

# Far deeper than any cluster file (hosts[3].roles.worker is 4 levels), far
# below Python's recursion limit in the constructor and in pydantic.
MAX_DEPTH = 50
# Values (scalars and collections) the document stands for with every alias
# expanded: a 10,000-host file holds ~100,000; validation walks them all.
MAX_VALUES = 2_000_000

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TOO_DEEP = (f"nested more than {MAX_DEPTH} levels deep: a cluster file is a few levels "
             "deep (hosts[0].roles.worker)")

Path = tuple  # a key path, e.g. ("hosts", 0, "roles")


class YamlProblem(Exception):
    """A document that must not be loaded: where (key path, 1-based line) and why."""

    def __init__(self, path: Path, line: int | None, message: str):
        self.path, self.line, self.message = path, line, message
        super().__init__(message)


@dataclass(frozen=True)
class Document:
    data: Any
    lines: dict[Path, int]  # every key path (of a value's first occurrence) -> line
    duplicates: tuple[tuple[Path, int], ...]  # (key path, line) of each repeated key


def load_document(text: str) -> Document:
    """Parse `text`. Raises yaml.YAMLError for bad YAML, YamlProblem for a
    document too deep, recursive or too big once its aliases are expanded."""
    loader = _Loader(text)
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            if "nesting depth" in str(exc.problem):  # libyaml's own bound (1,000)
                _check_depth(text)  # names where it goes too deep
                line = exc.problem_mark.line + 1 if exc.problem_mark else None
                raise YamlProblem((), line, _TOO_DEEP) from None
            if _Loader is not yaml.SafeLoader:  # PyYAML's own words
                _raise_plain_error(text)
            raise
        except RecursionError:  # the pure-Python composer recurses
            _check_depth(text)
            raise YamlProblem((), None, _TOO_DEEP) from None
        if root is None:
            return Document(None, {}, ())
        lines, duplicates, first_path, aliased = _walk(root)
        if aliased:  # without aliases the document is as big as its text
            _check_expansion(root, first_path)
        data = loader.construct_document(root)
    finally:
        loader.dispose()
    return Document(data, lines, tuple(duplicates))


def _check_depth(text: str, loader: Any = _Loader) -> None:
    """Refuse nesting deeper than MAX_DEPTH from the event stream (the
    parser keeps its own stack; composing and constructing recurse), naming
    where it starts. Only on the way to an error: it costs a second parse."""
    stack: list[list] = []  # per open collection: [is_mapping, key or index, expect_key]
    try:
        _follow_depth(yaml.parse(text, Loader=loader), stack)
    except yaml.MarkedYAMLError as exc:
        if "nesting depth" not in str(exc.problem):
            raise
        line = exc.problem_mark.line + 1 if exc.problem_mark else None
        raise YamlProblem(_path(stack), line, _TOO_DEEP) from None


def _raise_plain_error(text: str) -> None:
    """Raise the pure-Python loader's error for `text` (its messages say what
    was expected, e.g. "expected ',' or ']', but got ':'"), if it has one.
    Its composer recurses: only once the depth is known to be bounded."""
    _check_depth(text, yaml.SafeLoader)
    yaml.compose(text, Loader=yaml.SafeLoader)


def _path(stack: list[list]) -> Path:
    """The key path of the open collections (up to the first with no item yet)."""
    path = []
    for entry in stack[:3]:  # where it starts is enough: not 50 levels of [0]
        if entry[1] == -1:
            break
        path.append(entry[1])
    return tuple(path)


def _follow_depth(events: Any, stack: list[list]) -> None:
    for event in events:
        if isinstance(event, yaml.NodeEvent) and stack:
            top = stack[-1]
            if not top[0]:
                top[1] += 1
            elif top[2]:
                top[1] = event.value if isinstance(event, yaml.ScalarEvent) else "?"
            top[2] = not top[2] if top[0] else top[2]
        if isinstance(event, yaml.CollectionStartEvent):
            stack.append([isinstance(event, yaml.MappingStartEvent), -1, True])
            if len(stack) > MAX_DEPTH:
                raise YamlProblem(_path(stack[:-1]), event.start_mark.line + 1, _TOO_DEEP)
        elif isinstance(event, yaml.CollectionEndEvent):
            stack.pop()


def _walk(root: yaml.Node) -> tuple[dict[Path, int], list[tuple[Path, int]],
                                   dict[int, Path], bool]:
    """Lines of key paths and duplicate keys, each node visited once (an
    alias's target is not walked again; its paths take the alias's line).
    Also whether any node is reached twice (an alias), and no deeper than
    MAX_DEPTH (libyaml's composer stops at 1,000 levels, this walk recurses)."""
    lines: dict[Path, int] = {}
    duplicates: list[tuple[Path, int]] = []
    first_path: dict[int, Path] = {}
    aliased = False

    def walk(node: yaml.Node, path: Path) -> None:
        nonlocal aliased
        lines.setdefault(path, node.start_mark.line + 1)
        if id(node) in first_path:
            aliased = True
            return
        if len(path) > MAX_DEPTH:
            raise YamlProblem(path[:3], node.start_mark.line + 1, _TOO_DEEP)
        first_path[id(node)] = path
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node)
                if key in seen:
                    duplicates.append((path + (key,), key_node.start_mark.line + 1))
                seen.add(key)
                lines[path + (key,)] = key_node.start_mark.line + 1
                walk(value_node, path + (key,))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, path + (i,))

    walk(root, ())
    return lines, duplicates, first_path, aliased


def _check_expansion(root: yaml.Node, first_path: dict[int, Path]) -> None:
    """Refuse a value that contains itself, and aliases that expand to more
    than MAX_VALUES values or MAX_DEPTH levels: sizes and depths are taken
    once per node, bottom up (never by expanding)."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()  # the nodes entered and not finished: ancestors
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            open_nodes.discard(key)
            size[key] = 1 + sum(size[id(child)] for child in children)
            depth[key] = 1 + max((depth[id(child)] for child in children), default=0)
            if size[key] > MAX_VALUES:
                raise YamlProblem(first_path.get(key, ()), node.start_mark.line + 1,
                                  f"its aliases expand to more than {MAX_VALUES:,} values "
                                  "(an alias bomb?): write the values out or use fewer aliases")
            if depth[key] > MAX_DEPTH:
                raise YamlProblem(first_path.get(key, ())[:3], node.start_mark.line + 1,
                                  f"{_TOO_DEEP}, once its aliases are expanded")
            continue
        if key in size:
            continue
        open_nodes.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in open_nodes:
                raise YamlProblem(first_path.get(id(child), ()), child.start_mark.line + 1,
                                  "an alias refers to a value that contains it (a recursive "
                                  "structure): no cluster setting can hold itself")
            if id(child) not in size:
                stack.append((child, False))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []
