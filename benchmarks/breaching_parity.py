"""Both sides in one run: this project's label strategies and analytic attack against breaching 0.1.2's.

breaching (Geiping et al.; ``pip install breaching==0.1.2``) is never a dependency: run this script with a Python
that has it, e.g. a venv under /tmp. On the same victims and the same gradients:

- ``labels``: label accuracy (count / set) of breaching's ``_recover_label_information`` strategies (``iDLG``,
  ``analytic``, ``yin``, ``wainakh-simple``, ``wainakh-whitebox``, ``bias-corrected``) and ours, on the untrained
  DLG LeNet of ``benchmarks/label_recovery.py`` (10 victims per cell);
- ``analytic``: breaching's ``AnalyticAttacker`` (config ``attack=analytic``) and our ``AnalyticLinearAttack`` on
  the MLP of ``benchmarks/analytic_attack.py`` without input standardisation (breaching inverts a
  ``torch.nn.Sequential``): share of images copied exactly (PSNR >= 60 dB) and mean PSNR.

Run: ``OMP_NUM_THREADS=1 /tmp/breach/bin/python benchmarks/breaching_parity.py --part labels``.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import breaching
import torch
from analytic_attack import held_out
from label_recovery import pool, victim
from omegaconf import OmegaConf

from lightning_fl.attacks import AnalyticLinearAttack
from lightning_fl.attacks.label_counts import dummy_statistics
from lightning_fl.attacks.labels import infer_labels, last_layer_bias_name, last_layer_weight_name
from lightning_fl.attacks.metrics import label_recovery_accuracy, label_set_accuracy, match_reconstructions, psnr
from lightning_fl.attacks.standalone import client_view
from lightning_fl.models import MLP

THEIRS = ("iDLG", "analytic", "yin", "wainakh-simple", "wainakh-whitebox", "bias-corrected")
OURS = ("idlg", "yin", "llg", "weight_count", "bias_count")


def breaching_attacker(model: torch.nn.Module, *, label_strategy: str, kind: str = "analytic"):
    """breaching's attacker of ``kind`` over ``model`` with its shipped config and ``label_strategy``."""
    config = OmegaConf.load(Path(breaching.__file__).parent / "config" / "attack" / f"{kind}.yaml")
    config.label_strategy = label_strategy
    cls = breaching.attacks.analytic_attack.AnalyticAttacker
    return cls(model, _cross_entropy, config, dict(dtype=torch.float, device=torch.device("cpu")))


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy that accepts the float class indices breaching's ``wainakh-whitebox`` builds (torch 2 rejects
    them in ``torch.nn.CrossEntropyLoss``)."""
    return torch.nn.functional.cross_entropy(logits, targets.long())


def payloads(model: torch.nn.Module, view, size: int) -> tuple[list, list]:
    """breaching's (server_payload, shared_data) for the gradient in ``view``."""
    shape = tuple(view.metadata["input_shape"])
    metadata = OmegaConf.create({"shape": list(shape), "modality": "vision", "mean": [0.0], "std": [1.0]})
    server = [{"parameters": [p.detach() for p in model.parameters()], "buffers": None, "metadata": metadata}]
    names = [n for n, _ in model.named_parameters()]
    shared = {"gradients": [view.tensors[n] for n in names], "buffers": None}
    shared["metadata"] = {"num_data_points": size, "labels": None, "local_hyperparams": None}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["labels", "analytic"], required=True)
    parser.add_argument("--data", nargs="+", default=["digits", "photos"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 8, 32, 64])
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.disable(logging.INFO)
    labels_part(args) if args.part == "labels" else analytic_part(args)


if __name__ == "__main__":
    main()
