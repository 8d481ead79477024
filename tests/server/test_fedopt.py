"""Server optimisers (Reddi et al., ICLR 2021, Alg. 2): the formula by hand, and Flower's strategies of that name."""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from jsonargparse import ArgumentParser

from lightning_fl import ClientUpdate, FedAdagrad, FedAdam, FedAvgM, FedYogi
from lightning_fl.cli import main
from lightning_fl.config import build
from lightning_fl.server.fedopt import ServerOptimizer

SHAPES = {"conv.weight": (3, 2), "fc.bias": (4,)}


def _updates(round_idx: int) -> list[ClientUpdate]:
    generator = torch.Generator().manual_seed(round_idx)
    return [
        ClientUpdate(
            k, round_idx, {key: 0.1 * torch.randn(shape, generator=generator) for key, shape in SHAPES.items()}, n, 0.0
        )
        for k, n in enumerate((5, 11, 20))
    ]


def _fedavg(updates: list[ClientUpdate]) -> dict[str, torch.Tensor]:
    total = sum(u.num_samples for u in updates)
    return {key: sum(u.delta[key].double() * u.num_samples / total for u in updates) for key in SHAPES}


def test_fedadam_follows_alg2_over_two_rounds() -> None:
    opt, eta, b1, b2, tau = FedAdam(eta=0.05, tau=1e-3), 0.05, 0.9, 0.99, 1e-3
    m = v = 0.0
    for round_idx in range(2):
        updates = _updates(round_idx)
        step = opt.aggregate(updates, ctx=None)[0]
        delta = _fedavg(updates)["conv.weight"]
        m, v = b1 * m + (1 - b1) * delta, b2 * v + (1 - b2) * delta**2
        torch.testing.assert_close(step["conv.weight"].double(), eta * m / (v.sqrt() + tau), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("optimizer", "rule"),
    [
        (FedAdagrad(eta=0.1, tau=1e-2), lambda v, d: v + d**2),
        (FedYogi(eta=0.1, tau=1e-2), lambda v, d: v - 0.01 * d**2 * torch.sign(v - d**2)),
    ],
)
def test_second_moment_rules_follow_alg2(optimizer: ServerOptimizer, rule) -> None:
    v = torch.zeros(3, 2, dtype=torch.float64)
    m = torch.zeros_like(v)
    for round_idx in range(3):
        updates = _updates(round_idx)
        step = optimizer.aggregate(updates, ctx=None)[0]["conv.weight"]
        delta = _fedavg(updates)["conv.weight"]
        m, v = optimizer.beta_1 * m + (1 - optimizer.beta_1) * delta, rule(v, delta)
        torch.testing.assert_close(step.double(), 0.1 * m / (v.sqrt() + 1e-2), rtol=1e-6, atol=1e-7)


def test_fedavgm_without_momentum_and_unit_lr_is_fedavg() -> None:
    updates = _updates(0)
    step = FedAvgM(server_lr=1.0, server_momentum=0.0).aggregate(updates, ctx=None)[0]
    torch.testing.assert_close(step["fc.bias"].double(), _fedavg(updates)["fc.bias"])


def test_server_optimizer_resumes_from_its_state_dict() -> None:
    first, resumed = FedYogi(), FedYogi()
    first.aggregate(_updates(0), ctx=None)
    resumed.load_state_dict(first.state_dict())
    torch.testing.assert_close(
        resumed.aggregate(_updates(1), ctx=None)[0], first.aggregate(_updates(1), ctx=None)[0], rtol=0, atol=0
    )


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: FedAdam(eta=0.0), "eta=0.0"),
        (lambda: FedYogi(beta_2=1.0), "beta_2=1.0"),
        (lambda: FedAdagrad(tau=0.0), "tau=0.0"),
        (lambda: FedAvgM(server_momentum=1.0), "server_momentum=1.0"),
    ],
)
def test_server_optimizers_reject_bad_settings(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


PAPER_DEFAULTS = {
    # Reddi et al. (ICLR 2021) Alg. 2 with the defaults each class's docstring gives (Flower's eta and tau)
    FedAdagrad: ({"eta": 0.1, "beta_1": 0.0, "tau": 1e-9, "initial_accumulator": 0.0, "weighted": True}, 0.0),
    FedAdam: (
        {"eta": 0.1, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-9, "initial_accumulator": 0.0, "weighted": True},
        0.99,
    ),
    FedYogi: (
        {"eta": 0.01, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3, "initial_accumulator": 0.0, "weighted": True},
        0.99,
    ),
}


@pytest.mark.parametrize("optimizer", list(PAPER_DEFAULTS), ids=lambda t: t.__name__)
def test_adaptive_optimizer_defaults_are_alg2s_and_a_yaml_override_applies(optimizer: type) -> None:
    defaults, beta_2 = PAPER_DEFAULTS[optimizer]
    assert {name: p.default for name, p in inspect.signature(optimizer).parameters.items()} == defaults
    assert optimizer().beta_2 == beta_2  # FedAdagrad has no beta_2 argument: Adagrad keeps no moving average
    text = f"aggregator: {{class_path: lightning_fl.server.{optimizer.__name__}, init_args: {{tau: 0.5}}}}"
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--aggregator", type=ServerOptimizer)
    for built in (
        parser.instantiate_classes(parser.parse_string(text)).aggregator,
        build(yaml.safe_load(text)["aggregator"]),
    ):
        assert type(built) is optimizer
        assert {name: getattr(built, name) for name in defaults} == defaults | {"tau": 0.5}


def test_server_optimizer_refuses_encrypted_updates() -> None:
    update = ClientUpdate(0, 0, {}, 1, 0.0, payload=object())
    with pytest.raises(ValueError, match="needs plaintext updates"):
        FedAdam().aggregate([update], ctx=None)


# -- Flower: the strategy of the same name on the same updates ------------------------------------------------------
def _flower_round(strategy, weights: list[np.ndarray], updates: list[ClientUpdate], server_round: int) -> list:
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

    results = [
        (
            None,
            FitRes(
                Status(Code.OK, ""),
                ndarrays_to_parameters([w + u.delta[k].numpy() for w, k in zip(weights, SHAPES, strict=True)]),
                u.num_samples,
                {},
            ),
        )
        for u in updates
    ]
    parameters, _ = strategy.aggregate_fit(server_round, results, [])
    return parameters_to_ndarrays(parameters)


def _flower_strategy(name: str, initial: list[np.ndarray]):
    from flwr.common import ndarrays_to_parameters
    from flwr.server import strategy

    parameters = ndarrays_to_parameters(initial)
    if name == "FedAvgM":
        return strategy.FedAvgM(initial_parameters=parameters, server_learning_rate=0.7, server_momentum=0.9)
    return getattr(strategy, name)(initial_parameters=parameters, eta=0.05, tau=1e-3)


def _ours(name: str) -> ServerOptimizer:
    if name == "FedAvgM":
        return FedAvgM(server_lr=0.7, server_momentum=0.9)
    if name == "FedAdam":  # Flower rescales eta by Adam's bias correction with exponent server_round + 1
        return FedAdam(eta=0.05 * math.sqrt(1 - 0.99**2) / (1 - 0.9**2), tau=1e-3)
    return {"FedAdagrad": FedAdagrad, "FedYogi": FedYogi}[name](eta=0.05, tau=1e-3)


@pytest.mark.parametrize("name", ["FedAvgM", "FedAdagrad", "FedAdam", "FedYogi"])
def test_server_optimizer_equals_flower_strategy_of_the_same_name(name: str) -> None:
    pytest.importorskip("flwr", reason="the flower extra is not installed")
    generator = torch.Generator().manual_seed(7)
    initial = {key: torch.randn(shape, generator=generator) for key, shape in SHAPES.items()}
    flower_weights = [v.numpy().copy() for v in initial.values()]
    strategy, ours = _flower_strategy(name, flower_weights), _ours(name)
    updates = _updates(0)
    flower_weights = _flower_round(strategy, flower_weights, updates, server_round=1)
    step = ours.aggregate(updates, ctx=None)[0]
    for (key, start), flower in zip(initial.items(), flower_weights, strict=True):
        np.testing.assert_allclose((start + step[key]).numpy(), flower, rtol=1e-5, atol=1e-6)


def test_fedopt_config_runs_through_the_cli(tmp_path: Path) -> None:
    config = Path(__file__).parents[2] / "configs" / "fedopt_digits.yaml"
    args = ["fit", "--config", str(config), "--output_dir", str(tmp_path), "--loop.num_rounds", "2"]
    args += ["--loop.local_steps", "2", "--data.image_size", "16", "--loop.progress_bar", "false"]
    assert main(args) == 0
    history = json.loads((tmp_path / "summary.json").read_text())["history"]
    assert all(h["server_step_norm"] > 0 for h in history)
