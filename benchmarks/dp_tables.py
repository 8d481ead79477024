"""Differential-privacy reproduction rows at reduced scale on digits: DPFL, Fed-CDP / Fed-SDP, 2DP-FL.

* DPFL Table II: the centralised "one noisy epoch" protocol (spec A.2.8): a trained model, one more epoch's update,
  L1-clipped, Laplace noise split by PoGZ ("w") or evenly ("wo"), applied, tested; mean over 3 noise seeds.
* DPFL Table III: federated DPFL (active selection, PoGZ noise, faithful aggregation, public fine-tuning) at each
  epsilon, and the noise-free baseline with the same selection and fine-tuning (configs/dpfl_digits.yaml).
* Fed-CDP Table II: non-private, Fed-SDP, Fed-CDP and Fed-CDP(decay) (configs/fed_cdp_digits.yaml setting).
* Fed-CDP Table VI: the accountant with the paper's recipe (instant).
* Fed-CDP Table VII: iDLG (label from the gradient, as CPL for one example) on the type-0/1 leak (client update,
  one local step of one example) and the type-2 leak (the local gradient), 16x16 digits, 300 iterations.
* 2DP-FL Fig. 6(b): accuracy at epsilon = 20 without DP and with 2DP-FL's per-client, shared and no downlink noise.

Settings: ``configs/dp_tables.yaml`` (``--config``; flags override it) names the fit configs each federated row
mirrors (``configs/dpfl_digits.yaml``, ``fed_cdp_digits.yaml``, ``dual_dp_digits.yaml``: data, model, loop and the
defence's options are read from them) and holds the rest (epsilons, the Table II protocol, the Table VII attack).
About 10 minutes on one CPU core; not run in CI. From the repository root (``tests`` holds Table VI's published
numbers, so it must be importable)::

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dp_tables.py --out runs/dp_tables.json
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from _config import instantiate, parse_args, read_yaml

from lightning_fl.attacks import IDLGAttack
from lightning_fl.callbacks import GradientLeakage
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import (
    FedCDP,
    FedSDP,
    dpfl_noisy_update,
    pogz_scores,
)
from lightning_fl.federation import FederatedLoop
from lightning_fl.models import ImageClassifier
from lightning_fl.privacy import PrivacyAccountant, Schedule, state_norm
from tests.privacy.paper_tables import FED_CDP_TABLE_VI  # the published numbers live with the tests

_TRAINER = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
_TRAINER |= {"enable_model_summary": False, "accelerator": "cpu"}


def _classifier(dm: FederatedDataModule, **kwargs: Any) -> ImageClassifier:
    return ImageClassifier(**{"backbone": "lenet_dlg", "lr": 2e-3, **kwargs, **dm.model_options})


def _data(fit: dict[str, Any], **overrides: Any) -> FederatedDataModule:
    """The data module of a fit config's ``data:`` section."""
    data = {**fit["data"], **overrides}
    return FederatedDataModule(data.pop("dataset"), **data)


def _fit_classifier(fit: dict[str, Any], dm: FederatedDataModule) -> ImageClassifier:
    """The fit config's ``model:`` (an ImageClassifier's init_args) for ``dm``'s inputs."""
    return _classifier(dm, **fit["model"]["init_args"])


def _loop_options(fit: dict[str, Any], rounds: int | None) -> dict[str, Any]:
    """Rounds, clients per round and local epochs of a fit config's ``loop:`` (``rounds`` overrides)."""
    loop = fit["loop"]
    return {
        "num_rounds": rounds or loop["num_rounds"],
        "clients_per_round": loop["clients_per_round"],
        "local_epochs": loop["local_epochs"],
    }


# -- DPFL ------------------------------------------------------------------------------------------------------
def one_noisy_epoch_accuracy(allocation: str, epsilons: list[float], protocol: dict[str, Any]) -> list[float]:
    """DPFL Table II protocol: mean test accuracy after one clipped, noised epoch's update, per epsilon.

    ``protocol``: ``image_size``, ``train_epochs`` (the baseline model), ``lr`` (Adam; also the eta of
    Delta f = 2 eta alpha), ``draws`` (noise draws per epsilon), ``clipping`` (:func:`dpfl_noisy_update`).
    """
    dm = FederatedDataModule(
        "digits", num_clients=1, partition="iid", image_size=protocol["image_size"], val_fraction=0.2
    )
    torch.manual_seed(0)
    eta = protocol["lr"]
    model = _classifier(dm, lr=eta)
    L.Trainer(max_epochs=protocol["train_epochs"], **_TRAINER).fit(model, dm.train_dataloader(0, seed=0))
    scores = pogz_scores(model, dm.val_dataloader(0))
    tuned = copy.deepcopy(model)
    L.Trainer(max_epochs=1, **_TRAINER).fit(tuned, dm.train_dataloader(0, seed=1))
    before = copy.deepcopy(model.state_dict())
    delta = {k: tuned.state_dict()[k] - before[k] for k in before if k.startswith("backbone")}
    alpha = float(state_norm(delta, p=1.0))  # no clipping bias: alpha = the update's own L1 norm
    results = []
    for epsilon in epsilons:
        accuracies = []
        for seed in range(protocol["draws"]):
            noisy = dpfl_noisy_update(
                delta,
                scores=scores,
                epsilon=epsilon,
                clip_bound=alpha,
                sensitivity=2 * eta * alpha,
                allocation=allocation,
                clipping=protocol.get("clipping", "whole_update"),
                generator=torch.Generator().manual_seed(seed),
            )
            model.load_state_dict({k: v + noisy[k] if k in noisy else v for k, v in before.items()})
            accuracies.append(L.Trainer(**_TRAINER).test(model, dm.test_dataloader(), verbose=False)[0]["test_acc"])
        results.append(sum(accuracies) / len(accuracies))
    return results


def dpfl_federated(fit: dict[str, Any], epsilon: float | None, rounds: int | None) -> float:
    """DPFL Table III: the fit config's federation, its PoGZNoise at ``epsilon`` (``None``: no noise)."""
    dm = _data(fit)
    torch.manual_seed(0)
    loop_cfg = fit["loop"]
    noise = [instantiate(t, epsilon=epsilon) for t in loop_cfg["client_transforms"]] if epsilon else []
    loop = FederatedLoop(
        _fit_classifier(fit, dm),
        dm,
        **_loop_options(fit, rounds),
        selector=instantiate(loop_cfg["selector"]),
        aggregator=instantiate(loop_cfg["aggregator"]),
        client_transforms=noise,
        server_transforms=[instantiate(t) for t in loop_cfg["server_transforms"]],
        eval_every=rounds or loop_cfg["num_rounds"],
        output_dir=tempfile.mkdtemp(),
        checkpoint=False,
        progress_bar=False,
    )
    return loop.fit()["test_accuracy"]


# -- Fed-CDP / Fed-SDP -----------------------------------------------------------------------------------------
def fed_cdp_run(
    fit: dict[str, Any], defence: str, rounds: int | None, *, fed_sdp_sigma: float, **cdp: Any
) -> dict[str, float]:
    """Fed-CDP Table II row: the fit config's federation with no DP, Fed-SDP or its FedCDP (``cdp`` overrides).

    ``fed_cdp_decay`` replaces the clip bound by a linear decay from ``clip_start`` to ``clip_end`` over the run.
    """
    dm = _data(fit)
    torch.manual_seed(0)
    options = _loop_options(fit, rounds)
    fed_cdp = {**fit["defences"][0]["init_args"], **cdp}
    clip_start, clip_end = fed_cdp.pop("clip_start", None), fed_cdp.pop("clip_end", None)
    defences: list = []
    transforms: list = []
    if defence == "fed_sdp":
        transforms = [FedSDP(noise_multiplier=fed_sdp_sigma, max_grad_norm=fed_cdp["max_grad_norm"])]
    elif defence == "fed_cdp":
        defences = [FedCDP(**fed_cdp)]
    elif defence == "fed_cdp_decay":
        clip = Schedule(clip_start, end=clip_end, kind="linear", num_rounds=options["num_rounds"])
        defences = [FedCDP(**{**fed_cdp, "max_grad_norm": clip})]
    loop = FederatedLoop(
        _fit_classifier(fit, dm),
        dm,
        **options,
        aggregator=instantiate(fit["loop"]["aggregator"]),
        defences=defences,
        client_transforms=transforms,
        eval_every=options["num_rounds"],
        output_dir=tempfile.mkdtemp(),
        checkpoint=False,
        progress_bar=False,
    )
    summary = loop.fit()
    return {"accuracy": summary["test_accuracy"], "epsilon": summary["history"][-1].get("epsilon")}


def table_vi(sigma: float, delta: float) -> list[dict[str, Any]]:
    """Fed-CDP Table VI: the accountant with the paper's recipe (T*L + 1 steps, classic conversion)."""
    rows = []
    for name, steps, q, paper in FED_CDP_TABLE_VI:
        accountant = PrivacyAccountant(conversion="classic")
        accountant.step(noise_multiplier=sigma, sample_rate=q, steps=steps)
        rows.append({"row": name, "paper": paper, "ours": round(accountant.get_epsilon(delta), 4)})
    return rows


def leakage(defence: str, leak_point: str, attack: dict[str, Any]) -> dict[str, Any]:
    """Fed-CDP Table VII cell: iDLG on one example's type-0/1 or type-2 leak (``attack``: the setting)."""
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", batch_size=1, image_size=attack["image_size"])
    torch.manual_seed(0)
    callbacks: list = [
        GradientLeakage(
            IDLGAttack(max_iterations=attack["iterations"], progress_bar=False),
            leak_point=leak_point,
            save_images=False,
        )
    ]
    transforms: list = []
    defences: list = []
    if defence == "fed_sdp":
        transforms = [FedSDP()]
    elif defence in ("fed_cdp", "fed_cdp_decay"):
        decay = Schedule(attack["clip_start"], end=attack["clip_end"], kind="linear", num_rounds=100)
        defences = [FedCDP(max_grad_norm=attack["clip"] if defence == "fed_cdp" else decay)]
    loop = FederatedLoop(
        _classifier(dm, optimizer="sgd", lr=attack["lr"]),
        dm,
        num_rounds=1,
        clients_per_round=1,
        local_steps=1,
        eval_every=0,
        defences=defences,
        callbacks=callbacks,
        client_transforms=transforms,
        output_dir=tempfile.mkdtemp(),
        checkpoint=False,
        progress_bar=False,
    )
    entry = loop.fit()["attacks"][0]
    mse = entry["mse"]
    return {"mse": round(mse, 4), "psnr": round(entry["psnr"], 1), "succeeded": mse < attack["success_mse"]}


# -- 2DP-FL ------------------------------------------------------------------------------------------------------
def dual_dp_run(fit: dict[str, Any], mode: str | None, rounds: int | None) -> dict[str, Any]:
    """2DP-FL Fig. 6(b) bar: the fit config's federation without DP (``mode=None``) or its DualDPFL in ``mode``."""
    dm = _data(fit)
    torch.manual_seed(0)
    options = _loop_options(fit, rounds)
    callbacks: list = []
    defences: list = []
    if mode is not None:
        callbacks = [instantiate(c) for c in fit["loop"]["callbacks"]]
        defences = [instantiate(fit["defences"][0], mode=mode)]
    loop = FederatedLoop(
        _fit_classifier(fit, dm),
        dm,
        **options,
        defences=defences,
        callbacks=callbacks,
        eval_every=options["num_rounds"],
        output_dir=tempfile.mkdtemp(),
        checkpoint=False,
        progress_bar=False,
    )
    summary = loop.fit()
    accuracies = [h["test_accuracy"] for h in summary["history"] if h.get("test_accuracy") is not None]
    return {
        "accuracy": accuracies[-1] if accuracies else loop.evaluate(),
        "rounds": summary["rounds_completed"],
        "epsilon": summary["history"][-1].get("epsilon"),
    }


def _dpfl_table2(args: argparse.Namespace) -> dict[str, Any]:
    protocol = args.from_config["dpfl_table2"]
    eps = protocol["epsilons"]
    return {"epsilon": eps, **{a: one_noisy_epoch_accuracy(a, eps, protocol) for a in protocol["allocations"]}}


def _dpfl_table3(args: argparse.Namespace) -> dict[str, Any]:
    fit = read_yaml(args.dpfl_config)
    return {str(e): dpfl_federated(fit, e, args.rounds) for e in [None, *args.from_config["dpfl_table3"]["epsilons"]]}


def _fed_cdp_table2(args: argparse.Namespace) -> dict[str, Any]:
    fit, setting = read_yaml(args.fed_cdp_config), args.from_config["fed_cdp_table2"]
    common = {"fed_sdp_sigma": setting["fed_sdp_noise_multiplier"], **setting["decay"]}
    rows = {d: fed_cdp_run(fit, d, args.rounds, **common) for d in ("none", "fed_sdp", "fed_cdp", "fed_cdp_decay")}
    for d in ("fed_cdp", "fed_cdp_decay"):  # a noise level the tiny federation survives
        rows[f"{d}/{setting['survivable_label']}"] = fed_cdp_run(fit, d, args.rounds, **common, **setting["survivable"])
    return rows


def _fed_cdp_table6(args: argparse.Namespace) -> list[dict[str, Any]]:
    cdp = read_yaml(args.fed_cdp_config)["defences"][0]["init_args"]
    return table_vi(cdp["noise_multiplier"], cdp["delta"])


def _fed_cdp_table7(args: argparse.Namespace) -> dict[str, Any]:
    attack = args.from_config["fed_cdp_table7"]
    return {
        f"{leak}/{d}": leakage(d, leak, attack)
        for leak in ("client_update", "local_gradient")
        for d in ("none", "fed_sdp", "fed_cdp", "fed_cdp_decay")
    }


def _dual_dp_fig6b(args: argparse.Namespace) -> dict[str, Any]:
    fit = read_yaml(args.dual_dp_config)
    return {str(m): dual_dp_run(fit, m, args.rounds) for m in (None, *args.from_config["dual_dp_fig6b"]["modes"])}


PARTS = {
    "dpfl_table2": _dpfl_table2,
    "dpfl_table3": _dpfl_table3,
    "fed_cdp_table2": _fed_cdp_table2,
    "fed_cdp_table6": _fed_cdp_table6,
    "fed_cdp_table7": _fed_cdp_table7,
    "dual_dp_fig6b": _dual_dp_fig6b,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/dp_tables.yaml"), help="settings file")
    parser.add_argument("--dpfl-config", type=Path, help="fit config of DPFL Table III")
    parser.add_argument("--fed-cdp-config", type=Path, help="fit config of Fed-CDP Tables II and VI")
    parser.add_argument("--dual-dp-config", type=Path, help="fit config of 2DP-FL Fig. 6(b)")
    parser.add_argument("--rounds", type=int, help="federated rounds of every FL row (default: each fit config's)")
    parser.add_argument("--out", default="runs/dp_tables.json")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS), help="tables to run")
    args = parse_args(parser)
    warnings.filterwarnings("ignore")
    start, cpu = time.perf_counter(), time.process_time()
    results: dict[str, Any] = {part: PARTS[part](args) for part in args.parts}
    results["seconds"] = time.perf_counter() - start
    results["cpu_seconds"] = time.process_time() - cpu
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=2, default=str)
    print(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
