"""Model-level defences inside the federated loop: secrets stay on clients, persist, resume; accuracy holds."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset

from lightning_fl import FederatedLoop
from lightning_fl.callbacks.base import FederatedCallback
from lightning_fl.cli import main
from lightning_fl.defences import (
    GaussianNoise,
    GradientPruning,
    KeyLocks,
    Passports,
    PrivateFineTuning,
    apply_defences,
    load_defended,
)
from lightning_fl.messages import ClientUpdate, GroundTruth, ServerView
from lightning_fl.private import private_state
from tests.defences.leakage import defended_model, digits
from tests.user_project import DigitsNet, digits_tensors

MODEL_DEFENCES = ["split", "passports", "keylock"]


class _Recorder(FederatedCallback):
    """Keeps everything that crosses to the server: raw updates and the views at the type-1 leak point."""

    def __init__(self) -> None:
        self.updates: list[ClientUpdate] = []
        self.views: list[ServerView] = []

    def on_client_fit_end(self, loop: FederatedLoop, update: ClientUpdate) -> None:
        self.updates.append(update)

    def on_client_update(self, loop: FederatedLoop, view: ServerView, ground_truth: GroundTruth) -> None:
        self.views.append(view)


def _loop(defence: str, tmp: Path, *, num_rounds: int = 2, **kwargs: object) -> FederatedLoop:
    dm = digits()
    options = {"clients_per_round": 2, "local_steps": 3, "eval_on": "clients", "progress_bar": False, "seed": 0}
    return FederatedLoop(
        defended_model(dm, defence), dm, num_rounds=num_rounds, output_dir=tmp, **{**options, **kwargs}
    )


def _contains_tensor(haystack: object, needle: torch.Tensor) -> bool:
    if isinstance(haystack, torch.Tensor):
        return haystack.shape == needle.shape and torch.equal(haystack, needle)
    if isinstance(haystack, dict):
        return any(_contains_tensor(v, needle) for v in haystack.values())
    if isinstance(haystack, list | tuple):
        return any(_contains_tensor(v, needle) for v in haystack)
    return False


@pytest.mark.parametrize("defence", MODEL_DEFENCES)
def test_private_tensors_never_reach_updates_global_state_logs_or_server_checkpoint(
    defence: str, tmp_path: Path
) -> None:
    recorder = _Recorder()
    loop = _loop(defence, tmp_path, callbacks=[recorder])
    private_names = set(private_state(loop.global_model))
    loop.fit()
    assert private_names and recorder.updates and recorder.views
    for update in recorder.updates:
        assert not private_names & set(update.delta)
    for view in recorder.views:
        assert not private_names & set(view.tensors)
    assert not private_names & set(loop.global_public_state())
    server = torch.load(loop.checkpoint.server_path, map_location="cpu", weights_only=True)
    assert not private_names & set(server["global_state"])
    secrets = [t for c in loop.clients if c.initialised for t in c.private.values()]
    assert secrets and not any(_contains_tensor(server, secret) for secret in secrets)
    texts = [(tmp_path / "summary.json").read_text(), *(p.read_text() for p in tmp_path.glob("logs/**/*.csv"))]
    assert not any(name in text for name in private_names for text in texts)


@pytest.mark.parametrize("defence", ["passports", "keylock"])
def test_each_client_draws_its_own_secrets_and_the_attacker_model_keeps_the_server_init(
    defence: str, tmp_path: Path
) -> None:
    recorder = _Recorder()
    loop = _loop(defence, tmp_path, num_rounds=1, callbacks=[recorder])
    server_secrets = {
        k: v.clone() for k, v in private_state(loop.global_model).items() if "passport" in k or "key" in k
    }
    loop.fit()
    trained = [c for c in loop.clients if c.initialised]
    assert len(trained) == 2
    for name, value in server_secrets.items():
        assert not torch.equal(trained[0].private[name], trained[1].private[name])
        assert not torch.equal(trained[0].private[name], value)
        assert torch.equal(private_state(recorder.views[0].model)[name], value)


class _StartState(FederatedCallback):
    """Remembers which client is training, for a Lightning callback that snapshots its private start state."""

    def __init__(self) -> None:
        self.current: int | None = None
        self.starts: list[tuple[int, dict[str, torch.Tensor]]] = []

    def on_client_fit_start(self, loop: FederatedLoop, client_id: int) -> None:
        self.current = client_id


@pytest.mark.parametrize("defence", MODEL_DEFENCES)
def test_private_state_persists_across_rounds_per_client(defence: str, tmp_path: Path) -> None:
    tracker = _StartState()

    class Snapshot(L.Callback):
        def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            tracker.starts.append((tracker.current, {k: v.clone() for k, v in private_state(pl_module).items()}))

    loop = _loop(
        defence, tmp_path, num_rounds=3, clients_per_round=4, callbacks=[tracker], client_callbacks=[Snapshot()]
    )
    ends: dict[int, list[dict[str, torch.Tensor]]] = {}
    for _ in range(3):
        loop.run_round()
        loop.round_idx += 1
        for client in loop.clients:
            ends.setdefault(client.client_id, []).append({k: v.clone() for k, v in client.private.items()})
    for position, (client_id, start) in enumerate(tracker.starts[4:]):
        previous_end = ends[client_id][position // 4]
        assert all(torch.equal(start[k], previous_end[k]) for k in start)
        assert any(not torch.equal(start[k], ends[client_id][-1][k]) for k in start)


@pytest.mark.parametrize("defence", MODEL_DEFENCES)
def test_resume_restores_each_clients_private_state(defence: str, tmp_path: Path) -> None:
    straight = _loop(defence, tmp_path / "straight", num_rounds=2)
    straight.fit()
    _loop(defence, tmp_path / "resumed", num_rounds=1).fit()
    resumed = _loop(defence, tmp_path / "resumed", num_rounds=2)
    resumed.fit(resume=True)
    for a, b in zip(straight.clients, resumed.clients, strict=True):
        assert a.initialised == b.initialised and set(a.private) == set(b.private)
        assert all(torch.allclose(a.private[k], b.private[k]) for k in a.private)
    for key, value in straight.global_public_state().items():
        assert torch.allclose(value, resumed.global_public_state()[key])


_ACCURACY_SETTING = {
    "clients_per_round": 4,
    "local_epochs": 2,
    "local_steps": None,
    "eval_every": 10,
    "checkpoint": False,
}


def _accuracy(defence: str, tmp: Path, **kwargs: object) -> float:
    eval_on = "global" if defence == "none" else "clients"
    loop = _loop(defence, tmp, num_rounds=10, **{**_ACCURACY_SETTING, "eval_on": eval_on, **kwargs})
    return float(loop.fit()["test_accuracy"])


@pytest.fixture(scope="module")
def fedavg_accuracy(tmp_path_factory: pytest.TempPathFactory) -> float:
    return _accuracy("none", tmp_path_factory.mktemp("fedavg"))


@pytest.mark.parametrize(
    ("defence", "options"),
    [
        ("split", {}),
        ("passports", {"client_callbacks": [PrivateFineTuning(steps=10)]}),  # FDL-PP steps (1)-(3)
        ("keylock", {}),
        ("none", {"client_transforms": [GaussianNoise(0.128)]}),
        ("none", {"client_transforms": [GradientPruning(0.2)]}),
    ],
    ids=["splitfed", "fdl_pp", "fedkl", "fl_dp_0.128", "pruning_0.2"],
)
def test_defended_fedavg_accuracy_stays_within_3_points_of_fedavg(
    defence: str, options: dict, fedavg_accuracy: float, tmp_path: Path
) -> None:
    assert fedavg_accuracy >= 0.85
    accuracy = _accuracy(defence, tmp_path, **options)
    assert accuracy >= fedavg_accuracy - 0.03, (accuracy, fedavg_accuracy)


def test_summary_has_no_private_key_names_with_clients_eval(tmp_path: Path) -> None:
    loop = _loop("keylock", tmp_path, num_rounds=1)
    summary = loop.fit()
    assert summary["test_accuracy"] is not None
    assert "lock" not in json.dumps(summary)


CONFIGS = Path(__file__).parents[2] / "configs"


@pytest.mark.parametrize("name", ["fdl_pp_digits", "fedkl_digits", "fdl_pp_cifar10", "fedkl_cifar10"])
def test_defence_configs_parse_with_their_defences(name: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(CONFIGS / f"{name}.yaml"), "--output_dir", str(tmp_path), "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert exit_info.value.code == 0
    defences = printed["defences"]
    assert [d["class_path"].rsplit(".", 1)[-1] for d in defences] in (["Passports"], ["KeyLocks"])


# -- a defended user model restored from its Lightning checkpoint -----------------------------------------------------
def _trained_defended_user_model(tmp_path: Path, defences: list) -> tuple[L.LightningModule, Path]:
    torch.manual_seed(0)
    model = DigitsNet(lr=0.1, channels=6)
    apply_defences(model, defences)
    x, y = digits_tensors()
    trainer = L.Trainer(
        max_steps=5, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    trainer.fit(model, DataLoader(TensorDataset(x[:320], y[:320]), batch_size=32))
    trainer.save_checkpoint(tmp_path / "defended.ckpt")
    return model.eval(), tmp_path / "defended.ckpt"


@pytest.mark.parametrize("kind", ["passports", "keylock", "both"])
def test_load_defended_restores_a_retrofitted_user_model_into_its_own_class(kind: str, tmp_path: Path) -> None:
    defences = {
        "passports": [Passports(num_convs=1, passport_size=8)],
        "keylock": [KeyLocks(key_length=32)],
        "both": [Passports(num_convs=1, passport_size=8), KeyLocks(key_length=32)],
    }[kind]
    trained, path = _trained_defended_user_model(tmp_path, defences)
    with pytest.raises(RuntimeError, match=r"Missing key|Unexpected key"):
        DigitsNet.load_from_checkpoint(path)  # why the helper exists: the plain class no longer fits
    restored = load_defended(DigitsNet, path, defences=defences)
    assert type(restored) is DigitsNet and restored.hparams.channels == 6
    x = digits_tensors()[0][:16]
    assert torch.equal(restored.eval()(x), trained(x))
    assert private_state(restored).keys() == private_state(trained).keys()
    assert all(torch.equal(private_state(restored)[k], v) for k, v in private_state(trained).items())


def test_load_defended_with_the_wrong_defences_says_which_keys_differ(tmp_path: Path) -> None:
    _, path = _trained_defended_user_model(tmp_path, [Passports(num_convs=1, passport_size=8)])
    with pytest.raises(ValueError, match=r"does not match the checkpoint \(missing .*passport.*pass the retrofits"):
        load_defended(DigitsNet, path, defences=[KeyLocks(key_length=32)])
