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
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from _config import parse_args
from pogz_table2_sweep import noisy_upload

from lightning_fl.attacks import IDLGAttack
from lightning_fl.bench import fit_config_spec, scratch_loop
from lightning_fl.callbacks import GradientLeakage
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import pogz_scores
from lightning_fl.models import ImageClassifier
from lightning_fl.privacy import PrivacyAccountant, state_norm
from tests.privacy.paper_tables import FED_CDP_TABLE_VI  # the published numbers live with the tests

_TRAINER = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
_TRAINER |= {"enable_model_summary": False, "accelerator": "cpu"}


def _classifier(dm: FederatedDataModule, **kwargs: Any) -> ImageClassifier:
    return ImageClassifier(**{"backbone": "lenet_dlg", "lr": 2e-3, **kwargs, **dm.model_options})


def _component(class_path: str, **init_args: Any) -> dict[str, Any]:
    return {"class_path": class_path, "init_args": init_args}


def _with_args(component: dict[str, Any], **init_args: Any) -> dict[str, Any]:
    """A fit config's ``class_path``/``init_args`` entry with ``init_args`` put over its own."""
    return {**component, "init_args": {**component.get("init_args", {}), **init_args}}


def _rounds(fit: dict[str, Any], rounds: int | None, **loop: Any) -> dict[str, Any]:
    """The fit config's ``loop:`` run for ``rounds`` (default: its own), evaluated after the last; ``loop`` on top."""
    num_rounds = rounds or fit["loop"]["num_rounds"]
    return {**fit["loop"], "num_rounds": num_rounds, "eval_every": num_rounds, **loop}


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
            clipping, generator = protocol.get("clipping", "whole_update"), torch.Generator().manual_seed(seed)
            noisy = noisy_upload(delta, scores, epsilon, alpha, allocation, clipping, generator, eta=eta)
            model.load_state_dict({k: v + noisy[k] if k in noisy else v for k, v in before.items()})
            accuracies.append(L.Trainer(**_TRAINER).test(model, dm.test_dataloader(), verbose=False)[0]["test_acc"])
        results.append(sum(accuracies) / len(accuracies))
    return results


def dpfl_federated(fit: dict[str, Any], epsilon: float | None, rounds: int | None) -> float:
    """DPFL Table III: the fit config's federation, its PoGZNoise at ``epsilon`` (``None``: no noise)."""
    noise = [_with_args(t, epsilon=epsilon) for t in fit["loop"]["client_transforms"]] if epsilon else []
    with scratch_loop({**fit, "loop": _rounds(fit, rounds, client_transforms=noise)}) as loop:
        return loop.fit()["test_accuracy"]


# -- Fed-CDP / Fed-SDP -----------------------------------------------------------------------------------------
def fed_cdp_run(
    fit: dict[str, Any], defence: str, rounds: int | None, *, fed_sdp_sigma: float, **cdp: Any
) -> dict[str, float]:
    """Fed-CDP Table II row: the fit config's federation with no DP, Fed-SDP or its FedCDP (``cdp`` overrides).

    ``fed_cdp_decay`` replaces the clip bound by a linear decay from ``clip_start`` to ``clip_end`` over the run.
    """
    loop = _rounds(fit, rounds)
    fed_cdp = _with_args(fit["defences"][0], **cdp)
    clip_start, clip_end = fed_cdp["init_args"].pop("clip_start", None), fed_cdp["init_args"].pop("clip_end", None)
    clip = fed_cdp["init_args"]["max_grad_norm"]
    decay = _component(
        "lightning_fl.privacy.Schedule", start=clip_start, end=clip_end, kind="linear", num_rounds=loop["num_rounds"]
    )
    fed_sdp = _component("lightning_fl.defences.FedSDP", noise_multiplier=fed_sdp_sigma, max_grad_norm=clip)
    defences, transforms = {
        "none": ([], []),
        "fed_sdp": ([], [fed_sdp]),
        "fed_cdp": ([fed_cdp], []),
        "fed_cdp_decay": ([_with_args(fed_cdp, max_grad_norm=decay)], []),
    }[defence]
    with scratch_loop({**fit, "defences": defences, "loop": {**loop, "client_transforms": transforms}}) as federation:
        summary = federation.fit()
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
    decay = _component(
        "lightning_fl.privacy.Schedule",
        start=attack["clip_start"],
        end=attack["clip_end"],
        kind="linear",
        num_rounds=100,
    )
    clip = {"fed_cdp": attack["clip"], "fed_cdp_decay": decay}.get(defence)
    fed_cdp = _component("lightning_fl.defences.FedCDP", max_grad_norm=clip, sampling=attack["sampling"])
    defences = [fed_cdp] if clip is not None else []
    spec = {
        "seed": 0,
        "data": {
            "dataset": "digits",
            "num_clients": 2,
            "partition": "iid",
            "batch_size": 1,
            "image_size": attack["image_size"],
        },
        "model": _component("lightning_fl.models.ImageClassifier", optimizer="sgd", lr=attack["lr"]),
        "defences": defences,
        "loop": {
            "num_rounds": 1,
            "clients_per_round": 1,
            "local_steps": 1,
            "eval_every": 0,
            "client_transforms": [_component("lightning_fl.defences.FedSDP")] if defence == "fed_sdp" else [],
        },
    }
    attacker = IDLGAttack(max_iterations=attack["iterations"], progress_bar=False)
    with scratch_loop(spec, callbacks=[GradientLeakage(attacker, leak_point=leak_point, save_images=False)]) as loop:
        entry = loop.fit()["attacks"][0]
    mse = entry["mse"]
    return {"mse": round(mse, 4), "psnr": round(entry["psnr"], 1), "succeeded": mse < attack["success_mse"]}


# -- 2DP-FL ------------------------------------------------------------------------------------------------------
def dual_dp_run(fit: dict[str, Any], mode: str | None, rounds: int | None) -> dict[str, Any]:
    """2DP-FL Fig. 6(b) bar: the fit config's federation without DP (``mode=None``) or its DualDPFL in ``mode``."""
    if mode is None:
        spec = {**fit, "defences": [], "loop": _rounds(fit, rounds, callbacks=[])}
    else:
        spec = {**fit, "defences": [_with_args(fit["defences"][0], mode=mode)], "loop": _rounds(fit, rounds)}
    with scratch_loop(spec) as loop:
        summary = loop.fit()
        accuracies = [h["test_accuracy"] for h in summary["history"] if h.get("test_accuracy") is not None]
        accuracy = accuracies[-1] if accuracies else loop.evaluate()
    return {
        "accuracy": accuracy,
        "rounds": summary["rounds_completed"],
        "epsilon": summary["history"][-1].get("epsilon"),
    }


def _dpfl_table2(args: argparse.Namespace) -> dict[str, Any]:
    protocol = args.sweep["dpfl_table2"]
    eps = protocol["epsilons"]
    return {"epsilon": eps, **{a: one_noisy_epoch_accuracy(a, eps, protocol) for a in protocol["allocations"]}}


def _dpfl_table3(args: argparse.Namespace) -> dict[str, Any]:
    fit = fit_config_spec(args.dpfl_config)
    return {str(e): dpfl_federated(fit, e, args.rounds) for e in [None, *args.sweep["dpfl_table3"]["epsilons"]]}


def _fed_cdp_table2(args: argparse.Namespace) -> dict[str, Any]:
    fit, setting = fit_config_spec(args.fed_cdp_config), args.sweep["fed_cdp_table2"]
    common = {"fed_sdp_sigma": setting["fed_sdp_noise_multiplier"], **setting["decay"]}
    rows = {d: fed_cdp_run(fit, d, args.rounds, **common) for d in ("none", "fed_sdp", "fed_cdp", "fed_cdp_decay")}
    for d in ("fed_cdp", "fed_cdp_decay"):  # a noise level the tiny federation survives
        rows[f"{d}/{setting['survivable_label']}"] = fed_cdp_run(fit, d, args.rounds, **common, **setting["survivable"])
    return rows


def _fed_cdp_table6(args: argparse.Namespace) -> list[dict[str, Any]]:
    cdp = fit_config_spec(args.fed_cdp_config)["defences"][0]["init_args"]
    return table_vi(cdp["noise_multiplier"], cdp["delta"])


def _fed_cdp_table7(args: argparse.Namespace) -> dict[str, Any]:
    attack = args.sweep["fed_cdp_table7"]
    return {
        f"{leak}/{d}": leakage(d, leak, attack)
        for leak in ("client_update", "local_gradient")
        for d in ("none", "fed_sdp", "fed_cdp", "fed_cdp_decay")
    }


def _dual_dp_fig6b(args: argparse.Namespace) -> dict[str, Any]:
    fit = fit_config_spec(args.dual_dp_config)
    return {str(m): dual_dp_run(fit, m, args.rounds) for m in (None, *args.sweep["dual_dp_fig6b"]["modes"])}


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
    start, cpu = time.perf_counter(), time.process_time()
    results: dict[str, Any] = {part: PARTS[part](args) for part in args.parts}
    results["seconds"] = time.perf_counter() - start
    results["cpu_seconds"] = time.process_time() - cpu
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=2, default=str)
    print(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
