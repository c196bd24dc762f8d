"""The argument parser of every command: a usage error says the error first.

argparse prints the usage block, then the error on its last line: on a
terminal the one line that says what was wrong scrolls past a page of usage.
`Parser` prints `PROG: error: WHAT` first, then the usage, and exits 2 as
argparse does. `parser_for` builds a command's parser from its usage text;
`say` prints a command's own messages, `shown` a path in them, `silence_fds`
stops writes to a terminal or pipe that is gone. Standard library
only; every command's module may import it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn, TextIO

from .exits import USAGE


class Parser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose errors come before the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: error: {message}\n{self.format_usage()}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            try:
                sys.stderr.write(message)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
        raise SystemExit(status)


def parser_for(prog: str, text: str) -> Parser:
    """The parser of a command whose usage text is written out: its first line
    is the usage; after the blank line that follows, the description, shown as
    written (exit codes and all)."""
    return Parser(prog=prog, usage=text.split("\n", 1)[0], description=text.split("\n", 2)[2],
                  formatter_class=argparse.RawDescriptionHelpFormatter)


def say(text: str, stream: TextIO | None = None) -> None:
    """print() for the launcher's own messages: a closed or hung-up terminal
    must not turn a message into a traceback (or change the exit code)."""
    try:
        print(text, file=stream or sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def shown(path: Path) -> Path:
    """`path` relative to the current directory when it lies below it (shorter)."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def silence_fds(*fds: int) -> None:
    """Point `fds` at /dev/null: a pipe or terminal that is gone takes no more
    writes, and Python's flush of stdout at exit has nothing to complain about
    ("Exception ignored ... BrokenPipeError")."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        for fd in fds:
            try:
                os.dup2(null, fd)
            except OSError:
                pass
    finally:
        os.close(null)
