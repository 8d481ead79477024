"""GradientLeakage fires exactly where asked, sees only the ServerView, and writes summary entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lightning_fl import FederatedLoop
from lightning_fl.attacks import DLGAttack, GradientAttack, Reconstruction
from lightning_fl.callbacks import GradientLeakage
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.messages import ServerView
from lightning_fl.private import mark_private, private_state
from tests.conftest import make_classifier, one_step_attack_loop


class RecordingAttack(GradientAttack):
    """Returns noise and keeps every view it received (what an attack gets is all we inspect)."""

    name = "recording"

    def __init__(self) -> None:
        self.views: list[ServerView] = []

    def reconstruct(self, view: ServerView, *, callback=None) -> Reconstruction:
        self.views.append(view)
        count = view.metadata["batch_size"] * (view.metadata.get("num_clients") or 1)
        images = torch.rand(count, *view.metadata["input_shape"], generator=torch.Generator().manual_seed(0))
        return Reconstruction(images, torch.zeros(count, dtype=torch.long))


def _loop(tmp_path: Path, callbacks: list, *, num_rounds: int = 2, model=None) -> FederatedLoop:
    dm = FederatedDataModule("digits", num_clients=3, partition="iid", batch_size=2, image_size=16)
    return FederatedLoop(
        model or make_classifier(dm, optimizer="sgd", lr=0.05),
        dm,
        num_rounds=num_rounds,
        clients_per_round=3,
        local_steps=2,
        eval_every=0,
        callbacks=callbacks,
        output_dir=tmp_path,
        checkpoint=False,
        progress_bar=False,
    )


@pytest.mark.parametrize(
    ("leak_point", "rounds", "clients", "expected"),
    [
        ("client_update", [1], [0, 2], [(1, 0), (1, 2)]),
        ("local_gradient", [0], [1], [(0, 1)]),
        ("aggregate", [0, 1], None, [(0, None), (1, None)]),
    ],
)
def test_gradient_leakage_fires_exactly_at_requested_events(
    tmp_path: Path, leak_point: str, rounds: list[int], clients: list[int] | None, expected: list[tuple]
) -> None:
    attack = RecordingAttack()
    leakage = GradientLeakage(attack, leak_point=leak_point, rounds=rounds, clients=clients, max_images=16)
    _loop(tmp_path, [leakage]).fit()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(e["round"], e["client"]) for e in summary["attacks"]] == expected
    assert all(v.leak_point == leak_point for v in attack.views)
    entry = summary["attacks"][0]
    assert {"attack", "round", "client", "leak_point", "mse", "psnr", "ssim", "lpips", "label_accuracy"} <= set(entry)
    assert entry["attack"] == "recording" and entry["leak_point"] == leak_point
    assert Path(entry["image"]).is_file()


def test_gradient_leakage_attacks_only_requested_local_steps(tmp_path: Path) -> None:
    attack = RecordingAttack()
    leakage = GradientLeakage(attack, leak_point="local_gradient", rounds=[0], clients=[0], step_indices=[1])
    _loop(tmp_path, [leakage], num_rounds=1).fit()
    assert len(attack.views) == 1
    assert json.loads((tmp_path / "summary.json").read_text())["attacks"][0]["step"] == 1


def test_the_loop_builds_views_only_for_the_events_the_attack_wants(tmp_path: Path, monkeypatch) -> None:
    from lightning_fl.federation.leak_points import LeakPoints

    built: list[tuple] = []
    original = LeakPoints.view

    def counting_view(self, leak_point, **kwargs):
        built.append((kwargs["round_idx"], kwargs.get("client_id"), kwargs.get("step")))
        return original(self, leak_point, **kwargs)

    monkeypatch.setattr(LeakPoints, "view", counting_view)
    leakage = GradientLeakage(RecordingAttack(), leak_point="local_gradient", rounds=[1], step_indices=[1])
    _loop(tmp_path, [leakage]).fit()  # 2 rounds x 3 clients x 2 local steps = 12 released gradients
    assert built == [(1, 0, 1), (1, 1, 1), (1, 2, 1)]


def test_gradient_leakage_view_holds_no_ground_truth_or_private_tensors(tmp_path: Path) -> None:
    dm = FederatedDataModule("digits", num_clients=3, partition="iid", batch_size=2, image_size=16)
    model = make_classifier(dm, optimizer="sgd", lr=0.05)
    mark_private(model.backbone.body[0])  # the first conv stays on the clients
    server_private = {k: v.clone() for k, v in private_state(model).items()}
    attack = RecordingAttack()
    loop = _loop(tmp_path, [GradientLeakage(attack, leak_point="client_update", rounds=[1])], model=model)
    loop.fit()
    images = torch.cat([dm.client_train_set(k).tensors()[0] for k in range(3)])
    for view in attack.views:
        assert set(vars(view)) == {"leak_point", "model", "tensors", "kind", "metadata"}
        assert not any(k.startswith("backbone.body.0.") for k in view.tensors)
        for key, value in private_state(view.model).items():  # the attacker's guess: the server's own init
            assert torch.equal(value, server_private[key])
        client_secret = loop.clients[view.metadata["client_id"]].private
        assert client_secret and not torch.equal(
            client_secret["backbone.body.0.weight"], server_private["backbone.body.0.weight"]
        )
        flat = [t.flatten() for t in view.tensors.values()]
        assert all(t.numel() != images[0].numel() or not torch.isin(t, images).all() for t in flat)
        assert all(isinstance(v, int | float | str | tuple | type(None)) for v in view.metadata.values())


def test_gradient_leakage_skips_views_with_more_images_than_max_images(tmp_path: Path) -> None:
    attack = RecordingAttack()
    leakage = GradientLeakage(attack, leak_point="client_update", rounds=[0], max_images=3)
    with pytest.warns(UserWarning, match="hides 4 images .* > max_images=3"):
        _loop(tmp_path, [leakage], num_rounds=1).fit()
    assert attack.views == []


def test_gradient_leakage_with_dlg_recovers_a_one_step_sgd_update(tmp_path: Path) -> None:
    attack = GradientLeakage(DLGAttack(max_iterations=300, restarts=4, progress_bar=False))
    entry = one_step_attack_loop(tmp_path, callbacks=[attack]).fit()["attacks"][0]
    assert entry["psnr"] >= 30 and entry["label_accuracy"] == 1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"leak_point": "gradient"}, "leak_point='gradient'.* is unknown"),
        ({"rounds": [-1]}, "must be 0-based"),
        ({"max_images": 0}, "max_images=0"),
    ],
)
def test_gradient_leakage_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GradientLeakage(RecordingAttack(), **kwargs)
