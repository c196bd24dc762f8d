"""`fit` holds back weights its loss spoiled (launcher/runtime/sentinel.py,
`hold_spoiled_weights`): the script's code after `fit` never runs on them.
The e2e side, a bad step at the end of `fit`, is in tests/test_sentinel.py."""

from __future__ import annotations

import pytest

from launcher.runtime import sentinel


def test_healthy_weights_return_at_once_and_spoiled_ones_never_past_the_bound(
        monkeypatch, capsys):
    monkeypatch.setattr(sentinel, "_spoiled", False)
    assert sentinel.hold_spoiled_weights(hold_s=30) is None  # no wait: it returns
    monkeypatch.setattr(sentinel, "_spoiled", True)
    monkeypatch.setattr(sentinel, "_spoiled_at", 239)
    with pytest.raises(RuntimeError, match="went bad at step 239 and the launcher did not "
                                           "stop this task within 0 s"):
        sentinel.hold_spoiled_weights(hold_s=0.05)
    assert "fit() ended after the loss went bad at step 239: its weights are not handed " \
        "back to the script" in capsys.readouterr().err
