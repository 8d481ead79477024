"""A failing client costs one warning line, not a traceback: an EarlyStopping client callback on a metric the model
never logs printed 251 stderr lines before exit 1.

Such a client is dropped like any client whose own work fails (docs/architecture.md, "Failures"); when no client
is left, the round ends the run with one line (exit 1). ``LIGHTNING_FL_TRACEBACK=1`` logs each traceback.
"""

from __future__ import annotations

import logging

import pytest

from lightning_fl.cli import main
from lightning_fl.federation.failures import TRACEBACK_ENV
from tests.reliability.helpers import FAST, QUICKSTART

EARLY_STOPPING = "[{class_path: lightning.pytorch.callbacks.EarlyStopping, init_args: {monitor: no_such_metric}}]"


def _fit(run) -> list[str]:
    args = ["--loop.client_callbacks", EARLY_STOPPING, "--loop.clients_per_round", "2", "--loop.local_epochs", "1"]
    return ["fit", "--config", str(QUICKSTART), "--output_dir", str(run), *FAST, *args]


def test_each_failed_client_is_one_warning_and_no_traceback(tmp_path, capsys, caplog, recwarn, monkeypatch) -> None:
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    with caplog.at_level(logging.DEBUG, logger="lightning_fl"):
        assert main(_fit(tmp_path / "run")) == 1
    dropped = [str(w.message) for w in recwarn if "failed and is dropped" in str(w.message)]
    assert len(dropped) == 2 and all("no_such_metric" in message and "\n" not in message for message in dropped)
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING and r.exc_info]
    assert not loud, [r.getMessage() for r in loud]  # the tracebacks went to DEBUG only
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("lightning-fl: error: run failed: RuntimeError: round 0: only 0")


def test_the_traceback_of_a_failed_client_is_logged_when_asked(tmp_path, caplog, monkeypatch) -> None:
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    with caplog.at_level(logging.ERROR, logger="lightning_fl"), pytest.raises(RuntimeError, match="only 0 valid"):
        main(_fit(tmp_path / "run"))
    failed = [r for r in caplog.records if r.getMessage().startswith("client ") and r.exc_info]
    assert len(failed) == 2 and "no_such_metric" in str(failed[0].exc_info[1].__cause__)
