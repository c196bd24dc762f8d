"""Warm starts: a standby interpreter that has already imported TensorFlow.

Starting Python and importing TensorFlow is most of a task's start (5-9 s of
a restart on a small machine). While a generation trains, the agent keeps one
standby per task: `python [flags] -m launcher.bootstrap --standby`, started
with the same interpreter, flags, working directory, stdout/stderr pipes and
environment the task would get, except what the launcher sets per start
(`per_start`). It imports TensorFlow and nothing of the user's (TensorFlow
itself imports Keras 3, or tf_keras when TF_USE_LEGACY_KERAS is set, exactly
as in a cold task: KERAS_BACKEND and TF_USE_LEGACY_KERAS must be the task's)
and waits for one JSON message on stdin: the task's argv,
cwd and full environment. It applies them and goes on exactly as
`python -m launcher.bootstrap SCRIPT ARGS` does (same `__main__`, sys.argv,
sys.path[0], hooks, error file, exit code).

A standby is used only where it cannot change what the script sees:
- every environment variable is taken to be read when the interpreter starts
  or TensorFlow is imported (PYTHON*, LD_*, CUDA_VISIBLE_DEVICES, TF_CPP_*,
  TF_USE_LEGACY_KERAS, KERAS_BACKEND, OMP_*, ...) except TF_CONFIG and the
  launcher's MGPU_* variables, which only the runtime and TensorFlow's cluster
  setup read, later: any other difference means a cold start (`start_env_differences`);
- a script that writes such a variable itself (anywhere in its file, not only
  at its top: `os.environ[...] =`, `.update`, `.setdefault`, `.pop`, `del`,
  `os.putenv`) gets a cold start, unless the write changes nothing: a
  `setdefault` of a variable the task has, or the value it already has
  (`script_env_writes`, `env_write_problem`);
- except the script's leading defaults (`leading_presets`): constant
  `os.environ.setdefault(NAME, "value")` statements at the top of the file with
  nothing but standard-library imports before them (the digits example's
  `TF_USE_LEGACY_KERAS`): a default the script takes only where the
  environment has none, before anything else can read it. The standby starts
  with those defaults already taken (`with_presets`) and imports TensorFlow as
  the script would after them; the hand-off then restores the task's own
  environment and the script takes its defaults again, to the same values.
  An explicit `os.environ[NAME] = ...` still means a cold start (the script
  overrides its environment: the standby does not guess), and so do names the
  interpreter, the C library or the loader read at process start (PYTHON*,
  LD_*, LC_*, LANG, TZ, ...).
No TensorFlow context is created: devices (and GPU memory) are touched only
when the script first uses them, as in a cold start.

Shipped to hosts with the agent (launcher/agent/standbys.py imports it);
standard library only (TensorFlow is imported by `wait_for_task`, in the
standby only). Must not import the launcher side. `ast` is imported by the
functions that read a script, not at the top: the agent imports this module
when it starts, and `ast` would add ~3-5 ms to every agent's start-up (a
fan-out pays it once per host); only a task's first start reads its script.
"""

from __future__ import annotations

import json
import os
import sys

TYPE_CHECKING = False  # the typing module costs start-up time too
if TYPE_CHECKING:
    import ast

FLAG = "--standby"  # `python -m launcher.bootstrap --standby`
# The standby says it is ready (TensorFlow imported) on the fd this names: its
# progress pipe, which the agent reads the line from before any hand-off.
READY_FD = "MGPU_STANDBY_READY_FD"
READY = b'{"standby": "ready"}\n'
BOOTSTRAP = ("-m", "launcher.bootstrap")
EXIT_NO_TENSORFLOW = 97  # the standby could not import TensorFlow: cold starts instead


def per_start(name: str) -> bool:
    """May this variable differ between the standby's start and the task's?"""
    return name == "TF_CONFIG" or name.startswith("MGPU_")


def start_env_differences(standby_env: dict[str, str], task_env: dict[str, str]) -> list[str]:
    """The variables read at interpreter start or import whose values differ."""
    names = (set(standby_env) | set(task_env))
    return sorted(n for n in names if not per_start(n) and standby_env.get(n) != task_env.get(n))


def standby_argv(task_argv: list[str]) -> list[str] | None:
    """`[python, flags..., -m, launcher.bootstrap, --standby]` for a task run by
    the bootstrap (`[python, flags..., -m, launcher.bootstrap, SCRIPT, ...]`);
    None for any other command (a parameter server, a plain program)."""
    for at in range(1, len(task_argv) - 2):
        if tuple(task_argv[at:at + 2]) == BOOTSTRAP:
            if task_argv[at + 2] == FLAG or {"-c", "-m"} & set(task_argv[1:at]):
                return None
            return [*task_argv[:at + 2], FLAG]
    return None


def script_of(task_argv: list[str], cwd: str | None) -> str:
    """The script a bootstrap task runs, as an absolute path."""
    at = next(i for i in range(1, len(task_argv)) if tuple(task_argv[i:i + 2]) == BOOTSTRAP)
    return os.path.join(cwd or os.getcwd(), task_argv[at + 2])


# (name or None when computed, line, value when a constant or None, "set" or "setdefault")
EnvWrite = tuple[str | None, int, str | None, str]


def script_env_writes(path: str) -> list[EnvWrite]:
    """Every write to an environment variable that `path` may make, anywhere
    in its file (not only at its top: a `main()` may import TensorFlow too)."""
    tree = _parsed_if_it_names_the_environment(path)
    if tree is None:
        return []  # none; or unreadable: a warm start fails the very same way a cold one does
    import ast  # see the module docstring: only once a script is parsed

    return [(name, node.lineno, value, kind) for node in ast.walk(tree)
            for name, value, kind in _env_writes(node)]


# Every write `_env_writes` finds names one of these: a script whose text has
# none of them (and no non-ASCII byte, which NFKC could fold into one) writes no
# variable, and is not parsed: `ast` and the parse cost ~3-4 ms of a task's first
# start on its host (bench/fanout.py: at 32 hosts, after every host answered).
# Nor is one that only reads `environ` (`os.environ.get(...)`, TensorFlow's
# tutorials' `json.loads(os.environ["TF_CONFIG"])`): `_may_write_environment`.
_CALLED_WRITERS = (b"putenv", b"unsetenv")
_WRITER_METHODS = frozenset({b"setdefault", b"__setitem__", b"pop", b"__delitem__",
                             b"popitem", b"clear", b"update"})  # as in `_env_writes`
_AUGMENTED = (b"**=", b"//=", b">>=", b"<<=", b"+=", b"-=", b"*=", b"/=", b"%=", b"&=",
              b"^=", b"|=", b"@=")
_SPACE, _NAME = frozenset(b" \t\r\n\f"), frozenset(b"abcdefghijklmnopqrstuvwxyz"
                                                  b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _may_write_environment(source: bytes) -> bool:
    """Whether `_env_writes` may find a write in this ASCII source; False only
    when sure it finds none: no `putenv`, `unsetenv` nor `del`, and every
    `environ` in it followed by neither a writer method (`.update`, ...) nor a
    subscript that an assignment's `=`, `:` or augmented operator follows.
    Brackets, strings and comments are skipped as the tokenizer does; anything
    it cannot follow (a triple-quoted string, a line break in a string) counts
    as a write. Parentheses around the target (`(os.environ)["X"] = ...`) too."""
    import re  # loaded already in the agent (json); not at its top: the bootstrap imports this

    if any(name in source for name in _CALLED_WRITERS) or re.search(rb"\bdel\b", source):
        return True
    for found in re.finditer(rb"(?<!\w)environ(?!\w)", source):
        at = _skip(source, found.end(), closers=True)
        if source[at:at + 1] == b".":
            start = _skip(source, at + 1, closers=False)
            end = start
            while end < len(source) and source[end] in _NAME:
                end += 1
            if source[start:end] in _WRITER_METHODS or start == end:
                return True
        elif source[at:at + 1] == b"[":
            end = _past_brackets(source, at)
            if end is None:
                return True
            at = _skip(source, end, closers=True)
            follows = source[at:at + 3]
            if (follows[:1] == b"=" and follows[1:2] != b"=") or follows[:1] == b":" \
                    or follows.startswith(_AUGMENTED):
                return True
    return False


def _skip(source: bytes, at: int, closers: bool) -> int:
    """Past spaces, line breaks, continuations, comments (and with `closers`,
    closing parentheses) from `at`."""
    while at < len(source):
        byte = source[at]
        if byte in _SPACE or byte == 0x5C or (byte == 0x29 and closers):  # "\\" ")"
            at += 1  # a space, a line's continuation, a closing parenthesis
        elif byte == 0x23:  # "#": a comment, to its line's end
            end = source.find(b"\n", at)
            at = len(source) if end < 0 else end
        else:
            break
    return at


def _past_brackets(source: bytes, at: int) -> int | None:
    """The index after the `]` that closes the `[` at `at`; None when unsure."""
    depth = 0
    while at < len(source):
        byte = source[at]
        if byte in b"([{":
            depth += 1
        elif byte in b")]}":
            depth -= 1
            if depth == 0:
                return at + 1 if byte == 0x5D else None  # "]"
        elif byte in b"'\"":
            if source[at:at + 3] == bytes([byte]) * 3:
                return None  # a triple-quoted string: not followed here
            at += 1
            while at < len(source) and source[at] != byte:
                if source[at] == 0x0A:  # "\n" inside a one-line string
                    return None
                at += 2 if source[at] == 0x5C else 1  # "\\" escapes the next byte
            if at >= len(source):
                return None
        elif byte == 0x23:  # "#"
            end = source.find(b"\n", at)
            if end < 0:
                return None
            at = end
        at += 1
    return None


def _parsed_if_it_names_the_environment(path: str) -> ast.Module | None:
    """The script's syntax tree, or None: unreadable, not Python, or naming
    nothing that writes the environment."""
    try:
        with open(path, "rb") as handle:
            source = handle.read()
    except OSError:
        return None
    if source.isascii() and not _may_write_environment(source):
        return None
    import ast

    try:
        return ast.parse(source, filename=path)
    except (SyntaxError, ValueError):
        return None


# Read before any line of a script runs (interpreter, C library, dynamic loader):
# a script's own write to one of these changes nothing in its own process.
_PROCESS_START_PREFIXES = ("PYTHON", "LD_", "LC_", "MALLOC_")
_PROCESS_START_NAMES = frozenset({"LANG", "LANGUAGE", "TZ", "GLIBC_TUNABLES", "PATH",
                                  "HOME", "TMPDIR"})

# (name, value, "set" or "setdefault", line)
Preset = tuple[str, str, str, int]


def leading_presets(path: str) -> list[Preset]:
    """The constant `os.environ.setdefault` calls at the top of `path`, before
    any statement but a docstring, a standard-library import or another such
    call: nothing of the script, nor of any package, can have read them yet."""
    tree = _parsed_if_it_names_the_environment(path)
    if tree is None:
        return []
    import ast  # see the module docstring: only once a script is parsed

    presets: list[Preset] = []
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.Import | ast.ImportFrom) and _stdlib_only(node):
            continue
        call = node.value if isinstance(node, ast.Expr) else node
        writes = _env_writes(call) if isinstance(node, ast.Expr | ast.Assign) else []
        if len(writes) != 1:
            break
        name, value, kind = writes[0]
        if kind != "setdefault" or name is None or value is None or not _presettable(name):
            break
        presets.append((name, value, kind, node.lineno))
    return presets


def with_presets(env: dict[str, str], presets: list[Preset]) -> dict[str, str]:
    """`env` after the script's leading writes: what TensorFlow's import sees."""
    out = dict(env)
    for name, value, kind, _line in presets:
        if kind == "set" or name not in out:
            out[name] = value
    return out


def _presettable(name: str) -> bool:
    return not (per_start(name) or name in _PROCESS_START_NAMES
                or name.startswith(_PROCESS_START_PREFIXES))


def _stdlib_only(node: ast.Import | ast.ImportFrom) -> bool:
    import ast

    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and (node.module or "").split(".")[0] in _STDLIB
    return all(alias.name.split(".")[0] in _STDLIB for alias in node.names)


_STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}


def env_write_problem(path: str, writes: list[EnvWrite], env: dict[str, str]) -> str:
    """Why the script needs a cold start ("" if it does not): it writes a
    variable read at start-up, unless the write changes nothing in `env` (the
    task's): `setdefault` of a variable it has, or the value it already has."""
    for name, line, value, kind in writes:
        if name is not None and (per_start(name) or (name in env and (
                kind == "setdefault" or env[name] == value))):
            continue
        what = name if name is not None else "an environment variable it computes"
        return (f"{os.path.basename(path)} sets {what} itself (line {line}), which may be "
                "read when TensorFlow is imported")
    return ""


def _is_environ(node: ast.AST) -> bool:
    import ast

    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


def _key(node: ast.AST | None) -> str | None:
    import ast

    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _env_writes(node: ast.AST) -> list[tuple[str | None, str | None, str]]:
    """(name, constant value, kind) of each variable an ast node writes; name
    None: not known before the script runs."""
    import ast

    out: list[tuple[str | None, str | None, str]] = []
    value = _key(node.value) if isinstance(node, ast.Assign) else None
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = node.targets
    out += [(_key(t.slice), value, "set") for t in targets
            if isinstance(t, ast.Subscript) and _is_environ(t.value)]
    if not isinstance(node, ast.Call):
        return out
    func, args = node.func, node.args
    first = _key(args[0]) if args else None
    second = _key(args[1]) if len(args) > 1 else None
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if called == "putenv":  # os.putenv or a bare putenv imported from os
        out.append((first, second, "set"))
    elif called == "unsetenv":
        out.append((first, None, "set"))
    elif isinstance(func, ast.Attribute) and _is_environ(func.value):
        if func.attr == "setdefault":
            out.append((first, second, "setdefault"))
        elif func.attr == "__setitem__":
            out.append((first, second, "set"))
        elif func.attr in ("pop", "__delitem__"):
            out.append((first, None, "set"))
        elif func.attr in ("popitem", "clear"):
            out.append((None, None, "set"))
        elif func.attr == "update":
            out += [(kw.arg, _key(kw.value), "set") for kw in node.keywords]
            for arg in args:
                if isinstance(arg, ast.Dict):
                    pairs = zip(arg.keys, arg.values, strict=True)
                    out += [(_key(k), _key(v), "set") for k, v in pairs]
                else:
                    out.append((None, None, "set"))
    return out


# ---------------------------------------------------------------- in the standby


def wait_for_task() -> list[str]:
    """In the standby: import TensorFlow, wait for the hand-off, apply it;
    the task's `[SCRIPT, ARGS...]`. Exits quietly when the agent drops it."""
    try:
        import tensorflow  # noqa: F401  - the point: what a cold task pays at its start
    except BaseException:  # noqa: BLE001 - anything: this standby is no good, start cold
        os._exit(EXIT_NO_TENSORFLOW)
    ready_fd = os.environ.pop(READY_FD, "")
    if ready_fd:
        try:
            os.write(int(ready_fd), READY)  # a start handed to it now waits for nothing
        except (OSError, ValueError):
            pass
    raw = b""
    while True:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        raw += chunk
    if not raw:
        os._exit(0)  # the agent closed the pipe without a task: not needed any more
    message = json.loads(raw)
    _apply(message)
    return list(message["argv"])


def _apply(message: dict) -> None:
    if message.get("cwd"):
        os.chdir(message["cwd"])
    env = message["env"]
    for name in [n for n in os.environ if n not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value
    # stdin was the hand-off pipe; a cold task's stdin is /dev/null.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
