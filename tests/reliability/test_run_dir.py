"""A run directory is never overwritten without ``--overwrite true`` or ``--resume true`` (``fit``) or
``--overwrite true`` (``attack``), ``--overwrite true`` deletes only what a run wrote, a run of another format is
never resumed, and of several starts on one directory only one writes: the others exit with 2 and write nothing,
not even ``config.yaml``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading

import pytest

from lightning_fl.cli import main
from lightning_fl.federation.checkpoint import FORMAT
from lightning_fl.federation.loop import FederatedLoop
from lightning_fl.federation.run_dir import RUN_RECORD, check_run_dir, clear_run_dir
from tests.reliability.helpers import CONFIGS, FAST, QUICKSTART, one_error_line


def _fit(output_dir, *extra: str) -> list[str]:
    return [
        "fit",
        "-c",
        str(QUICKSTART),
        "--output_dir",
        str(output_dir),
        *FAST,
        "--data.num_clients",
        "4",
        "--loop.clients_per_round",
        "2",
        *extra,
    ]


def _files(run) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def _copy(run, to):
    for name, data in _files(run).items():
        (to / name).parent.mkdir(parents=True, exist_ok=True)
        (to / name).write_bytes(data)
    return to


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-round run."""
    run = tmp_path_factory.mktemp("finished") / "run"
    assert main(_fit(run, "--loop.num_rounds", "2")) == 0
    return run


def test_fit_into_a_finished_run_is_refused_and_leaves_it_as_it_was(finished, capsys) -> None:
    before = _files(finished)
    assert main(_fit(finished, "--seed_everything", "3")) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"output_dir={str(finished)!r} holds a run" in line
    assert "--resume true" in line and "another --output_dir" in line and "--overwrite true" in line
    assert "it finished its 2 rounds (--resume true with a larger --loop.num_rounds adds rounds)" in line
    assert _files(finished) == before


def test_overwrite_replaces_the_run_and_deletes_its_files(finished, tmp_path) -> None:
    run = _copy(finished, tmp_path / "run")
    assert main(_fit(run, "--overwrite", "true")) == 0
    assert json.loads((run / "summary.json").read_text())["rounds_completed"] == 1
    assert json.loads((run / "manifest.json").read_text())["round_idx"] == 1
    assert not [p for p in run.rglob("*r00002*")]  # the replaced run's last checkpoint is gone
    saved = (run / "config.yaml").read_text()
    assert "overwrite: false" in saved and "resume: false" in saved  # actions on a directory, not settings


def test_a_run_dir_that_is_empty_or_not_a_run_is_used_as_it_is(tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    check_run_dir(tmp_path, resume=False, overwrite=False)
    with pytest.raises(ValueError, match="contradict"):
        check_run_dir(tmp_path, resume=True, overwrite=True)


def test_a_start_that_loses_the_race_for_the_lock_writes_nothing_and_exits_with_2(tmp_path, capsys, monkeypatch):
    """The winner takes the lock while the loser is still checking its config: the loser must not write."""
    run, winner = tmp_path / "run", subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    prepare = FederatedLoop.prepare

    def prepare_then_lose(loop: FederatedLoop, **kwargs) -> None:
        prepare(loop, **kwargs)
        run.mkdir(exist_ok=True)
        loop.lock.path.write_text(json.dumps({"pid": winner.pid, "host": os.uname().nodename}))

    monkeypatch.setattr(FederatedLoop, "prepare", prepare_then_lose)
    try:
        assert main(_fit(run)) == 2
        assert f"pid {winner.pid}" in one_error_line(capsys.readouterr().err)
        assert [p.name for p in run.iterdir()] == [".lightning-fl.lock"]  # the winner's lock, nothing of ours
    finally:
        winner.kill()
        winner.wait()


def test_a_start_that_gets_the_lock_after_the_winner_finished_refuses(finished, tmp_path, capsys, monkeypatch):
    """The winner finished between the loser's first check and its lock: the loser still must not overwrite."""
    run = tmp_path / "run"
    prepare = FederatedLoop.prepare

    def prepare_then_winner_finishes(loop: FederatedLoop, **kwargs) -> None:
        prepare(loop, **kwargs)
        run.mkdir(exist_ok=True)
        (run / "summary.json").write_bytes((finished / "summary.json").read_bytes())

    monkeypatch.setattr(FederatedLoop, "prepare", prepare_then_winner_finishes)
    assert main(_fit(run)) == 2
    assert "holds a run" in one_error_line(capsys.readouterr().err)
    assert sorted(p.name for p in run.iterdir()) == ["summary.json"]


def _attack(output_dir, *extra: str) -> list[str]:
    fast = ["--data.image_size", "16", "--attack.init_args.max_iterations", "2", "--attack.init_args.restarts", "1"]
    return ["attack", "-c", str(CONFIGS / "dlg_lenet_digits.yaml"), "--output_dir", str(output_dir), *fast, *extra]


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """A finished standalone attack run."""
    run = tmp_path_factory.mktemp("attacked") / "run"
    assert main(_attack(run)) == 0
    return run


@pytest.mark.parametrize("which", ["attack run", "fit run"])
def test_attack_into_a_run_is_refused_and_leaves_it_as_it_was(attacked, finished, capsys, which: str) -> None:
    run = attacked if which == "attack run" else finished
    before = _files(run)
    capsys.readouterr()
    assert main(_attack(run, "--seed_everything", "3")) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"output_dir={str(run)!r} holds a run; use another --output_dir, or --overwrite true" in line
    assert "--resume" not in line  # attack cannot resume
    assert _files(run) == before


def test_attack_overwrite_replaces_the_attack_run(attacked, tmp_path) -> None:
    run = _copy(attacked, tmp_path / "run")
    assert main(_attack(run, "--overwrite", "true", "--seed_everything", "3")) == 0
    assert "seed_everything: 3" in (run / "config.yaml").read_text()
    assert "overwrite: false" in (run / "config.yaml").read_text()
    assert json.loads((run / "summary.json").read_text()) != json.loads((attacked / "summary.json").read_text())
    assert not (run / ".lightning-fl.lock").exists()


def test_overwrite_deletes_only_what_a_run_wrote_and_names_the_files_it_kept(finished, tmp_path) -> None:
    run = _copy(finished, tmp_path / "run")
    (run / "notes.txt").write_text("my notes")
    (run / "checkpoints" / "mine.ckpt").write_text("another tool's checkpoint")
    (run / "plots").mkdir()
    (run / "plots" / "figure.pdf").write_text("a figure")
    (run / "attacks").mkdir()
    (run / "attacks" / "my_plot.png").write_bytes(b"a user's plot, named as an attack grid")
    (run / "wandb" / "run-my-own-experiment").mkdir(parents=True)
    (run / "wandb" / "run-my-own-experiment" / "files.txt").write_text("a user's own W&B run")
    kept = (
        "kept 5 file(s) it did not write: attacks/my_plot.png, checkpoints/mine.ckpt, notes.txt, plots/figure.pdf, "
        "wandb/run-my-own-experiment/files.txt"
    )
    with pytest.warns(UserWarning, match=re.escape(kept)):
        assert main(_fit(run, "--overwrite", "true")) == 0
    assert (run / "notes.txt").read_text() == "my notes"
    assert (run / "checkpoints" / "mine.ckpt").exists() and (run / "plots" / "figure.pdf").exists()
    assert (run / "attacks" / "my_plot.png").exists() and (run / "wandb" / "run-my-own-experiment").is_dir()
    assert json.loads((run / "summary.json").read_text())["rounds_completed"] == 1


def test_overwrite_of_a_run_without_foreign_files_leaves_only_its_record(finished, tmp_path) -> None:
    run = _copy(finished, tmp_path / "run")
    clear_run_dir(run)
    assert [p.name for p in run.iterdir()] == [RUN_RECORD]


def test_overwrite_never_follows_a_symlink_out_of_the_run_directory(finished, tmp_path) -> None:
    outside = tmp_path / "pictures"
    outside.mkdir()
    for name in ("a.png", "b.png", "server_r00000.pt"):
        (outside / name).write_bytes(b"not the run's")
    run = _copy(finished, tmp_path / "run")
    (run / "attacks").symlink_to(outside, target_is_directory=True)  # a user's link, named as a run folder
    for name in os.listdir(run / "checkpoints"):  # the run's own folder swapped for a link after the run
        (outside / name).write_bytes(b"not the run's either")
    os.rename(run / "checkpoints", tmp_path / "moved")
    (run / "checkpoints").symlink_to(outside, target_is_directory=True)
    with pytest.warns(UserWarning, match="kept"):
        assert main(_fit(run, "--overwrite", "true")) == 0
    assert sorted(os.listdir(outside)) == sorted(
        {"a.png", "b.png", "server_r00000.pt", *os.listdir(tmp_path / "moved")}
    )
    assert (run / "attacks").is_symlink()


def test_a_record_naming_paths_outside_the_run_directory_deletes_nothing_there(finished, tmp_path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    run = _copy(finished, tmp_path / "run")
    record = json.loads((run / RUN_RECORD).read_text())
    record["written"] += ["../victim.txt", str(victim)]
    (run / RUN_RECORD).write_text(json.dumps(record))
    clear_run_dir(run)
    assert victim.read_text() == "keep me"


def test_overwrite_of_a_directory_that_no_run_recorded_is_refused(tmp_path, capsys) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.yaml").write_text("a project's own config, not a run's\n")
    assert main(_fit(project, "--overwrite", "true")) == 2
    assert "holds files of a run that recorded none of them" in one_error_line(capsys.readouterr().err)
    assert (project / "config.yaml").read_text() == "a project's own config, not a run's\n"
    assert [p.name for p in project.iterdir()] == ["config.yaml"]


def test_an_empty_output_dir_is_refused(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(_fit("")) == 2
    assert "output_dir='' is empty" in one_error_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


def test_fit_from_python_into_a_run_raises_unless_told_to_resume_or_overwrite(finished, tmp_path) -> None:
    run = _copy(finished, tmp_path / "run")
    before = _files(run)
    loop = _python_loop(run)
    with pytest.raises(ValueError, match=r"holds a run; it finished its 2 rounds \(--resume true with a larger"):
        loop.fit()
    assert _files(run) == before
    assert _python_loop(run).fit(overwrite=True)["rounds_completed"] == 1
    assert _python_loop(run, num_rounds=2).fit(resume=True)["rounds_completed"] == 2


def _python_loop(output_dir, **loop_options):
    from lightning_fl.datamodules import FederatedDataModule
    from tests.conftest import make_classifier

    dm = FederatedDataModule("digits", num_clients=3, partition="iid", image_size=8, batch_size=16, seed=0)
    options = {"num_rounds": 1, "clients_per_round": 3, "local_steps": 2, "eval_every": 0, **loop_options}
    return FederatedLoop(make_classifier(dm), dm, output_dir=output_dir, progress_bar=False, **options)


def _old_format(finished, tmp_path, version: int):
    run = _copy(finished, tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["format"] = version
    if version < FORMAT:  # format 1 stored plug-in classes, not their settings
        manifest["fingerprint"] = {k: v for k, v in manifest["fingerprint"].items() if not k.startswith("loop.")}
        manifest["fingerprint"]["loop.callbacks"] = []
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def _resume_refused(run, capsys) -> str:
    """The one error line of ``fit --resume true`` into ``run``, which must exit 2 and leave ``run`` as it was."""
    before = _files(run)
    capsys.readouterr()
    assert main(_fit(run, "--resume", "true", "--loop.num_rounds", "3")) == 2
    line = one_error_line(capsys.readouterr().err)
    assert _files(run) == before
    return line


@pytest.mark.parametrize(("version", "age"), [(1, "an older"), (FORMAT + 1, "a newer")])
def test_resume_of_a_run_of_another_format_is_refused_with_one_line(finished, tmp_path, capsys, version, age) -> None:
    line = _resume_refused(_old_format(finished, tmp_path, version), capsys)
    assert f"manifest.json' was written in format {version} by {age} lightning-fl" in line
    assert "another --output_dir (or --overwrite true)" in line


def test_fit_into_a_run_of_another_format_does_not_offer_resume(finished, tmp_path, capsys) -> None:
    run = _old_format(finished, tmp_path, 1)
    capsys.readouterr()
    assert main(_fit(run)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "it cannot be resumed (its manifest.json is of another lightning-fl version or damaged)" in line
    assert "use --resume true" not in line and "--overwrite true" in line


def test_resume_with_a_truncated_committed_checkpoint_names_it_and_writes_nothing(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path / "run")
    path = run / json.loads((run / "manifest.json").read_text())["server"]["path"]
    path.write_bytes(path.read_bytes()[:100])
    line = _resume_refused(run, capsys)
    assert f"checkpoint {str(path)!r} does not match the SHA-256 in the manifest (changed or truncated" in line
    assert "another --output_dir (or --overwrite true)" in line


def test_a_named_pipe_at_a_checkpoint_path_is_refused_in_one_line(finished, tmp_path, capsys) -> None:
    run = _copy(finished, tmp_path / "run")
    server = json.loads((run / "manifest.json").read_text())["server"]["path"]
    (run / server).unlink()
    os.mkfifo(run / server)
    unblock = threading.Timer(60, lambda: (run / server).write_bytes(b"x"))  # a hang ends, as a failure
    unblock.start()
    try:
        assert main(_fit(run, "--loop.num_rounds", "3", "--resume", "true")) == 2
    finally:
        unblock.cancel()
    assert "is not a regular file (a named pipe, device or folder)" in one_error_line(capsys.readouterr().err)


def test_test_refuses_a_global_model_with_non_finite_weights(finished, tmp_path, capsys) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(finished / "global_model.safetensors"))
    key = sorted(state)[0]
    state[key][0] = float("nan")
    save_file(state, str(tmp_path / "nan.safetensors"))
    args = ["test", "-c", str(QUICKSTART), "--data.image_size", "16", "--data.num_clients", "4"]
    assert main([*args, "--ckpt_path", str(tmp_path / "nan.safetensors")]) == 2
    assert f"holds non-finite weights (NaN or inf) in ['{key}']" in one_error_line(capsys.readouterr().err)


def test_attack_takes_a_fit_runs_trained_global_model(finished, tmp_path, capsys) -> None:
    from safetensors.torch import load_file, save_file

    attack = ["attack", "-c", str(CONFIGS / "idlg_lenet_digits.yaml"), "--attack.init_args.max_iterations", "3"]
    attack += ["--attack.init_args.progress_bar", "false", "--data.num_clients", "4"]
    trained = str(finished / "global_model.safetensors")
    run = tmp_path / "trained"
    assert main([*attack, "--data.image_size", "16", "--ckpt_path", trained, "--output_dir", str(run)]) == 0
    assert f"ckpt_path: {trained}" in (run / "config.yaml").read_text()
    assert main([*attack, "--ckpt_path", trained, "--output_dir", str(tmp_path / "size")]) == 2
    assert "does not fit the configured model" in one_error_line(capsys.readouterr().err)
    state = load_file(trained)
    key = sorted(state)[0]
    state[key][0] = float("nan")
    save_file(state, str(tmp_path / "nan.safetensors"))
    nan = ["--data.image_size", "16", "--ckpt_path", str(tmp_path / "nan.safetensors")]
    assert main([*attack, *nan, "--output_dir", str(tmp_path / "nan")]) == 2
    assert f"holds non-finite weights (NaN or inf) in ['{key}']" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "nan").exists() and not (tmp_path / "size").exists()
