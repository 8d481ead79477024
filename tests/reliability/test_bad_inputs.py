"""The bad-input table: every rejected config exits with 2 and one line naming the key, before writing anything.

Each case runs ``lightning_fl.cli.main`` in-process on the quickstart config (or the DLG attack config) with one
thing wrong, and checks: exit code 2, exactly one line on stderr, that line names the key, no traceback, and
the run directory was not created (no config.yaml, no checkpoints).
"""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_fl.cli import main
from tests.reliability.helpers import CONFIGS, QUICKSTART, one_error_line

pytestmark = pytest.mark.usefixtures("cwd_with_finished_runs")  # the default run folders hold finished runs


@pytest.fixture(autouse=True)
def _no_process_is_launched(monkeypatch) -> None:
    """No case may start DDP ranks; should a check regress, the launch fails instead of forking the machine."""

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a bad input reached Fabric.launch")

    monkeypatch.setattr(L.Fabric, "launch", refuse)


LEAKAGE = "{class_path: lightning_fl.callbacks.GradientLeakage, init_args: {attack: {class_path: lightning_fl.attacks.DLGAttack}, %s}}"  # noqa: E501

FIT_CASES = {
    # wrong types: jsonargparse's reason, with the full key put back
    "seed not an integer": (["--seed_everything", "abc"], "seed_everything='abc' is invalid: expected an integer"),
    "num_clients not an integer": (["--data.num_clients", "abc"], "data.num_clients='abc' is invalid"),
    "batch_size a fraction": (["--data.batch_size", "1.5"], "data.batch_size='1.5' is invalid"),
    "alpha not a number": (["--data.alpha", "abc"], "data.alpha='abc' is invalid: expected a number"),
    "unknown partition": (["--data.partition", "foo"], "data.partition='foo' is invalid: expected one of 'iid'"),
    "unknown optimizer": (["--model.init_args.optimizer", "rmsprop"], "model.init_args.optimizer='rmsprop'"),
    "lr not a number": (["--model.init_args.lr", "abc"], "model.init_args.lr='abc' is invalid"),
    "unknown eval_on": (["--loop.eval_on", "foo"], "loop.eval_on='foo' is invalid: expected one of 'global'"),
    "unknown wandb_mode": (["--loop.wandb_mode", "foo"], "loop.wandb_mode='foo' is invalid"),
    "num_rounds not an integer": (["--loop.num_rounds", "abc"], "loop.num_rounds='abc' is invalid"),
    "clients_per_round text": (["--loop.clients_per_round", "abc"], "loop.clients_per_round='abc' is invalid"),
    "local_steps text": (["--loop.local_steps", "abc"], "loop.local_steps='abc' is invalid"),
    "checkpoint not a bool": (["--loop.checkpoint", "maybe"], "loop.checkpoint='maybe' is invalid"),
    "resume not a bool": (["--resume", "maybe"], "resume='maybe' is invalid: expected true or false"),
    "trainer mapping without spaces": (["--loop.trainer", "{accelerator:cpu}"], "space after each colon"),
    "aggregator not a class path": (["--loop.aggregator", "NoSuchAgg"], "loop.aggregator: "),
    "model class path unknown": (["--model.class_path", "nope.Model"], "model (class_path 'nope.Model')"),
    "model option misspelt": (["--model.init_args.lrr", "0.1"], "model.init_args.lrr is not an option"),
    "defence option far from any": (
        ["--defences", "[{class_path: lightning_fl.defences.GaussianNoise, init_args: {std: 0.01}}]"],
        "defences.init_args.std is not an option of lightning_fl.defences.GaussianNoise; its options: noise_std, unit.",
    ),
    "loop key unknown": (["--loop.no_such_key", "1"], "--loop.no_such_key"),
    "loop key abbreviated": (["--loop.num_round", "2"], "--loop.num_round"),
    "data key abbreviated": (["--data.num", "3"], "--data.num"),
    "config file missing": (["--config", "no/such/config.yaml"], "config: File does not exist"),
    # wrong values
    "no clients": (["--data.num_clients", "0"], "data.num_clients=0 must be >= 1"),
    "empty batches": (["--data.batch_size", "0"], "data.batch_size=0"),
    "validation share of 150%": (["--data.val_fraction", "1.5"], "data.val_fraction=1.5 must be in [0, 1)"),
    "Dirichlet alpha 0": (["--data.alpha", "0"], "data.alpha=0.0 must be a finite number > 0"),
    "unknown dataset": (["--data.dataset", "no-such-data"], "data.dataset='no-such-data'"),
    "unknown backbone": (["--model.init_args.backbone", "resnet9000"], "backbone='resnet9000' is unknown"),
    "negative lr": (["--model.init_args.lr", "-1"], "model.init_args.lr=-1.0 must be a finite number > 0"),
    "NaN lr": (["--model.init_args.lr", ".nan"], "model.init_args.lr=nan must be a finite number > 0"),
    "infinite lr": (["--model.init_args.lr", ".inf"], "model.init_args.lr=inf must be a finite number > 0"),
    "zero rounds": (["--loop.num_rounds", "0"], "loop.num_rounds=0 trains nothing"),
    "negative rounds": (["--loop.num_rounds", "-1"], "loop.num_rounds=-1 trains nothing"),
    "more clients per round than clients": (["--loop.clients_per_round", "20"], "loop.clients_per_round=20 exceeds"),
    "fraction above one": (["--loop.clients_per_round", "1.5"], "loop.clients_per_round=1.5 as a fraction"),
    "zero local epochs": (["--loop.local_epochs", "0"], "loop.local_epochs=0 must be >= 1"),
    "zero local steps": (["--loop.local_steps", "0"], "loop.local_steps=0 must be >= 1"),
    "zero min_clients": (["--loop.min_clients", "0"], "loop.min_clients=0 must be between 1"),
    "negative eval_every": (["--loop.eval_every", "-1"], "loop.eval_every=-1 must be >= 0"),
    "trainer option misspelt": (["--loop.trainer", "{acelerator: cpu}"], "loop.trainer.acelerator is not an option"),
    "trainer option owned by the loop": (["--loop.trainer", "{max_epochs: 3}"], "loop.trainer.max_epochs is set by"),
    "unknown precision": (["--loop.trainer", "{precision: bf17}"], "loop.trainer={'precision': 'bf17'} is rejected"),
    "unknown strategy": (["--loop.trainer", "{strategy: nope}"], "loop.trainer={'strategy': 'nope'} is rejected"),
    "resume with nothing to resume": (["--resume", "true"], "resume=true but"),
    "attack round that never runs": (["--loop.callbacks", f"[{LEAKAGE % 'rounds: [99]'}]"], "rounds has [99]"),
    "attack client that does not exist": (["--loop.callbacks", f"[{LEAKAGE % 'clients: [99]'}]"], "clients has [99]"),
    "negative attack round": (["--loop.callbacks", f"[{LEAKAGE % 'rounds: [-1]'}]"], "rounds=[-1]"),
    "image_size 0": (["--data.image_size", "0"], "data.image_size=0 must be >= 1"),
    "negative image_size": (["--data.image_size", "-8"], "data.image_size=-8 must be >= 1"),
    "image_size beyond memory": (["--data.image_size", "100000"], "data.image_size=100000 would need"),
    "negative seed": (["--seed_everything", "-1"], "seed_everything=-1 must be between 0 and 4294967295"),
    "Dirichlet alpha NaN": (["--data.alpha", ".nan"], "data.alpha=nan must be a finite number > 0"),
    "Dirichlet alpha infinite": (["--data.alpha", ".inf"], "data.alpha=inf must be a finite number > 0"),
    "train_loss_key not logged": (
        ["--loop.train_loss_key", "nope"],
        "loop.train_loss_key='nope' was not logged by ImageClassifier.training_step; logged: ['train_loss']",
    ),
    "attack step that never runs": (
        ["--loop.callbacks", f"[{LEAKAGE % 'leak_point: local_gradient, step_indices: [100000]'}]"],
        "step_indices has [100000], which never run: a client takes at most",
    ),
    "workers with a local-gradient attack": (
        ["--loop.workers", "2", "--loop.callbacks", f"[{LEAKAGE % 'leak_point: local_gradient'}]"],
        "loop.workers=2 (backend 'processes', 1 DDP process(es)) cannot tap local gradients",
    ),
    "negative clients per round": (["--loop.clients_per_round", "-2"], "loop.clients_per_round=-2 must be >= 1"),
    "misspelt key on the command line": (["--data.alpah", "3"], "--data.alpah 3; did you mean --data.alpha?"),
    "data.root missing for an embedded dataset": (
        ["--data.root", "/no/such/root"],
        "data.root='/no/such/root' is not a folder, and data.dataset='digits' does not read it",
    ),
    "data.root missing without download": (
        ["--data.root", "/no/such/root", "--data.dataset", "mnist", "--data.download", "false"],
        "data.root='/no/such/root' is not a folder and data.download is false",
    ),
    "misspelt model class": (
        ["--model.class_path", "lightning_fl.models.ImageClasifier"],
        "has no attribute 'ImageClasifier'; did you mean 'lightning_fl.models.ImageClassifier'?",
    ),
    "a layer given as a defence": (
        ["--defences", "[{class_path: lightning_fl.defences.KeyLock}]"],
        "KeyLock does not correspond to a subclass of Defence; did you mean 'lightning_fl.defences.KeyLocks'?",
    ),
    "a schedule a class refuses, inside a union": (
        [
            "--defences",
            "[{class_path: lightning_fl.defences.FedCDP, init_args: {max_grad_norm: {class_path: "
            "lightning_fl.privacy.Schedule, init_args: {start: 6, end: -2, kind: linear, num_rounds: 10}}}}]",
        ],
        "Schedule(start=6.0, end=-2.0): a clip bound or noise multiplier must stay a finite number > 0; set the "
        "schedule's init_args.start and init_args.end to positive values (e.g. start: 6.0, end: 2.0).",
    ),
    "a user model built for other images": (
        ["--model.class_path", "tests.user_project.DigitsNet", "--model.init_args", "{}", "--data.image_size", "16"],
        "model DigitsNet does not take the data's inputs of shape (32, 1, 16, 16) (mat1 and mat2 shapes",
    ),
    "more CPU devices than exist": (
        ["--loop.trainer", "{accelerator: cpu, strategy: ddp, devices: 100000}"],
        "loop.trainer.devices=100000 asks for 100000 processes on this machine",
    ),
}


@pytest.mark.parametrize(("args", "message"), FIT_CASES.values(), ids=FIT_CASES.keys())
def test_fit_rejects_bad_input_with_one_line_before_writing(tmp_path, capsys, args: list[str], message: str) -> None:
    run = tmp_path / "run"
    rc = main(["fit", "--config", str(QUICKSTART), "--output_dir", str(run), "--loop.progress_bar", "false", *args])
    assert rc == 2
    assert message in one_error_line(capsys.readouterr().err)
    assert not run.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_fit_rejects_an_accelerator_the_machine_lacks(tmp_path, capsys) -> None:
    args = ["--output_dir", str(tmp_path / "run"), "--loop.trainer", "{accelerator: gpu}"]
    rc = main(["fit", "-c", str(QUICKSTART), *args])
    assert rc == 2
    assert "loop.trainer.accelerator='gpu' is not available on this machine" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda run: run.write_text("a file"), "is a file, not a directory"),
        (lambda run: (run.parent / "file").write_text("a file"), "lies under the file"),
    ],
    ids=["output_dir is a file", "output_dir under a file"],
)
def test_fit_rejects_an_output_dir_it_cannot_create(tmp_path, capsys, setup, message: str) -> None:
    run = tmp_path / "run"
    setup(run)
    target = run if run.exists() else run.parent / "file" / "run"
    rc = main(["fit", "-c", str(QUICKSTART), "--output_dir", str(target)])
    assert rc == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"output_dir={str(target)!r}" in line and message in line


@pytest.mark.parametrize(
    ("right", "wrong", "message"),
    [
        ("num_rounds: 25", "num_round: 2", "does not accept option 'loop.num_round'; did you mean 'loop.num_rounds'?"),
        ("  alpha: 0.5", "  alpah: 0.5", "does not accept option 'data.alpah'; did you mean 'data.alpha'?"),
        ("backbone: lenet_dlg", "backbon: lenet_dlg", "model.init_args.backbon is not an option of"),
        ("accelerator: cpu", "acelerator: cpu", "loop.trainer.acelerator is not an option"),
        ("  init_args:", "  init_arg:", "model.init_arg is not a key of model: a class is given by class_path and"),
    ],
    ids=["loop key", "data key", "model option", "trainer option", "init_args"],
)
def test_a_hand_written_yaml_with_a_misspelt_key_is_named_with_the_fix(tmp_path, capsys, right, wrong, message):
    config = tmp_path / "bad.yaml"
    assert right in QUICKSTART.read_text()
    config.write_text(QUICKSTART.read_text().replace(right, wrong))
    rc = main(["fit", "-c", str(config), "--output_dir", str(tmp_path / "run")])
    assert rc == 2
    assert message in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("content", "reason"),
    [(lambda png: png[:30], "cannot identify image file"), (lambda png: b"notes, not an image", "cannot identify")],
    ids=["truncated", "not an image"],
)
def test_an_image_folder_with_a_corrupt_image_names_the_file(tmp_path, capsys, content, reason: str) -> None:
    _image_folder(tmp_path / "photos", ("cat", "dog"))
    bad = tmp_path / "photos" / "dog" / "bad.png"
    bad.write_bytes(content((tmp_path / "photos" / "dog" / "0.png").read_bytes()))
    args = ["--data.dataset", str(tmp_path / "photos"), "--output_dir", str(tmp_path / "run")]
    assert main(["fit", "-c", str(QUICKSTART), *args, "--data.num_clients", "2"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "holds 'dog/bad.png', which is not a readable image (" + reason in line and "remove or replace it" in line
    assert "<_io." not in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--attack.class_path", "nope.Attack"], "attack (class_path 'nope.Attack')"),
        (["--run.batch_size", "abc"], "run.batch_size='abc' is invalid: expected an integer"),
        (["--data.partition", "foo"], "data.partition='foo' is invalid"),
        (["--run.batch_size", "0"], "run.batch_size=0 must be >= 1"),
        (["--run.batch_size", "100000"], "run.batch_size x run.local_steps x run.batches = 100000 exceeds the"),
        (["--run.local_steps", "0"], "run.local_steps=0 must be >= 1"),
        (["--run.client_id", "99"], "run.client_id=99 is not a client: data.num_clients=10"),
        (["--run.client_id", "-1"], "run.client_id=-1 is not a client"),
        (["--run.device", "nope"], "run.device='nope' is not a device"),
        (["--run.device", "cuda:99"], "run.device='cuda:99' is not on this machine"),
        (["--run.local_lr", ".nan"], "run.local_lr=nan must be a finite number > 0"),
        (["--run.local_lr", "-1"], "run.local_lr=-1.0 must be a finite number > 0"),
        (["--attack.init_args.layers", "[nope.*]"], "attack.init_args.layers has ['nope.*'], which match no parameter"),
        (
            ["--model.class_path", "tests.user_project.DigitsNet", "--model.init_args", "{}"],
            "model DigitsNet does not take the data's inputs of shape (32, 1, 32, 32)",
        ),
    ],
)
def test_attack_rejects_bad_input_with_one_line_before_writing(tmp_path, capsys, args: list[str], message: str) -> None:
    run = tmp_path / "run"
    rc = main(["attack", "-c", str(CONFIGS / "dlg_lenet_digits.yaml"), "--output_dir", str(run), *args])
    assert rc == 2
    assert message in one_error_line(capsys.readouterr().err)
    assert not run.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty; a config is a YAML mapping"),
        (b"- a\n- b\n", "holds a YAML list, not a mapping"),
        (bytes(range(128, 256)), "is not text (a binary file?)"),
        (b"a: [", "is not valid YAML"),
    ],
    ids=["empty", "list", "binary", "broken"],
)
def test_a_config_file_that_is_no_mapping_is_named_with_the_fix(tmp_path, capsys, content: bytes, message: str):
    config = tmp_path / "bad.yaml"
    config.write_bytes(content)
    assert main(["fit", "-c", str(config), "--output_dir", str(tmp_path / "run")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"config={str(config)!r} {message}" in line and "e.g. 'loop: {num_rounds: 2}'" in line
    assert not (tmp_path / "run").exists()


def _image_folder(root, classes: tuple[str, ...]):
    """``root`` in ImageFolder layout: four small grey images per class."""
    from PIL import Image

    for label in classes:
        (root / label).mkdir(parents=True)
        for i in range(4):
            Image.new("L", (8, 8), color=40 * i).save(root / label / f"{i}.png")
    return root


def test_an_image_folder_of_one_class_is_refused_with_the_fix(tmp_path, capsys) -> None:
    _image_folder(tmp_path / "photos", ("cat",))
    args = ["--data.dataset", str(tmp_path / "photos"), "--output_dir", str(tmp_path / "run")]
    assert main(["fit", "-c", str(QUICKSTART), *args]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "has one class sub-folder ('cat'); a classifier needs at least 2" in line
    assert not (tmp_path / "run").exists()


def test_test_refuses_a_checkpoint_that_is_not_safetensors(tmp_path, capsys) -> None:
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(b"not a safetensors file")
    args = ["--ckpt_path", str(ckpt), "--output_dir", str(tmp_path / "run"), "--data.image_size", "16"]
    assert main(["test", "-c", str(QUICKSTART), *args]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"ckpt_path={str(ckpt)!r} is not a safetensors file" in line and "global_model.safetensors" in line


def test_a_library_error_the_toolkit_wrapped_gives_the_toolkit_message(tmp_path, capsys) -> None:
    """torchvision's own "Dataset not found" names no key; the toolkit's message around it names key and fix."""
    args = ["--data.dataset", "mnist", "--data.root", str(tmp_path), "--data.download", "false"]
    assert main(["fit", "-c", str(QUICKSTART), "--output_dir", str(tmp_path / "run"), *args]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"data.dataset='mnist' could not be loaded from data.root={str(tmp_path)!r}" in line
    assert "place the torchvision files for 'mnist' under data.root" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("where", ["missing", "a folder"])
def test_test_names_a_ckpt_path_that_is_no_file(tmp_path, capsys, where: str) -> None:
    ckpt = tmp_path / "run" if where == "a folder" else tmp_path / "none.safetensors"
    (tmp_path / "run").mkdir()
    assert main(["test", "-c", str(QUICKSTART), "--ckpt_path", str(ckpt), "--output_dir", str(tmp_path / "out")]) == 2
    line = one_error_line(capsys.readouterr().err)
    reason = "is a folder, not a file" if where == "a folder" else "does not exist"
    assert f"ckpt_path={str(ckpt)!r} {reason}; pass the global_model.safetensors" in line
    assert not (tmp_path / "out").exists()
