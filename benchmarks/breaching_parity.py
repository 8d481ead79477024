"""Both sides in one run: this project's label strategies and analytic attack against breaching 0.1.2's.

breaching (Geiping et al.; ``pip install breaching==0.1.2``) is never a dependency: run this script with a Python
that has it, e.g. a venv under /tmp. On the same victims and the same gradients:

- ``labels``: label accuracy (count / set) of breaching's ``_recover_label_information`` strategies (``iDLG``,
  ``analytic``, ``yin``, ``wainakh-simple``, ``wainakh-whitebox``, ``bias-corrected``) and ours, on the untrained
  DLG LeNet of ``benchmarks/label_recovery.py`` (10 victims per cell);
- ``analytic``: breaching's ``AnalyticAttacker`` (config ``attack=analytic``) and our ``AnalyticLinearAttack`` on
  the MLP of ``benchmarks/analytic_attack.py`` without input standardisation (breaching inverts a
  ``torch.nn.Sequential``): share of images copied exactly (PSNR >= 60 dB) and mean PSNR;
- ``stg``: breaching's ``seethroughgradients`` attacker (hydra ``attack=seethroughgradients``, the server sending the
  BN buffers, so the user's gradient is an eval-mode one) and our ``SeeThroughGradientsAttack`` on a conv-BN net
  whose running statistics are another client's photos, held-out ``photos`` test images: breaching with its shipped
  config and with ``objective.scale=2`` (its data term then our plain distance), ours matched to each
  (:func:`matched_options`), and ours with its defaults; PSNR, SSIM, label accuracy, share of images at
  ``--success-psnr`` dB or more, process CPU seconds per batch;
- ``dlg`` and ``ig``: breaching's shipped ``deepleakage`` and ``invertinggradients`` attackers and our ``DLGAttack``
  and ``InvertingGradientsAttack`` (matched to breaching's config, and with our defaults; for ``ig`` also
  ``configs/inverting_gradients_full.yaml``'s attack as shipped, ``--sides "ours config"``) on one gradient of one
  32x32 ``photo_tiles`` image (the first held-out tile of each of ``--images`` photographs, the first ones or
  ``--photographs``), the same
  ``--backbone`` weights on both sides (our module is breaching's model), the same random start where the shapes
  allow (breaching's ``torch.randn`` under ``torch.manual_seed(seed)`` draws what our seeded generator draws). The
  server sends no buffers, so breaching's user and ours compute the gradient in training mode (BatchNorm with the
  batch's statistics), and both attackers run the model in training mode. ``--local-steps T`` attacks a FedAvg
  update of T SGD steps of one image each (breaching's ``UserMultiStep``, its local hyperparameters shared; ours
  through ``client_view(local_steps=T)``); ``--train-epochs`` trains the victim first; ``--device cuda`` runs both
  sides there (``benchmarks/gpu_breaching.sh``). PSNR and SSIM per image and their mean, seconds per image.

Run: ``OMP_NUM_THREADS=1 /tmp/breach/bin/python benchmarks/breaching_parity.py --part labels``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from pathlib import Path
from statistics import mean

import breaching
import torch
from _config import instantiate, read_yaml
from _timing import clock
from analytic_attack import held_out
from hydra import compose, initialize_config_module
from label_recovery import pool, victim
from omegaconf import DictConfig, OmegaConf, open_dict
from see_through_gradients import held_out_batch

from lightning_fl.attacks import (
    AnalyticLinearAttack,
    DLGAttack,
    GradientAttack,
    InvertingGradientsAttack,
    SeeThroughGradientsAttack,
)
from lightning_fl.attacks.label_counts import dummy_statistics
from lightning_fl.attacks.labels import infer_labels, last_layer_bias_name, last_layer_weight_name
from lightning_fl.attacks.metrics import (
    label_recovery_accuracy,
    label_set_accuracy,
    match_reconstructions,
    psnr,
    ssim,
)
from lightning_fl.attacks.standalone import client_view, view_on
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.datamodules.datasets import load_dataset
from lightning_fl.messages import ServerView
from lightning_fl.models import MLP, build_backbone

THEIRS = ("iDLG", "analytic", "yin", "wainakh-simple", "wainakh-whitebox", "bias-corrected")
OURS = ("idlg", "yin", "llg", "weight_count", "bias_count")
CPU = dict(dtype=torch.float, device=torch.device("cpu"))
SIDES = ("breaching", "ours matched", "ours default", "ours config")
"""The attacks of the ``dlg`` and ``ig`` parts (:func:`our_attacks`; ``ours config``: ``ig`` only)."""
FULL_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "inverting_gradients_full.yaml"
"""The shipped ``full``-budget Inverting Gradients config whose ``attack:`` the ``ours config`` side runs."""
GRADIENT_MATCHING = {"dlg": "deepleakage", "ig": "invertinggradients"}
"""Our part name -> breaching's attack config."""
LBFGS_EVALUATIONS = 20
"""Objective evaluations in one ``step()`` of ``torch.optim.LBFGS`` (its ``max_iter``), breaching's DLG optimiser: its
``max_iterations`` counts steps, ours counts evaluations."""


def breaching_attacker(model: torch.nn.Module, *, label_strategy: str, kind: str = "analytic"):
    """breaching's attacker of ``kind`` over ``model`` with its shipped config and ``label_strategy``."""
    config = OmegaConf.load(Path(breaching.__file__).parent / "config" / "attack" / f"{kind}.yaml")
    config.label_strategy = label_strategy
    cls = breaching.attacks.analytic_attack.AnalyticAttacker
    return cls(model, _cross_entropy, config, CPU)


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy that accepts the float class indices breaching's ``wainakh-whitebox`` builds (torch 2 rejects
    them in ``torch.nn.CrossEntropyLoss``)."""
    return torch.nn.functional.cross_entropy(logits, targets.long())


def payloads(
    model: torch.nn.Module, view, size: int, *, buffers: bool = False, labels: torch.Tensor | None = None
) -> tuple[list, list]:
    """breaching's (server_payload, shared_data) for the gradient in ``view``; ``buffers``: the server sends the
    model's public buffers (BN running statistics; breaching's user then computes its gradient in eval mode). An
    update of several local steps (``view.kind == "update"``) comes with the user's local hyperparameters, as
    breaching's ``UserMultiStep`` shares them: step size, steps, images per step and ``labels`` of each step."""
    shape = tuple(view.metadata["input_shape"])
    metadata = {"shape": list(shape), "modality": "vision", "mean": [0.0], "std": [1.0], "task": "classification"}
    metadata = OmegaConf.create(metadata | {"classes": view.metadata["num_classes"]})
    public = [b.detach() for b in model.buffers()] if buffers else None
    server = [{"parameters": [p.detach() for p in model.parameters()], "buffers": public, "metadata": metadata}]
    names = [n for n, _ in model.named_parameters()]
    shared = {"gradients": [view.tensors[n] for n in names], "buffers": None}
    local = None
    if view.kind == "update":
        steps, per_step = view.metadata["local_steps"], view.metadata["batch_size"]
        local = {"lr": view.metadata["lr"], "steps": steps, "data_per_step": per_step}
        local["labels"] = [chunk.sort()[0] for chunk in labels.split(per_step)]
    shared["metadata"] = {"num_data_points": size, "labels": None, "local_hyperparams": local}
    return server, [shared]


def labels_part(args: argparse.Namespace) -> None:
    for data in args.data:
        images, labels = pool(data)
        scores: dict[tuple[int, str], list[tuple[float, float]]] = {}
        failures: dict[str, str] = {}
        for seed in range(args.seeds):
            model = victim(data, seed=seed, train_epochs=0)
            k = model.num_classes
            weight = last_layer_weight_name(model, num_classes=k)
            bias = last_layer_bias_name(model, weight_name=weight)
            dummy = dummy_statistics(model, classifier_weight=weight, input_shape=images.shape[1:], seed=seed)
            for size in args.batch_sizes:
                index = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))[:size]
                view = client_view(model, images[index], labels[index], num_classes=k)
                truth = labels[index]
                found = {}
                for strategy in OURS:
                    if strategy in ("idlg", "yin") and size > k:
                        continue
                    found[f"ours {strategy}"] = infer_labels(
                        view.tensors[weight],
                        num_images=size,
                        strategy=strategy,
                        bias_gradient=view.tensors[bias],
                        dummy=dummy,
                    )
                server, shared = payloads(model, view, size)
                for strategy in THEIRS:
                    torch.manual_seed(seed)  # breaching pads with random labels and draws random dummy data
                    try:
                        _, got, _ = breaching_attacker(model, label_strategy=strategy).prepare_attack(server, shared)
                    except RuntimeError as error:  # its wainakh-whitebox differentiates a tensor outside the graph
                        failures[strategy] = str(error).split(".")[0]
                        continue
                    found[f"breaching {strategy}"] = got.cpu().long()
                for name, got in found.items():
                    count = float(label_recovery_accuracy(got, truth, num_classes=k))
                    scores.setdefault((size, name), []).append((count, label_set_accuracy(got, truth)))
        for (size, name), values in scores.items():
            count, sets = (sum(v) / len(v) for v in zip(*values, strict=True))
            row = {"part": "labels", "data": data, "batch_size": size, "strategy": name}
            print(json.dumps(row | {"count_accuracy": round(count, 3), "set_accuracy": round(sets, 3)}), flush=True)
        for strategy, error in failures.items():
            print(json.dumps({"part": "labels", "data": data, "strategy": f"breaching {strategy}", "error": error}))


def analytic_part(args: argparse.Namespace) -> None:
    for data in args.data:
        images, labels, k = held_out(data)
        for size in args.batch_sizes:
            results: dict[str, list[torch.Tensor]] = {"ours": [], "breaching": []}
            for seed in range(args.seeds):
                torch.manual_seed(seed)
                model = MLP(in_channels=images.shape[1], num_classes=k, image_size=32).layers
                index = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))[:size]
                view = client_view(model, images[index], labels[index], num_classes=k)
                ours = AnalyticLinearAttack().reconstruct(view).images
                server, shared = payloads(model, view, size)
                theirs, _ = breaching_attacker(model, label_strategy="analytic").reconstruct(server, shared)
                for side, recon in (("ours", ours), ("breaching", theirs["data"].detach().clamp(0, 1))):
                    rows, cols = match_reconstructions(recon, images[index])
                    results[side].append(psnr(recon[rows], images[index][cols]))
            for side, values in results.items():
                per_image = torch.cat(values)
                row = {"part": "analytic", "data": data, "batch_size": size, "side": side}
                row |= {"exact": round(float((per_image >= 60).double().mean()), 3)}
                print(json.dumps(row | {"mean_psnr": round(float(per_image.mean()), 1)}), flush=True)


def attack_config(kind: str, iterations: int) -> DictConfig:
    """breaching's shipped ``attack=kind`` config (composed with its defaults), cut to ``iterations`` optimiser steps
    (its step-size schedule then spans that budget)."""
    with initialize_config_module("breaching.config", version_base=None):
        config = compose("cfg", overrides=[f"attack={kind}"]).attack
    config.optim.max_iterations = config.optim.callback = iterations
    return config


def stg_config(iterations: int) -> DictConfig:
    """breaching's shipped ``attack=seethroughgradients`` config cut to ``iterations`` Adam steps (its cosine decay and
    warm-up then span that budget)."""
    return attack_config("seethroughgradients", iterations)


def matched_options(config: DictConfig, *, batch_numel: int) -> dict:
    """``SeeThroughGradientsAttack`` options whose objective is breaching's ``config`` objective divided by its
    constant factor ``0.5 * objective.scale`` (breaching's distance: ``0.5 * scale * sum ||g' - g||^2``; ours: the
    plain ``sum ||g' - g||^2``).

    breaching's regularisers map onto ours term by term: its total variation (mean over pixels of the absolute
    horizontal plus vertical difference, zero-padded border) is ours (mean absolute differences inside the image);
    its norm term ``mean(x^2) / 2`` is ours ``sum(x^2)`` over the ``batch_numel`` entries of a candidate batch; its
    deep-inversion term is our BN prior, except that breaching multiplies the first BN layer's distance by
    ``first_bn_multiplier`` (10) and takes a deeper layer's input statistics from the eval-mode forward (earlier
    layers normalised with the running statistics), where our prior runs the model with batch statistics. One
    restart, no group term (breaching has none), its label rule. Not expressible: its Langevin noise, warm-up and
    cosine decay, keeping the best iterate.

    Raises:
        ValueError: when ``config`` uses a setting this mapping does not translate.
    """
    regs = config.regularization
    unsupported = [
        message
        for message, bad in (
            (f"objective.type={config.objective.type}", config.objective.type != "euclidean"),
            (f"optim.optimizer={config.optim.optimizer}", str(config.optim.optimizer).lower() != "adam"),
            ("optim.boxed=False", not config.optim.boxed),
            (f"regularization keys {sorted(regs)}", set(regs) - {"total_variation", "norm", "deep_inversion"}),
            (
                "total_variation exponents != 1",
                regs.total_variation.inner_exp != 1 or regs.total_variation.outer_exp != 1,
            ),
            (f"norm.pnorm={regs.norm.pnorm}", regs.norm.pnorm != 2),
        )
        if bad
    ]
    if unsupported:
        raise ValueError(f"matched_options cannot translate breaching's {', '.join(unsupported)}.")
    factor = 0.5 * config.objective.scale
    return {
        "max_iterations": config.optim.max_iterations,
        "lr": config.optim.step_size,
        "restarts": config.restarts.num_trials,
        "group_weight": 0.0,
        "label_strategy": config.label_strategy,
        "tv_weight": regs.total_variation.scale / factor,
        "l2_weight": regs.norm.scale / (regs.norm.pnorm * factor * batch_numel),
        "bn_weight": regs.deep_inversion.scale / factor,
    }


def stg_victim(dm: FederatedDataModule, seed: int) -> torch.nn.Sequential:
    """A conv-BN network in eval mode whose BN running statistics are client 1's images (cumulative average): the
    broadcast model whose public buffers the server sends."""
    torch.manual_seed(seed)
    side, k = dm.image_size // 2, dm.num_classes
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16, momentum=None),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1, stride=2),
        torch.nn.BatchNorm2d(32, momentum=None),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * side * side, k),
    )
    with torch.no_grad():
        for chunk in dm.client_train_set(1).tensors()[0].split(64):
            net.train()(chunk)
    return net.eval()


def eval_view(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, num_classes: int) -> ServerView:
    """The server's view of one gradient computed in eval mode (BN with the running statistics), as breaching's
    user computes it when the server sends public buffers."""
    view = client_view(model, images, labels, num_classes=num_classes)
    loss = torch.nn.functional.cross_entropy(model.eval()(images), labels)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    tensors = {n: g.detach() for (n, _), g in zip(model.named_parameters(), grads, strict=True)}
    return dataclasses.replace(view, model=view.model.eval(), tensors=tensors)


def objective_terms(
    model: torch.nn.Module, view: ServerView, config: DictConfig, candidates: dict, *, buffers: bool = True
) -> tuple:
    """breaching's objective under ``config`` split into its terms (its units: data term and each regulariser with
    their scales), at each of ``candidates`` (name -> a batch), and the labels its label rule recovered;
    ``buffers``: the server sends the BN buffers (eval mode) or not (training mode), see :func:`payloads`."""
    attacker = breaching.attacks.prepare_attack(model, torch.nn.CrossEntropyLoss(), config, CPU)
    server, shared = payloads(model, view, view.metadata["batch_size"], buffers=buffers)
    models, labels, _ = attacker.prepare_attack(server, shared)
    for regulariser in attacker.regularizers:
        regulariser.initialize(models, shared, labels)
    attacker.objective.initialize(attacker.loss_fn, config.impl, None)
    terms = {}
    for name, candidate in candidates.items():
        data, _ = attacker.objective(models[0], shared[0]["gradients"], candidate, labels)  # the BN hooks fire here
        terms[name] = {"data": float(data.detach())} | {
            type(r).__name__: float(r(candidate)) for r in attacker.regularizers
        }
    return terms, labels


def stg_runs(
    model: torch.nn.Module,
    view: ServerView,
    images: torch.Tensor,
    configs: dict[str, DictConfig],
    *,
    probes: dict[str, DictConfig],
    iterations: int,
    seed: int,
) -> dict:
    """(images, labels, CPU seconds) of each side on one gradient: breaching with each of ``configs`` and
    ``probes``, ours matched to each of ``configs``, and ours with its defaults."""
    attacks = {
        f"ours matched to {name}": SeeThroughGradientsAttack(
            **matched_options(config, batch_numel=images.numel()), progress_bar=False, seed=seed
        )
        for name, config in configs.items()
    }
    attacks["ours default"] = SeeThroughGradientsAttack(max_iterations=iterations, progress_bar=False, seed=seed)
    runs = {}
    for side, attack in attacks.items():
        start = time.process_time()
        result = attack.reconstruct(view)
        runs[side] = (result.images, result.labels, time.process_time() - start)
    server, shared = payloads(model, view, len(images), buffers=True)
    for name, config in (configs | probes).items():
        attacker = breaching.attacks.prepare_attack(model, torch.nn.CrossEntropyLoss(), config, CPU)
        torch.manual_seed(seed)  # breaching's random start and Langevin noise
        start = time.process_time()
        found, _ = attacker.reconstruct(server, shared, {})
        seconds = time.process_time() - start
        runs[f"breaching {name}"] = (found["data"].detach().clamp(0, 1), found["labels"].long(), seconds)
    return runs


def stg_part(args: argparse.Namespace) -> None:
    dm = FederatedDataModule("photos", num_clients=2, partition="iid", image_size=args.image_size, val_fraction=0.0)
    dm.setup()
    shipped, rescaled, ours_schedule = (stg_config(args.iterations) for _ in range(3))
    # 0.5 * scale = 1: the data term is our plain distance and the regulariser scales are our default weights
    rescaled.objective.scale = ours_schedule.objective.scale = 2.0
    configs = {"shipped": shipped, "objective.scale=2": rescaled}
    # what is then left to breaching's engine: the best iterate, eval-mode BN features, the TV border
    with open_dict(ours_schedule):
        ours_schedule.merge_with({"optim": {"step_size_decay": "step-lr", "warmup": 0, "langevin_noise": 0}})
        ours_schedule.regularization.deep_inversion.first_bn_multiplier = 1
    probes = {"objective.scale=2, our schedule": ours_schedule}
    for size in args.batch_sizes:
        scores: dict[str, list[tuple[torch.Tensor, torch.Tensor, float, float]]] = {}
        for seed in range(args.seeds):
            images, labels = held_out_batch(dm, size, seed)
            model = stg_victim(dm, seed)
            view = eval_view(model, images, labels, dm.num_classes)
            start = torch.randn(images.shape, generator=torch.Generator().manual_seed(seed))
            terms, _ = objective_terms(model, view, shipped, {"random start": start, "true images": images})
            print(json.dumps({"part": "stg", "batch_size": size, "seed": seed, "shipped terms": terms}), flush=True)
            runs = stg_runs(model, view, images, configs, probes=probes, iterations=args.iterations, seed=seed)
            for side, (recon, got, seconds) in runs.items():
                rows, cols = match_reconstructions(recon, images)
                accuracy = float(label_recovery_accuracy(got, labels, num_classes=dm.num_classes))
                entry = (psnr(recon[rows], images[cols]), ssim(recon[rows], images[cols]), accuracy, seconds)
                scores.setdefault(side, []).append(entry)
                row = {"part": "stg", "batch_size": size, "seed": seed, "side": side, "seconds": round(seconds, 1)}
                print(json.dumps(row | {"psnr": round(float(entry[0].mean()), 2)}), flush=True)
        for side, entries in scores.items():
            per_image, ssims = torch.cat([e[0] for e in entries]), torch.cat([e[1] for e in entries])
            row = {"part": "stg", "data": "photos", "image_size": args.image_size, "batch_size": size, "side": side}
            row |= {"iterations": args.iterations, "seeds": args.seeds, "psnr": round(float(per_image.mean()), 2)}
            row |= {"ssim": round(float(ssims.mean()), 3), "label_accuracy": round(mean(e[2] for e in entries), 3)}
            row |= {"success": round(float((per_image >= args.success_psnr).double().mean()), 3)}
            print(json.dumps(row | {"cpu_s": round(mean(e[3] for e in entries), 1)}), flush=True)


def tiles(photographs: list[int], image_size: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The first held-out ``photo_tiles`` tile of each of ``photographs`` (class indices): images, labels, classes."""
    data = load_dataset("photo_tiles", train=False, image_size=image_size)
    outside = [k for k in photographs if not 0 <= k < data.num_classes]
    if outside:
        raise ValueError(
            f"--photographs {outside}: photo_tiles has {data.num_classes} photographs; use 0..{data.num_classes - 1}."
        )
    images, labels = data.tensors()
    first = [int((labels == k).nonzero()[0]) for k in photographs]
    return images[first], labels[first], data.num_classes


def gm_victim(args: argparse.Namespace, num_classes: int) -> torch.nn.Module:
    """The attacked ``--backbone`` (seed 0 weights), trained ``--train-epochs`` on the ``photo_tiles`` training split
    with SGD (0.05, momentum 0.9, batches of 32) when asked, on ``--device``."""
    torch.manual_seed(0)
    model = build_backbone(args.backbone, in_channels=3, num_classes=num_classes, image_size=args.image_size)
    model = model.to(args.device).train()
    if args.train_epochs:
        images, labels = load_dataset("photo_tiles", train=True, image_size=args.image_size).tensors()
        optimiser = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for _ in range(args.train_epochs):
            for index in torch.randperm(len(images)).split(32):
                loss = torch.nn.functional.cross_entropy(
                    model(images[index].to(args.device)), labels[index].to(args.device)
                )
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
    return model


def our_attacks(part: str, config: DictConfig, *, iterations: int, seed: int) -> dict[str, GradientAttack]:
    """Our attack of ``part`` matched to breaching's ``config`` (same optimiser, step size, objective weights, one
    random start from the same draw, no early stop) and with our defaults, both at ``iterations`` (breaching's unit:
    Adam steps for ``ig``; L-BFGS ``step()`` calls for ``dlg``, ``LBFGS_EVALUATIONS`` objective evaluations each,
    ours counting evaluations); for ``ig`` also the ``attack:`` of :data:`FULL_CONFIG` as shipped (its own budget,
    priors and restarts; ``iterations`` does not apply)."""
    common = {"progress_bar": False, "seed": seed}
    if part == "ig":
        matched = InvertingGradientsAttack(
            max_iterations=iterations,
            lr=config.optim.step_size,
            restarts=config.restarts.num_trials,
            tv_weight=config.regularization.total_variation.scale,
            **common,
        )
        return {
            "ours matched": matched,
            "ours default": InvertingGradientsAttack(max_iterations=iterations, **common),
            "ours config": instantiate(read_yaml(FULL_CONFIG)["attack"], **common),
        }
    evaluations = iterations * LBFGS_EVALUATIONS
    matched = DLGAttack(
        max_iterations=evaluations,
        lr=config.optim.step_size,
        restarts=config.restarts.num_trials,
        init=config.init,
        labels="optimise",
        stop_below=None,
        keep_best_after=None,
        recover_stalled=False,
        tv_weight=0.0,
        **common,
    )
    return {"ours matched": matched, "ours default": DLGAttack(max_iterations=evaluations, **common)}


def gm_runs(part: str, model: torch.nn.Module, view: ServerView, labels: torch.Tensor, args, seed: int) -> dict:
    """(images, labels, seconds) of breaching's shipped attacker of ``part`` and of :func:`our_attacks` on ``view``."""
    config = attack_config(GRADIENT_MATCHING[part], args.iterations)
    runs = {}
    attacks = our_attacks(part, config, iterations=args.iterations, seed=seed)
    for side, attack in ((side, attack) for side, attack in attacks.items() if side in args.sides):
        start = clock(args.device)
        result = attack.reconstruct(view)
        runs[side] = (result.images, result.labels, clock(args.device) - start)
    if "breaching" not in args.sides:
        return runs
    setup = dict(dtype=torch.float, device=torch.device(args.device))
    attacker = breaching.attacks.prepare_attack(model, torch.nn.CrossEntropyLoss(), config, setup)
    server, shared = payloads(model, view, len(labels), labels=labels.to(args.device))
    torch.manual_seed(seed)  # breaching's random start (and DLG's label logits after it)
    start = clock(args.device)
    found, _ = attacker.reconstruct(server, shared, {})
    runs["breaching"] = (
        found["data"].detach().cpu().clamp(0, 1),
        found["labels"].cpu().long(),
        clock(args.device) - start,
    )
    return runs


def reference_terms(
    model: torch.nn.Module, view: ServerView, truth: torch.Tensor, seed: int, found: dict[str, torch.Tensor]
) -> dict:
    """breaching's shipped Inverting Gradients objective (:func:`objective_terms`, training mode) at the true image,
    its own mean colour, a uniform grey one, the boxed random start of ``seed`` and each side's returned image in
    ``found``, with each one's PSNR and SSIM: where the optimum sits and how near each side got to it."""
    start = torch.randn(truth.shape, generator=torch.Generator().manual_seed(seed)).clamp(0, 1)
    colour = truth.mean(dim=(2, 3), keepdim=True).expand_as(truth).contiguous()
    candidates = {"true image": truth, "own mean colour": colour, "grey 0.5": torch.full_like(truth, 0.5)}
    candidates |= {"random start": start} | {f"{side} result": recon for side, recon in found.items()}
    config = attack_config(GRADIENT_MATCHING["ig"], 1)
    terms, _ = objective_terms(model, view, config, candidates, buffers=False)
    scores = {
        name: {"psnr": round(float(psnr(x, truth).mean()), 2), "ssim": round(float(ssim(x, truth).mean()), 3)}
        for name, x in candidates.items()
    }
    return {name: {key: round(value, 4) for key, value in terms[name].items()} | scores[name] for name in candidates}


def gradient_matching_part(args: argparse.Namespace) -> None:
    steps = args.local_steps
    photographs = args.photographs or list(range(args.images * steps))
    if len(photographs) != args.images * steps:
        raise ValueError(f"--photographs: give --images x --local-steps = {args.images * steps} of them.")
    images, labels, k = tiles(photographs, args.image_size)
    model = gm_victim(args, k)
    scores: dict[str, list[tuple[float, float, float | None, float]]] = {}
    for seed in range(args.images):
        chosen = torch.arange(seed * steps, (seed + 1) * steps)  # one tile a gradient, or a step of an update
        truth, truth_labels = images[chosen], labels[chosen]
        view = view_on(
            client_view(
                model,
                truth.to(args.device),
                truth_labels.to(args.device),
                num_classes=k,
                local_steps=steps,
                lr=args.local_lr,
            ),
            args.device,
        )
        runs = gm_runs(args.part, model, view, truth_labels, args, seed)
        if args.part == "ig" and steps == 1 and args.device == "cpu":
            found = {side: run[0] for side, run in runs.items()}
            terms = reference_terms(model, view, truth, seed, found)
            print(json.dumps({"part": "ig", "image": seed, "shipped terms": terms}), flush=True)
        for side, (recon, got, seconds) in runs.items():
            rows, cols = match_reconstructions(recon, truth)
            # breaching's label rule on an update returns every class of negative bias (its objective takes the
            # per-step labels the user shares instead): no accuracy when the count is off
            accuracy = None
            if got.shape == truth_labels.shape:
                accuracy = float(label_recovery_accuracy(got, truth_labels, num_classes=k))
            entry = (float(psnr(recon[rows], truth[cols]).mean()), float(ssim(recon[rows], truth[cols]).mean()))
            scores.setdefault(side, []).append((*entry, accuracy, seconds))
            row = {
                "part": args.part,
                "image": seed,
                "side": side,
                "psnr": round(entry[0], 2),
                "ssim": round(entry[1], 3),
            }
            print(json.dumps(row | {"label_accuracy": accuracy, "seconds": round(seconds, 1)}), flush=True)
    for side, entries in scores.items():
        row = {"part": args.part, "backbone": args.backbone, "train_epochs": args.train_epochs, "local_steps": steps}
        row |= {"iterations": args.iterations, "images": args.images, "side": side, "device": args.device}
        row |= {"psnr": round(mean(e[0] for e in entries), 2), "ssim": round(mean(e[1] for e in entries), 3)}
        row |= {
            "per_image_psnr": [round(e[0], 2) for e in entries],
            "per_image_ssim": [round(e[1], 3) for e in entries],
        }
        known = [e[2] for e in entries if e[2] is not None]
        row |= {"label_accuracy": round(mean(known), 3) if known else None}
        print(json.dumps(row | {"seconds": round(mean(e[3] for e in entries), 1)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=sorted(PARTS), required=True)
    parser.add_argument("--data", nargs="+", default=["digits", "photos"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 8, 32, 64])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument(
        "--iterations", type=int, default=300, help="stg, ig: Adam steps of every attack; dlg: breaching's L-BFGS steps"
    )
    parser.add_argument("--image-size", type=int, default=16, help="stg, dlg, ig: side of the images")
    parser.add_argument(
        "--images", type=int, default=8, help="dlg, ig: gradients (updates) attacked, of one tile a step"
    )
    parser.add_argument(
        "--photographs",
        nargs="+",
        type=int,
        help="dlg, ig: the photo_tiles photographs whose first held-out tile is attacked (default: the first ones)",
    )
    parser.add_argument("--backbone", default="convnet_small", help="dlg, ig: the attacked model (models registry)")
    parser.add_argument("--train-epochs", type=int, default=0, help="dlg, ig: epochs on photo_tiles before the attack")
    parser.add_argument("--local-steps", type=int, default=1, help="dlg, ig: FedAvg SGD steps of one image each")
    parser.add_argument(
        "--local-lr", type=float, default=1e-3, help="dlg, ig: the client SGD step size (breaching: 1e-3)"
    )
    parser.add_argument(
        "--sides",
        nargs="+",
        default=["breaching", "ours matched", "ours default"],
        choices=SIDES,
        help="dlg, ig: the attacks run ('ours config': ig only)",
    )
    parser.add_argument("--device", default="cpu", help="dlg, ig: where both sides run (cuda: wall seconds)")
    parser.add_argument("--success-psnr", type=float, default=20.0, help="stg: PSNR (dB) of a recovered image")
    args = parser.parse_args()
    if "ours config" in args.sides and args.part != "ig":
        parser.error(f"--sides 'ours config' runs {FULL_CONFIG.name}, an Inverting Gradients config: use --part ig.")
    torch.set_num_threads(1)
    logging.disable(logging.INFO)
    PARTS[args.part](args)


PARTS = {
    "labels": labels_part,
    "analytic": analytic_part,
    "stg": stg_part,
    "dlg": gradient_matching_part,
    "ig": gradient_matching_part,
}

if __name__ == "__main__":
    main()
