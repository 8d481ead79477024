"""Exit codes of ``lightning-fl``: 2 bad config, 1 run-time failure, 130 interrupted; each with one line."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest
import torch

from lightning_fl import cli_run as cli  # the subcommands run there (TRACEBACK_ENV, _quiet)
from lightning_fl.cli import main
from lightning_fl.federation.loop import FederatedLoop
from lightning_fl.federation.round import Round
from tests.reliability.helpers import FAST, QUICKSTART, one_error_line

REPO = QUICKSTART.parents[1]


def _fit(output_dir, *extra: str) -> list[str]:
    return ["fit", "--config", str(QUICKSTART), "--output_dir", str(output_dir), *FAST, *extra]


def _fail_round(*_: object, **__: object) -> None:
    raise RuntimeError("round 0: only 0 valid client updates")


def test_a_failure_after_training_started_exits_with_1_and_one_line(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv(cli.TRACEBACK_ENV, raising=False)
    monkeypatch.setattr(Round, "run", _fail_round)
    assert main(_fit(tmp_path)) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "run failed: RuntimeError: round 0: only 0 valid client updates" in line and cli.TRACEBACK_ENV in line


def test_a_wrong_eval_metric_is_rejected_before_training(tmp_path, capsys) -> None:
    assert main(_fit(tmp_path / "run", "--loop.eval_metric", "nope")) == 2
    assert "loop.eval_metric='nope' was not logged by ImageClassifier.test_step" in one_error_line(
        capsys.readouterr().err
    )
    assert not (tmp_path / "run").exists()


def test_a_setup_time_error_of_a_component_exits_with_2(tmp_path, capsys) -> None:
    args = [
        "--loop.client_transforms",
        '[{"class_path": "lightning_fl.defences.PaillierEncryption", "init_args": {"key_size": 256}}]',
    ]
    assert main(_fit(tmp_path / "run", *args)) == 2
    assert "FedAvg cannot read Paillier ciphertexts" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_a_full_disk_exits_with_1_and_one_line(tmp_path, capsys, monkeypatch) -> None:
    def no_space(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.delenv(cli.TRACEBACK_ENV, raising=False)
    monkeypatch.setattr(torch, "save", no_space)  # the first checkpoint write, after round 0
    assert main(_fit(tmp_path)) == 1
    assert "run failed: OSError: [Errno 28] No space left on device" in one_error_line(capsys.readouterr().err)


def test_the_traceback_env_shows_the_failure_itself(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(cli.TRACEBACK_ENV, "1")
    monkeypatch.setattr(Round, "run", _fail_round)
    with pytest.raises(RuntimeError, match=r"only 0 valid client updates"):
        main(_fit(tmp_path))


def _interrupt(*_: object, **__: object) -> None:
    raise KeyboardInterrupt


def _interrupt_like_lightning(*_: object, **__: object) -> None:
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        sys.exit(1)  # what lightning.pytorch.trainer.call does on Ctrl+C inside Trainer.fit


@pytest.mark.parametrize("fit", [_interrupt, _interrupt_like_lightning], ids=["in the loop", "inside Trainer.fit"])
def test_an_interrupt_exits_with_130_and_one_line(tmp_path, capsys, monkeypatch, fit) -> None:
    monkeypatch.setattr(FederatedLoop, "fit", fit)
    assert main(_fit(tmp_path)) == 130
    assert capsys.readouterr().err.strip() == (
        "lightning-fl: interrupted; a fit run continues from its last completed round with --resume true."
    )


def test_the_cli_shows_the_toolkits_warnings_and_hides_lightnings(recwarn) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        cli._quiet()
        warnings.warn_explicit("client 3 dropped", UserWarning, "loop.py", 1, module="lightning_fl.federation.loop")
        warnings.warn_explicit("few workers", UserWarning, "data.py", 1, module="lightning.pytorch.trainer")
    assert [str(w.message) for w in recwarn] == ["client 3 dropped"]


def _as_in_a_terminal() -> None:
    """Start the command with SIGINT at its default, as a terminal does: the command keeps a SIGINT its parent
    ignores ignored (a background job's), and an in-process test may have left this pytest worker ignoring it
    (Lightning ignores SIGINT after a KeyboardInterrupt in ``Trainer.fit``)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _command(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    return subprocess.Popen(
        [sys.executable, "-m", "lightning_fl.cli", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_in_a_terminal,
    )


def test_the_command_exits_with_2_and_one_line_on_a_bad_config(tmp_path) -> None:
    process = _command("fit", "-c", str(QUICKSTART), "--output_dir", str(tmp_path / "run"), "--data.alpha", "abc")
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 2
    assert "data.alpha='abc' is invalid" in one_error_line(stderr)
    assert not (tmp_path / "run").exists()


def _rounds(summary) -> int:
    try:
        return json.loads(summary.read_text())["rounds_completed"]
    except (OSError, ValueError):
        return 0


@pytest.mark.parametrize(
    ("sig", "rc", "word"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
    ids=["INT", "TERM"],
)
def test_a_signal_during_training_exits_with_one_line_and_a_resumable_run(tmp_path, sig, rc, word) -> None:
    run = tmp_path / "run"
    process = _command(*_fit(run)[:-6], "--loop.num_rounds", "200", "--data.image_size", "16")
    summary, deadline = run / "summary.json", time.monotonic() + 120
    while _rounds(summary) < 1 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _rounds(summary) >= 1, process.communicate()[1]
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == rc
    assert stderr.strip().splitlines() == [
        f"lightning-fl: {word}; a fit run continues from its last completed round with --resume true."
    ]
    assert not list(run.rglob("*.tmp")) and not (run / ".lightning-fl.lock").exists()
    committed = json.loads((run / "manifest.json").read_text())["round_idx"]
    assert committed - 1 <= _rounds(summary) <= committed


def _importing_torch(pid: int) -> bool:
    """Whether process ``pid`` has begun loading torch's libraries (the command's imports are under way)."""
    try:
        return "libtorch" in open(f"/proc/{pid}/maps").read()
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_while_the_command_imports_exits_with_143(tmp_path) -> None:
    process = _command(*_fit(tmp_path / "run"))
    deadline = time.monotonic() + 60
    while not _importing_torch(process.pid) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    process.send_signal(signal.SIGTERM)  # torch and Lightning are still importing: main() has not started
    process.communicate(timeout=60)
    assert process.returncode == 143
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a whole run in a subprocess
def test_sigint_after_the_last_round_exits_with_130(tmp_path) -> None:
    process = _command(*_fit(tmp_path / "run"))
    for line in process.stdout:
        if line.startswith("summary:"):  # the last line main() prints before it returns
            time.sleep(0.2)  # the interpreter shuts down: Python's own handlers are gone then
            process.send_signal(signal.SIGINT)
            break
    process.communicate(timeout=60)
    assert process.returncode in (0, 130)  # done, or interrupted while exiting: never killed by the signal (-2)
