"""README.md and docs/: short README, pages that say what they answer, working
links, and every command marked runnable runs as written.

Conventions (docs/development.md, "The docs and their runnable commands"):
`<!-- runnable -->` on the line before a fenced bash block marks it runnable;
`<!-- runnable: needs sshd -->` also needs OpenSSH's sshd (.ci/run installs it);
`<!-- file: NAME -->` before a fenced block writes its text to NAME in the
page's directory before the page's runnable blocks run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
# Linked into each page's temporary directory, so commands read as in a checkout.
LINKED = ("cluster_configs", "examples", "docker")
# Over `check`'s own collective bound (60 s, check_collective.DEFAULT_TIMEOUT_S) plus
# simulate's start and stop, so a slow block shows check's diagnosis, not a bare
# timeout; ~10x what the longest block takes on a quiet machine (~10 s).
BLOCK_TIMEOUT_S = 120

QUICK_START = (
    "python3 -m venv .venv && source .venv/bin/activate && pip install -e '.[examples]' && "
    "mgpu-launch --local 2 examples/digits/train.py",
    "bash .ci/run",
)
TEST_COMMAND = ".venv/bin/python -m pytest -q -p no:cacheprovider --durations=20 tests"

FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)(?P<lang>[\w-]*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*(?P<kind>runnable|file)(?::\s*(?P<arg>[^>]*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None  # "runnable" | "file" | None
    arg: str | None  # "needs sshd" | the file name | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, each with the marker on the line before it."""
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            line = lines[j]
            body.append(line[indent:] if not line[:indent].strip() else line.lstrip())
            j += 1
        marker = MARKER.match(lines[i - 1]) if i else None
        found.append(Block(page, i + 1, match["lang"], "\n".join(body) + "\n",
                           marker["kind"] if marker else None,
                           marker["arg"] if marker else None))
        i = j + 1
    return found


def _id(page: Path) -> str:
    return str(page.relative_to(REPO))


# ----------------------------------------------------------------- the README


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail to docs/"


def test_readme_keeps_the_quick_start_and_the_test_command():
    text = README.read_text()
    shell = "\n".join(b.text for b in blocks(README) if b.lang == "bash")
    for command in QUICK_START:
        assert any(line.strip() == command for line in shell.splitlines()), command
    # CI runs "the test command written in README.md", under "Running the tests".
    section = text.split("## Running the tests", 1)[1].split("\n## ", 1)[0]
    assert f"\n{TEST_COMMAND}\n" in section


# -------------------------------------------------------------- every page


def test_docs_exist_and_are_linked_from_the_readme():
    readme = README.read_text()
    pages = sorted(DOCS.glob("*.md"))
    assert len(pages) >= 10, pages
    for page in pages:
        assert f"(docs/{page.name})" in readme, f"README.md does not link {page.name}"


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=_id)
def test_each_page_starts_with_the_question_it_answers(page):
    lines = page.read_text().splitlines()
    assert lines[0].startswith("# "), f"{page.name}: first line is not a title"
    paragraph = []
    for line in lines[1:]:
        if line.strip():
            paragraph.append(line.strip())
        elif paragraph:
            break
    question = " ".join(paragraph)
    assert question.endswith("?"), f"{page.name}: the first paragraph is not a question: " \
                                   f"{question[:120]!r}"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    anchors = set()
    in_fence = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        if in_fence or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        anchors.add(slug)
    return anchors


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_links_point_to_files_and_headings_that_exist(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for match in LINK.finditer(text):
        target = match["target"]
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_no_page_points_to_a_design_md_outside_the_repository():
    for page in PAGES:
        for line in page.read_text().splitlines():
            assert "DESIGN.md" not in line, f"{page.name}: {line}"


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_yaml_blocks_parse(page):
    import yaml
    for block in blocks(page):
        if block.lang == "yaml":
            try:
                yaml.safe_load(block.text)
            except yaml.YAMLError as exc:
                pytest.fail(f"{block.where}: not valid YAML: {exc}")


def test_cluster_files_in_the_docs_use_only_known_keys():
    """Every key of a whole cluster file shown in the docs exists in the schema."""
    import yaml

    from launcher.spec.config import ClusterConfig

    def unknown(model, data, path=""):
        out = []
        for key, value in data.items():
            field = model.model_fields.get(key)
            if field is None:
                out.append(f"{path}{key}")
                continue
            sub = next((a for a in (field.annotation, *getattr(field.annotation, "__args__", ()))
                        if isinstance(a, type) and hasattr(a, "model_fields")), None)
            if sub is not None and isinstance(value, dict):
                out += unknown(sub, value, f"{path}{key}.")
            elif key == "hosts" and isinstance(value, list):
                host = ClusterConfig.model_fields["hosts"].annotation.__args__[0]
                for i, item in enumerate(value):
                    out += unknown(host, item, f"hosts[{i}].")
        return out

    problems = []
    for page in PAGES:
        for block in blocks(page):
            if block.lang != "yaml":
                continue
            data = yaml.safe_load(block.text)
            if not isinstance(data, dict) or "hosts" not in data:
                continue  # a fragment
            bad = list(unknown(ClusterConfig, data))
            if bad:
                problems.append(f"{block.where}: unknown keys {bad}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------- runnable blocks


def _runnable_pages() -> list[Path]:
    return [p for p in PAGES if any(b.marker == "runnable" for b in blocks(p))]


def _shim(bin_dir: Path) -> None:
    """`mgpu-launch` running this checkout's code with the test's Python."""
    bin_dir.mkdir()
    shim = bin_dir / "mgpu-launch"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m launcher "$@"\n')
    shim.chmod(0o755)


def _sshd_available() -> bool:
    return bool(os.environ.get("MGPU_SSHD") or shutil.which("sshd")
                or Path("/usr/sbin/sshd").exists())


def test_every_page_with_commands_has_runnable_ones():
    assert {p.name for p in _runnable_pages()} >= {
        "README.md", "cluster-file.md", "ssh.md", "slurm.md", "export-and-docker.md",
        "operations.md"}


@pytest.mark.parametrize("page", _runnable_pages(), ids=_id)
def test_runnable_blocks_run_as_written(page, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for name in LINKED:
        (work / name).symlink_to(REPO / name)
    _shim(tmp_path / "bin")
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(tmp_path / "bin"), str(Path(sys.executable).parent),
                                   env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.pop("NO_COLOR", None)
    page_blocks = blocks(page)
    for block in page_blocks:
        if block.marker == "file":
            (work / block.arg).write_text(block.text)
    ran = 0
    for block in page_blocks:
        if block.marker != "runnable":
            continue
        assert block.lang in ("bash", "sh"), f"{block.where}: runnable blocks are bash"
        # .ci/run installs openssh-server: a missing sshd is a broken setup, not a skip.
        assert block.arg != "needs sshd" or _sshd_available(), "sshd not found"
        out = tmp_path / f"out-{block.line}.txt"
        # Output to a file, not a pipe: `simulate --detach` leaves sshds running
        # until the block's last command, and they must not hold our pipe.
        with open(out, "w") as handle:
            try:
                done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text],
                                      cwd=work, env=env, stdout=handle,
                                      stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT_S)
                code = done.returncode
            except subprocess.TimeoutExpired:
                code = f"timeout after {BLOCK_TIMEOUT_S} s"
            finally:
                if block.arg == "needs sshd" and (work / "sim").exists():
                    subprocess.run([sys.executable, "-m", "launcher", "simulate", "stop",
                                    "--dir", "sim"], cwd=work, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   timeout=30)
        assert code == 0, (f"{block.where}: exit {code}\n--- block:\n{block.text}"
                           f"--- output:\n{out.read_text()[-3000:]}")
        ran += 1
    assert ran, f"{page}: no runnable block ran"


# Code comments must point to docs/design.md, not to a DESIGN.md outside the repository.
def test_code_cites_docs_design_not_a_missing_design_md():
    cited = [f"{path.relative_to(REPO)}:{number}"
             for path in sorted((REPO / "launcher").rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if "DESIGN.md" in line]
    assert not cited, f"cite docs/design.md instead: {cited}"
