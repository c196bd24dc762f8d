"""The text scan that spares a task's first start the parse of its script
(launcher/standby.py, `_may_write_environment`): a script that only reads its
environment is not parsed; one that may write it always is, by the same rules
as the parse (`_env_writes`), whatever its layout."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import standby

REPO = Path(__file__).resolve().parent.parent

READS = [
    "import os\nprint('ran on', os.environ.get('MGPU_HOST', os.uname().nodename))\n",
    # TensorFlow's multi-worker tutorials
    "import json, os\ntf_config = json.loads(os.environ['TF_CONFIG'])\n",
    "import os\nif 'X' in os.environ:\n    pass\n",
    "import os\nsame = os.environ['A'] == 'b' or os.environ['B'] <= 'c'\n",
    "import os\nd = {}\nd[os.environ['K']] = 1\n",
    "import os\nprint(os.environ[\"a]b\"], os.environ.copy())\n",
    "from os import environ\nv = environ.get('X')\nw = environ['Y'] != 'z'\n",
    "import os\nfirst = os.environ['A'][0]\nn = len(os.environ)\n",
    "import os\nmy_environ = {}\nmy_environ['X'] = 1\nos.environment = 2\n",
]

WRITES = [
    "import os\nos.environ['X'] = '1'\n",
    "import os\n(os.environ)['X'] = '1'\n",
    "import os\nos.environ[\"a]b\"] = '1'\n",
    "import os\nos.environ['X'] += 'y'\n",
    "import os\nos.environ['X'] **= 'y'\n",
    "import os\nos.environ \\\n ['X'] = '1'\n",
    "import os\ndel os.environ['X']\n",
    "import os\nos.environ['X']: str = '1'\n",
    "import os\na = os.environ['X'] = '1'\n",
    "import os\n(os.environ  # a comment\n).update(A='1')\n",
    "import os\nos.environ.setdefault('A', '1')\n",
    "import os\nos . environ . pop('A')\n",
    "from os import environ\nenviron['A'] = 'x'\n",
    "import os\nos.environ[d['k']] = 'x'\n",
    "import os\nos.environ['''A'''] = 'x'\n",
    "import os\nos.environ[  # ] a comment\n 'A'] = 'x'\n",
    "import os\nos.environ.__setitem__('A', 'b')\n",
    "import os\nos.environ.clear()\n",
    "import os\nos.putenv('A', 'b')\n",
]


def writes_found(source: str) -> list:
    return [w for node in ast.walk(ast.parse(source)) for w in standby._env_writes(node)]


@pytest.mark.parametrize("source", READS)
def test_a_script_that_only_reads_its_environment_is_not_parsed(source, tmp_path, monkeypatch):
    assert writes_found(source) == []
    script = tmp_path / "train.py"
    script.write_text(source)
    parsed = []
    monkeypatch.setattr(ast, "parse", lambda *a, **k: parsed.append(a) or ast.Module([], []))
    assert standby.script_env_writes(str(script)) == []
    assert standby.leading_presets(str(script)) == []
    assert parsed == []


@pytest.mark.parametrize("source", WRITES)
def test_a_script_that_may_write_its_environment_is_parsed(source, tmp_path):
    assert standby._may_write_environment(source.encode())
    script = tmp_path / "train.py"
    script.write_text(source)
    found = standby.script_env_writes(str(script))
    assert found and [(name, value, kind) for name, _line, value, kind in found] \
        == writes_found(source)


def test_no_write_the_parse_finds_is_missed_across_the_standard_library():
    """Every standard-library module that names `environ`: where the parse
    finds a write, the scan says so (~70 files of many layouts)."""
    checked = 0
    stdlib = Path(sys.modules["os"].__file__).parent
    for path in stdlib.rglob("*.py"):
        if {"test", "tests", "site-packages", "idlelib"} & set(path.relative_to(stdlib).parts):
            continue
        source = path.read_bytes()
        if b"environ" not in source or not source.isascii():
            continue
        try:
            found = writes_found(source.decode())
        except (SyntaxError, ValueError):
            continue
        checked += 1
        if found:
            assert standby._may_write_environment(source), path
    assert checked > 50


def test_the_agent_imports_no_ast_for_a_script_that_only_reads(tmp_path):
    """As on a host: `python -S`, the standby module, a first start's two
    questions; `ast` (~3-8 ms of CPU to import) stays out."""
    script = tmp_path / "train.py"
    script.write_text(READS[1])
    probe = ("import sys; from launcher import standby; "
             f"standby.script_env_writes({str(script)!r}); "
             f"standby.leading_presets({str(script)!r}); print('ast' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True,
                          env=env, timeout=60, check=True)
    assert done.stdout.strip() == "False"
    script.write_text(WRITES[0])
    done = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True,
                          env=env, timeout=60, check=True)
    assert done.stdout.strip() == "True"  # the probe sees an import when there is one
