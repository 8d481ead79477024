"""The full bench presets attack enough images for a rate with an interval (issue 30, item 6: >= 32 images a cell
over >= 3 seeds), and each attack run has the clients it attacks."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from lightning_fl.bench.grid import cells, load_settings

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
FULL_PRESETS = [
    "bench_digits",
    "bench_photos",
    "bench_lfw",
    "bench_photos_convnet",
    "bench_photos_resnet",
    "bench_photos_user_net",
    "bench_cifar10",
]


def attacked_images(spec: dict[str, Any]) -> int:
    """How many images lie behind the updates an attack cell's run attacks, over its rounds: each attacked client's
    local steps' images, or the aggregate's of all its clients (at most ``max_images`` an attacked update)."""
    loop = spec["loop"]
    per_client = spec["data"]["batch_size"] * loop.get("local_steps", 1)
    clients = len(spec["clients"] or range(loop["clients_per_round"]))
    if spec["leak_point"] == "aggregate":
        return min(spec["max_images"], per_client * clients) * len(spec["attack_rounds"])
    return min(spec["max_images"], per_client) * clients * len(spec["attack_rounds"])


@pytest.mark.parametrize("name", FULL_PRESETS)
def test_a_full_preset_attacks_at_least_32_images_a_cell_over_3_seeds(name: str) -> None:
    settings = load_settings(CONFIGS / f"{name}.yaml")
    assert len(settings["seeds"]) >= 3
    images: Counter[tuple[str, str, str]] = Counter()
    for cell in cells(settings):
        if settings["threat_models"][cell.threat_model].get("protocol") == "utility":
            continue  # leakage over training attacks a client's whole local set at each round
        spec = cell.spec(settings)
        assert spec["data"]["num_clients"] >= spec["loop"]["clients_per_round"], cell.key
        images[cell.defence, cell.attack, cell.threat_model] += attacked_images(spec)
    assert images and min(images.values()) >= 32, min(images.items(), key=lambda item: item[1])


def test_the_quick_grids_keep_their_short_attack_runs() -> None:
    """The quick grids attack one or two clients of the utility run's split and one round of the aggregate (their
    measured tables and their time budgets), where the full grids attack 11 clients."""
    for name, clients in (("bench_digits", 2), ("bench_photos", 1)):
        quick = load_settings(CONFIGS / f"{name}.yaml", quick=True)
        assert quick["attack_run"]["loop"]["clients_per_round"] == clients
        assert quick["attack_run"]["data"]["num_clients"] == quick["data"]["num_clients"]
        assert load_settings(CONFIGS / f"{name}.yaml")["attack_run"]["loop"]["clients_per_round"] == 11
    assert quick["threat_models"]["aggregate_k4"]["attack_rounds"] == [0]
