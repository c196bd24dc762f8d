"""TensorFlow's start-up noise, folded to one line per task in the terminal.

Every TensorFlow worker prints 6-8 lines at import on a CPU host, some twice
(the C++ runtime logs before absl is initialised, then again): cuda drivers
not found, cuInit failed, oneDNN is on, CPU instructions, cuDNN/cuFFT/cuBLAS
factories, TensorRT missing. Times the workers of a job, they push its real
output off the screen. The terminal shows instead, once per task and start,
"… N lines of TensorFlow start-up messages in <log>", just before the task's
first other line (or at its exit); the log keeps every line.

Only lines known to be start-up notices are folded: an absl-format log line
(`I0000 00:00:… 123 port.cc:153] …` or the older `2025-01-01 …: I
tensorflow/…/port.cc:113] …`) from one of NOISY_SOURCES, or one of the
fixed sentences below; and, at any time, the warning a TF1 remote session
logs as each step's rendezvous is cleaned up (`local_rendezvous.cc:…] Local
rendezvous is aborting with status: ABORTED: Cleanup <id>`, logged at the 1st,
2nd, 4th… step of a process: dozens of lines in a legacy job's terminal, none
saying anything went wrong). An error from anywhere else (a collective abort, a
gRPC failure) is never folded.

Pure: no I/O. Must not import the launcher's other modules.
"""

from __future__ import annotations

import re

# The C++ files whose start-up notices are noise on hosts without a GPU (or with one).
NOISY_SOURCES = frozenset({
    "cudart_stub.cc", "port.cc", "cuda_platform.cc", "cuda_driver.cc", "cuda_executor.cc",
    "cpu_feature_guard.cc", "cuda_dnn.cc", "cuda_fft.cc", "cuda_blas.cc", "cuda_diagnostics.cc",
    "computation_placer.cc", "py_utils.cc",
})
_ABSL = re.compile(
    r"^(?:[IWE]\d{4} [\d:.]+\s+\d+ |\d{4}-\d\d-\d\d [\d:.]+: [IWE] \S*?)([\w.]+\.cc):\d+\] ")
_SENTENCES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "To enable the following instructions:",  # the second line of cpu_feature_guard's
    "TF-TRT Warning: Could not find TensorRT",
    "This TensorFlow binary is optimized to use available CPU instructions",
)


_CLEANUP = "Local rendezvous is aborting with status: ABORTED: Cleanup "


def is_startup_noise(text: str) -> bool:
    found = _ABSL.match(text)
    if found is not None:
        return found.group(1) in NOISY_SOURCES or (
            found.group(1) == "local_rendezvous.cc" and _CLEANUP in text)
    return text.startswith(_SENTENCES)


class NoiseFolder:
    """Per task label: which lines the terminal shows (`show`), and the fold
    line owed at its exit (`flush`). `enabled=False` (--verbose) shows all."""

    def __init__(self, enabled: bool = True) -> None:
        self._enabled = enabled
        self._held: dict[str, int] = {}  # label -> noise lines not yet said
        self._said: set[str] = set()  # labels whose fold line was shown this start

    def show(self, label: str, text: str, log: str) -> list[str]:
        if not self._enabled:
            return [text]
        if is_startup_noise(text):
            if label not in self._said:
                self._held[label] = self._held.get(label, 0) + 1
            return []  # after the fold line: in the log only
        return [*self._fold_line(label, log), text]

    def flush(self, label: str, log: str) -> list[str]:
        """The task exited: the fold line if still owed; its next start folds anew."""
        lines = self._fold_line(label, log)
        self._said.discard(label)
        return lines

    def _fold_line(self, label: str, log: str) -> list[str]:
        held = self._held.pop(label, 0)
        if not held:
            return []
        self._said.add(label)
        plural = "s" if held != 1 else ""
        return [f"… {held} line{plural} of TensorFlow start-up messages in {log}"]
