"""A task's output as the user reads it: a progress bar's `\\r` run keeps its
final state (the epoch's loss), and a cut line says how much was cut.

Unit tests of launcher.outlines (pure, clock injected), then the real launcher
on tests/scripts/progress_bar.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launcher.outlines import LineSplitter
from tests.conftest import SCRIPTS, run_cli


def split(chunks: list[bytes], **kwargs) -> list[str]:
    splitter = LineSplitter(8192, **kwargs)
    lines = []
    for chunk in chunks:
        lines += splitter.feed(chunk)
    return lines + splitter.close()


def test_a_progress_bar_run_is_one_line_its_last_state():
    bar = b"".join(b"\b" * 20 + b"\r" + f"{i}/500 - loss: {i}".encode() for i in range(1, 501))
    assert len(bar) > 8192
    assert split([b"Epoch 1/1\n" + bar + b"\nnext\n"]) == ["Epoch 1/1", "500/500 - loss: 500",
                                                           "next"]


def test_an_overwritten_state_is_passed_on_every_few_seconds():
    now = [0.0]
    splitter = LineSplitter(8192, overwritten_every_s=10.0, clock=lambda: now[0])
    assert splitter.feed(b"\r1/3") == []
    now[0] = 11.0
    assert splitter.feed(b"\r2/3") == ["1/3"]  # a sign of life in a long epoch
    now[0] = 12.0
    assert splitter.feed(b"\r3/3  ") == []
    assert splitter.feed(b"\n") == ["3/3"]


def test_crlf_even_split_across_reads_ends_a_line():
    assert split([b"a\r", b"\nb\r\nc"]) == ["a", "b", "c"]
    assert split([b"bar\r", b"\r\n"]) == ["bar"]


def test_a_cut_line_counts_every_byte_cut():
    lines = split([b"x" * 5_000_000, b"x" * 5_000_000 + b"\nok\n"])
    assert lines[0] == "x" * 8192 + f" … [mgpu-launch: line cut, {10_000_000 - 8192} more bytes]"
    assert lines[1] == "ok"


@pytest.mark.e2e
def test_each_epochs_final_numbers_reach_terminal_and_log(workdir: Path):
    run_dir = workdir / "run"
    done = run_cli(["--local", "1", "--run-dir", str(run_dir), str(SCRIPTS / "progress_bar.py"),
                    "giant"], cwd=workdir, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (log,) = (run_dir / "logs").glob("*.log")
    for text in (done.stdout, log.read_text()):
        epochs = [line for line in text.splitlines() if "400/400" in line]
        assert len(epochs) == 2, [line[:200] for line in epochs]
        for n, line in zip((1, 2), epochs, strict=True):
            assert line.endswith(f"1s 2ms/step - loss: 0.{n}234 - acc: 0.9{n}00"), line[-200:]
            assert len(line) < 200 and "\r" not in line and "\b" not in line
        giant = [line for line in text.splitlines() if line.count("y") > 1000]
        assert len(giant) == 1
        assert re.search(r" … \[mgpu-launch: line cut, 9991808 more bytes\]$", giant[0]), \
            giant[0][-100:]
        assert "done" in text
