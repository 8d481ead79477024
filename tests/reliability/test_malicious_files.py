"""Untrusted files are read with the safe unpickler: a planted payload is refused with one line, never run."""

from __future__ import annotations

import hashlib
import json
import warnings

import pytest
import torch

from lightning_fl.attacks import metrics as M
from lightning_fl.cli import main
from lightning_fl.federation.checkpoint import Checkpoint
from tests.reliability.helpers import FAST, QUICKSTART, Payload, one_error_line


@pytest.fixture
def hub_dir(tmp_path):
    """A private torch hub cache, and a fresh LPIPS network before and after the test."""
    before = torch.hub.get_dir()
    torch.hub.set_dir(str(tmp_path / "hub"))
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    M._lpips_metric.cache_clear()
    yield tmp_path / "hub" / "checkpoints"
    M._lpips_metric.cache_clear()
    torch.hub.set_dir(before)


def _images() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.rand(2, 3, 32, 32, generator=generator), torch.rand(2, 3, 32, 32, generator=generator)


def test_planted_hub_weights_are_not_executed_by_lpips(hub_dir, tmp_path) -> None:
    marker = tmp_path / "payload_ran"
    torch.save({"features.0.weight": Payload(marker)}, M._alexnet_weights_path())
    with pytest.warns(UserWarning, match="not a plain weights file.*it was not executed"):
        assert M.lpips(*_images()) is None
    assert not marker.exists()
    # control: the loader torchvision (so torchmetrics) calls for this file runs the same payload
    from torchvision.models import AlexNet_Weights

    torch.hub.load_state_dict_from_url(AlexNet_Weights.DEFAULT.url)
    assert marker.exists()


def test_lpips_uses_plain_hub_weights_read_safely(hub_dir) -> None:
    from torchvision.models import alexnet

    torch.manual_seed(0)
    features = {k: v for k, v in alexnet(weights=None).state_dict().items() if k.startswith("features.")}
    torch.save(features, M._alexnet_weights_path())
    preds, target = _images()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same, different = M.lpips(target, target), M.lpips(preds, target)
    assert torch.equal(M._lpips_metric().net.slice1[0].weight, features["features.0.weight"])
    assert same.shape == (2,) and same.abs().max() < 1e-6 and (different > 0).all()


@pytest.mark.parametrize("digest_updated", [False, True], ids=["planted", "planted with its digest"])
@pytest.mark.parametrize("slot", ["server", "client"])
def test_resume_refuses_a_pickled_payload_checkpoint(tmp_path, capsys, slot: str, digest_updated: bool) -> None:
    run = tmp_path / "run"
    key_lock = ["--defences", "[{class_path: lightning_fl.defences.KeyLocks, init_args: {key_length: 8}}]"]
    base = ["fit", "--config", str(QUICKSTART), "--output_dir", str(run), *FAST, *key_lock]  # with client storage
    assert main(base) == 0
    checkpoint = Checkpoint(run)
    first = min(map(int, checkpoint.read_manifest()["clients"]))
    path = checkpoint.server_path if slot == "server" else checkpoint.client_path(first)  # files the manifest commits
    where = str(path.relative_to(run))
    marker = tmp_path / "payload_ran"
    torch.save({"state": Payload(marker)}, path)
    if digest_updated:  # someone who can write the run directory rewrites the manifest's digest too
        manifest = json.loads(checkpoint.manifest_path.read_text())
        entries = [manifest["server"], *manifest["clients"].values()]
        next(e for e in entries if e["path"] == where)["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        checkpoint.manifest_path.write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main([*base, "--resume", "true"]) == 2
    line = one_error_line(capsys.readouterr().err)
    if digest_updated:
        assert where in line and "weights_only=True" in line and "was not run" in line
    else:  # the digest check names it before any unpickler sees it
        assert where in line and "does not match the SHA-256 in the manifest" in line
    assert not marker.exists()


def test_resume_deletes_a_planted_uncommitted_checkpoint_unread(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    base = ["fit", "--config", str(QUICKSTART), "--output_dir", str(run), *FAST]
    assert main(base) == 0
    marker, planted = tmp_path / "payload_ran", run / "checkpoints" / "server_r00009.pt"
    torch.save({"state": Payload(marker)}, planted)
    assert main([*base, "--loop.num_rounds", "2", "--resume", "true"]) == 0
    assert not marker.exists() and not planted.exists()


def test_a_hub_file_without_alexnet_layers_gives_null_lpips(hub_dir) -> None:
    torch.save({"features.0.weight": torch.zeros(64, 3, 11, 11)}, M._alexnet_weights_path())
    with pytest.warns(UserWarning, match=r"no AlexNet tensors for \['slice1.0.bias'"):
        assert M.lpips(*_images()) is None
