"""Attacks that change their own run in the bench: Robbing the Fed's malicious server and the analytic attack's MLP."""

from __future__ import annotations

import csv

import pytest
import torch

from lightning_fl.attacks.imprint import ImprintBlock
from lightning_fl.bench import cells, load_settings, run_bench
from lightning_fl.datamodules import FederatedDataModule

from .test_bench import MINI

_B8 = {"leak_point": "local_gradient", "data": {"batch_size": 8}, "max_images": 8}
_FEDAVG = {"leak_point": "client_update", "data": {"batch_size": 2}, "loop": {"local_steps": 4}, "max_images": 8}


def _grid() -> dict:
    shipped = load_settings("configs/bench_digits.yaml", quick=True)["attacks"]
    return {
        **MINI,
        "attacks": {name: shipped[name] for name in ("robbing_the_fed", "analytic")},
        "threat_models": {**MINI["threat_models"], "fedsgd_b8": _B8, "fedavg_b2_s4": _FEDAVG},
    }


def test_malicious_server_and_analytic_rows_per_defence_with_their_own_runs(tmp_path) -> None:
    rows = {(r["defence"], r["attack"], r["threat_model"]): r for r in run_bench(_grid(), tmp_path, print_=len)}
    assert all(r["status"] == "ok" for r in rows.values()), {k: r["status"] for k, r in rows.items()}
    # both defences have both attacks' rows; neither runs on the trained LeNet (they ship their own model)
    attacks, threats = ("robbing_the_fed", "analytic"), ("fedsgd_b1", "fedsgd_b8", "fedavg_b2_s4")
    assert set(rows) == {(d, a, t) for d in ("none", "fed_cdp") for a in attacks for t in threats}
    rtf = rows["none", "robbing_the_fed", "fedsgd_b8"]  # Fowl et al. (2022): the batch copied out, one per bin
    assert rtf["server"] == "malicious" and rtf["exact_mean"] >= 0.75 and rtf["psnr_capped"] >= 1  # exact copies
    assert rtf["psnr_mean"] is None or rtf["psnr_mean"] > 30.0  # the rest: the mean of the measured PSNRs
    # 4 SGD steps: the share is of the 8 images behind the update, not of the client's whole set (the ground truth)
    assert rows["none", "robbing_the_fed", "fedavg_b2_s4"]["exact_mean"] >= 0.75
    analytic = rows["none", "analytic", "fedsgd_b1"]  # Phong et al. (2017): one image's MLP gradient is a copy
    assert analytic["server"] == "honest-but-curious" and analytic["exact_mean"] == 1
    assert analytic["psnr_mean"] is None or analytic["psnr_mean"] > 60.0  # None: every image at the 100 dB cap
    assert rows["fed_cdp", "robbing_the_fed", "fedsgd_b8"]["exact_mean"] == 0.0  # per-example noise at the default gain
    assert (tmp_path / "runs" / "none__fedsgd_b8__s0__robbing_the_fed").is_dir()
    assert (tmp_path / "runs" / "none__fedsgd_b8__s0__analytic").is_dir()
    table = list(csv.DictReader((tmp_path / "bench.csv").open()))
    assert {r["server"] for r in table if r["attack"] == "robbing_the_fed"} == {"malicious"}
    assert "| none | robbing_the_fed | malicious |" in (tmp_path / "bench.md").read_text()


@pytest.mark.parametrize("preset", ["configs/bench_digits.yaml", "configs/bench_photos.yaml", "configs/bench_lfw.yaml"])
def test_shipped_imprint_statistics_are_the_test_split_feature(preset: str) -> None:
    """The server's public statistics of the imprint feature: mean and std of the feature on the test split."""
    settings = load_settings(preset, quick=True)
    imprint = settings["attacks"]["robbing_the_fed"]["server_plugins"][0]["init_args"]
    data = FederatedDataModule(**{**settings["data"], "num_clients": 2, "seed": 0})
    data.setup()
    images = torch.stack([image for image, _ in data.test_set])
    block = ImprintBlock(images.shape[1:], num_bins=2, feature=imprint["feature"], feature_mean=0.0, feature_std=1.0)
    feature = block.feature(images)
    assert feature.mean().item() == pytest.approx(imprint["feature_mean"], abs=1e-3)
    assert feature.std().item() == pytest.approx(imprint["feature_std"], abs=1e-3)
    grid = cells(settings)
    trained = {  # the utility run's own model (trained, or the utility run itself): no imprint block to read
        name for name, t in settings["threat_models"].items() if t.get("trained") or t.get("protocol") == "utility"
    }
    assert {c.threat_model for c in grid if c.attack == "robbing_the_fed"} == set(settings["threat_models"]) - trained


def test_an_unknown_attack_key_is_named(tmp_path) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(
        "seeds: [0]\ndata: {}\nmodel: {}\nloop: {}\ndefences: {none: {}}\n"
        "threat_models: {b1: {leak_point: local_gradient}}\n"
        "attacks: {rtf: {class_path: x.Y, malicious_server: []}}\n"
    )
    with pytest.raises(ValueError, match=r"attacks.rtf: unknown keys \['malicious_server'\]"):
        load_settings(config)
