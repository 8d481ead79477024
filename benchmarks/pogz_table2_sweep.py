"""DPFL Table II readings on digits: does PoGZ allocation ("w", Eq. 3) beat even allocation ("wo") at equal epsilon?

The centralised "one noisy epoch" protocol (spec A.2.8) leaves open where the noise goes, which network the
MNIST row used in our setting, and the clip bound alpha. This sweep measures the readings that change the answer:

* ``--nets``: ``dlg3`` (the library's 3-conv sigmoid DLG LeNet, standardised input, as benchmarks/dp_tables.py),
  ``paper2`` (the paper's MNIST model: two 5x5 convs each followed by a sigmoid, then one FC layer; raw [0, 1]
  pixels, PyTorch default init) and ``paper2_relu`` (the same shape with ReLU: not the paper's network).
* ``--placements``: ``once`` (the one-epoch update accumulated, clipped and noised once; spec's suggestion) or
  ``per_step`` (every Adam step's update clipped and noised, so the epoch trains on noisy weights).
* The noise scale is b_i = Δf / ε_i with Δf = 2ηα (η = 0.01, Theorem 1). alpha is the update's own L1 norm
  (``once``) or the mean L1 norm of a clean epoch's steps (``per_step``), so clipping never biases the update.
  The sound Δf = 2α is the same curve at epsilon / η (b scales with Δf/ε), so one wide epsilon grid covers it;
  ``--alpha-fraction`` < 1 clips the update (signal and noise both shrink with alpha).

* ``--clippings``: ``whole_update`` (Eq. 2: one L1 bound alpha, the same sensitivity for every layer, Theorem 1)
  or ``per_layer`` (layer i clipped to alpha * n_i / n, its own sensitivity; ``PoGZNoise(clipping="per_layer")``).

Settings: ``configs/pogz_table2_sweep.yaml`` (``--config``; flags override it).
Mean test accuracy over ``--draws`` noise draws per cell, for ``--seeds`` training seeds. A few minutes on one
CPU core; not run in CI::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/pogz_table2_sweep.py --out runs/pogz_table2_sweep.json
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _config import parse_args
from torch import Tensor, nn

from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import dpfl_noisy_update, pogz_scores
from lightning_fl.models import LeNetDLG
from lightning_fl.privacy import state_norm

ETA = 0.01  # Adam lr of the paper (Sec. V-A), also the eta of the paper's sensitivity 2*eta*alpha


class _Standardise(nn.Module):
    def __init__(self, mean: float, std: float) -> None:
        super().__init__()
        self.mean, self.std = mean, std

    def forward(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std


def _paper2(activation: type[nn.Module], image_size: int) -> nn.Sequential:
    """DPFL's MNIST model (Sec. V-A): conv 5x5 (12, stride 2) -> act -> conv 5x5 (12, stride 2) -> act -> FC."""
    side = (image_size + 3) // 4
    return nn.Sequential(
        nn.Conv2d(1, 12, kernel_size=5, padding=2, stride=2),
        activation(),
        nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=2),
        activation(),
        nn.Flatten(),
        nn.Linear(12 * side * side, 10),
    )


def _network(name: str, image_size: int, mean: float, std: float) -> nn.Module:
    if name == "dlg3":
        return nn.Sequential(_Standardise(mean, std), LeNetDLG(in_channels=1, num_classes=10, image_size=image_size))
    return _paper2(nn.ReLU if name == "paper2_relu" else nn.Sigmoid, image_size)


def _accuracy(model: nn.Module, data: tuple[Tensor, Tensor]) -> float:
    with torch.no_grad():
        return float((model(data[0]).argmax(1) == data[1]).float().mean())


def _epoch(
    model: nn.Module,
    data: tuple[Tensor, Tensor],
    *,
    seed: int,
    batch_size: int,
    step_hook: Callable[[dict[str, Tensor]], None] | None = None,
) -> None:
    """One epoch of Adam (lr eta, fresh state); ``step_hook(before)`` may replace the weights after each step."""
    optimiser = torch.optim.Adam(model.parameters(), lr=ETA)
    order = torch.randperm(len(data[1]), generator=torch.Generator().manual_seed(seed))
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        before = {k: v.clone() for k, v in model.state_dict().items()}
        optimiser.zero_grad()
        nn.functional.cross_entropy(model(data[0][idx]), data[1][idx]).backward()
        optimiser.step()
        if step_hook is not None:
            step_hook(before)


def _delta(model: nn.Module, before: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v - before[k] for k, v in model.state_dict().items() if k in before}


def table2_cell(
    *,
    net: str,
    placement: str,
    allocations: list[str],
    epsilons: list[float],
    seed: int,
    draws: int,
    image_size: int,
    alpha_fraction: float = 1.0,
    clipping: str = "whole_update",
) -> dict[str, object]:
    """Baseline accuracy, PoGZ scores and mean accuracy per allocation and epsilon for one trained model."""
    dm = FederatedDataModule("digits", num_clients=1, partition="iid", image_size=image_size, val_fraction=0.2)
    (mean,), (std,) = dm.input_stats
    train, val, test = dm.client_train_set(0).tensors(), dm.client_val_set(0).tensors(), dm.test_set.tensors()
    torch.manual_seed(seed)
    model = _network(net, image_size, mean, std)
    for epoch in range(8):
        _epoch(model, train, seed=100 * seed + epoch, batch_size=32)
    scores = pogz_scores(model, [val])
    base = copy.deepcopy(model.state_dict())
    params = {k for k, _ in model.named_parameters()}

    clean = copy.deepcopy(model)
    step_norms: list[float] = []
    _epoch(
        clean,
        train,
        seed=999,
        batch_size=32,
        step_hook=lambda before: step_norms.append(float(state_norm(_delta(clean, before), p=1.0))),
    )
    epoch_delta = {k: v for k, v in _delta(clean, base).items() if k in params}
    result: dict[str, object] = {"baseline": _accuracy(model, test), "scores": scores}
    result["clean_epoch"] = _accuracy(clean, test)

    def noisy_run(allocation: str, epsilon: float, draw: int) -> float:
        generator = torch.Generator().manual_seed(draw)
        model.load_state_dict(base)
        if placement == "once":
            alpha = alpha_fraction * float(state_norm(epoch_delta, p=1.0))
            noisy = noisy_upload(epoch_delta, scores, epsilon, alpha, allocation, clipping, generator)
            model.load_state_dict({k: v + noisy[k] if k in noisy else v for k, v in base.items()})
        else:
            alpha = alpha_fraction * sum(step_norms) / len(step_norms)

            def hook(before: dict[str, Tensor]) -> None:
                step = {k: v for k, v in _delta(model, before).items() if k in params}
                noisy = noisy_upload(step, scores, epsilon, alpha, allocation, clipping, generator)
                model.load_state_dict({k: v + noisy[k] if k in noisy else v for k, v in before.items()})

            _epoch(model, train, seed=999, batch_size=32, step_hook=hook)
        return _accuracy(model, test)

    for allocation in allocations:
        result[allocation] = [sum(noisy_run(allocation, eps, d) for d in range(draws)) / draws for eps in epsilons]
    return result


def noisy_upload(
    delta: dict[str, Tensor],
    scores: dict[str, float],
    epsilon: float,
    alpha: float,
    allocation: str,
    clipping: str,
    generator: torch.Generator,
    *,
    eta: float = ETA,
) -> dict[str, Tensor]:
    """DPFL's upload (Alg. 2): L1 clip to alpha, Laplace noise of scale 2*eta*alpha / epsilon_i per layer."""
    return dpfl_noisy_update(
        delta,
        scores=scores,
        epsilon=epsilon,
        clip_bound=alpha,
        sensitivity=2 * eta * alpha,
        allocation=allocation,
        clipping=clipping,
        generator=generator,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/pogz_table2_sweep.yaml"), help="settings file")
    parser.add_argument("--nets", nargs="+", help="dlg3, paper2, paper2_relu")
    parser.add_argument("--placements", nargs="+", help="once, per_step")
    parser.add_argument("--allocations", nargs="+", help="pogz, even, inverse")
    parser.add_argument("--clippings", nargs="+", help="whole_update, per_layer")
    parser.add_argument("--epsilons", nargs="+", type=float)
    parser.add_argument("--seeds", type=int, help="training seeds (models) per reading")
    parser.add_argument("--draws", type=int, help="noise draws per cell")
    parser.add_argument("--image-size", type=int)
    parser.add_argument("--alpha-fraction", type=float, help="alpha as a fraction of the update's L1 norm")
    parser.add_argument("--out")
    args = parse_args(parser)
    start, cpu = time.perf_counter(), time.process_time()
    rows = []
    for net in args.nets:
        for placement in args.placements:
            for clipping in args.clippings:
                for seed in range(args.seeds):
                    cell = table2_cell(
                        net=net,
                        placement=placement,
                        allocations=args.allocations,
                        epsilons=args.epsilons,
                        seed=seed,
                        draws=args.draws,
                        image_size=args.image_size,
                        alpha_fraction=args.alpha_fraction,
                        clipping=clipping,
                    )
                    rows.append({"net": net, "placement": placement, "clipping": clipping, "seed": seed, **cell})
                    print(json.dumps(rows[-1]), flush=True)
    out = {"epsilons": args.epsilons, "rows": rows, "seconds": time.perf_counter() - start}
    out["cpu_seconds"] = time.process_time() - cpu
    with open(args.out, "w") as handle:
        json.dump(out, handle, indent=2)


if __name__ == "__main__":
    main()
