"""Bad inputs exit 2 before anything is written, with one line that names the key and the fix.

On main before this suite: ``loop: null`` read ``Unable to load config "null"``; a user model whose ``__init__``
raised printed only its message (``user init failed``, nothing of where); ``Schedule(start=0.0, end=0.0)`` named no
key or fix; a ``PrivacyBudget`` below the first round's epsilon, ``DPFedAvg(noise_multiplier=.nan)``,
``momentum: -1`` and ``lr: 1e30`` exited 1 after the run directory was written.
"""

from __future__ import annotations

import pytest
import yaml

from lightning_fl.cli import main
from tests.reliability.helpers import CONFIGS, FAST, QUICKSTART

SCHEDULE = "{class_path: lightning_fl.privacy.Schedule, init_args: {start: 0.0, end: 0.0}}"

CASES = {
    "loop null": (QUICKSTART, ["--loop", "null"], "loop: null is not allowed; give loop as a mapping"),
    "user init failed": (
        QUICKSTART,
        ["--model", "user_init_fails.Fails"],
        "user_init_fails.Fails.__init__ raised RuntimeError: user init failed",
    ),
    "schedule of zeros": (
        QUICKSTART,
        ["--defences", f"[{{class_path: lightning_fl.defences.FedCDP, init_args: {{max_grad_norm: {SCHEDULE}}}}}]"],
        "set the schedule's init_args.start and init_args.end to positive values",
    ),
    "budget below the first round": (
        CONFIGS / "dual_dp_digits.yaml",
        ["--loop.callbacks.init_args.target_epsilon", "0.01"],
        "PrivacyBudget(target_epsilon=0.01): round 0 would bring the cumulative epsilon from 0 to",
    ),
    "DPFedAvg noise_multiplier nan": (
        QUICKSTART,
        ["--defences", "[{class_path: lightning_fl.defences.DPFedAvg, init_args: {noise_multiplier: .nan}}]"],
        "DPFedAvg(noise_multiplier=nan) must be a finite number > 0",
    ),
    "momentum -1": (
        QUICKSTART,
        ["--model.init_args.optimizer", "sgd", "--model.init_args.momentum", "-1"],
        "model.init_args.momentum=-1.0 must be a finite number >= 0",
    ),
    "lr 1e30": (QUICKSTART, ["--model.init_args.lr", "1e30"], "model.init_args.lr=1e+30 is above 1000"),
    "Fed-CDP with BatchNorm": (
        QUICKSTART,
        ["--model.init_args.backbone", "convnet_small", "--defences", "[{class_path: lightning_fl.defences.FedCDP}]"],
        "FedCDP cannot compute per-example gradients through BatchNorm",
    ),
}

USER_MODEL = """
from lightning_fl.models import ImageClassifier


class Fails(ImageClassifier):
    def __init__(self, **kwargs):
        raise RuntimeError("user init failed")
"""


@pytest.mark.parametrize(("config", "args", "message"), list(CASES.values()), ids=list(CASES))
def test_a_bad_input_exits_2_before_writing_with_one_line_naming_it(
    tmp_path, capsys, monkeypatch, config, args, message
) -> None:
    (tmp_path / "user_init_fails.py").write_text(USER_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "run"
    code = main(["fit", "-c", str(config), "--output_dir", str(run), *FAST, "--loop.local_steps", "1", *args])
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("lightning-fl: warning:")]
    assert code == 2 and len(errors) == 1, errors
    assert errors[0].startswith("lightning-fl: error: ") and message in errors[0], errors[0]
    assert not run.exists()


def test_what_the_data_overrides_is_said_and_recorded_in_config_yaml(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    args = [*FAST, "--loop.local_steps", "1", "--loop.eval_every", "0"]
    assert (
        main(["fit", "-c", str(QUICKSTART), "--output_dir", str(run), *args, "--model.init_args.num_classes", "5"]) == 0
    )
    out = capsys.readouterr().out
    assert "taken from the data: model.init_args.num_classes=10 (instead of 5), model.init_args.image_size=16" in out
    saved = yaml.safe_load((run / "config.yaml").read_text())["model"]["init_args"]
    assert (saved["num_classes"], saved["in_channels"], saved["image_size"]) == (10, 1, 16)
    again = tmp_path / "again"  # the recorded config runs again as it is
    assert main(["fit", "-c", str(run / "config.yaml"), "--output_dir", str(again)]) == 0
    assert "taken from the data" not in capsys.readouterr().out
