"""Label accuracy of the label strategies on one gradient of a random batch (labels repeat), B = 1 to 64.

Victim: the sigmoid DLG LeNet (U(-0.5, 0.5) weights, [0, 1] pixels in), untrained and after ``train_epochs``
epochs of Adam on the training split; one gradient of B images drawn at random without replacement (digits: the
test split; photos: all 81 crops, 9 classes), or with ``--local-steps T`` the update of T SGD steps (lr 0.1) of B
images each, attacked as its pseudo-gradient averaged over the steps. For each strategy of
:func:`~lightning_fl.attacks.labels.infer_labels`, the count accuracy (label multisets,
:func:`~lightning_fl.attacks.metrics.label_recovery_accuracy`) and the set accuracy (Jaccard index of the class
sets, :func:`~lightning_fl.attacks.metrics.label_set_accuracy`), averaged over ``seeds`` victims; the rules that
assume distinct labels are skipped where B exceeds the classes. ``llg_plus`` measures LLG+'s impact and offset
(:func:`~lightning_fl.attacks.label_impact.label_impact`) on dummy inputs, as the attacks do; ``llg_plus_aux`` on
the training split (digits: disjoint from the victims; photos: the victims' pool holds it), the auxiliary data of
Wainakh et al. (2022). Prints one JSON line per cell.

Settings: ``configs/label_recovery.yaml`` (``--config``); flags override them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import lightning as L
import torch
from _config import parse_args
from torch.utils.data import DataLoader, TensorDataset

from lightning_fl.attacks.label_counts import dummy_inputs, dummy_statistics
from lightning_fl.attacks.label_impact import LabelImpact, label_impact
from lightning_fl.attacks.labels import infer_labels, last_layer_bias_name, last_layer_weight_name
from lightning_fl.attacks.metrics import label_recovery_accuracy, label_set_accuracy
from lightning_fl.attacks.standalone import client_view
from lightning_fl.attacks.targets import matching_target
from lightning_fl.datamodules.datasets import load_dataset
from lightning_fl.models import ImageClassifier


def victim(data: str, *, seed: int, train_epochs: int) -> ImageClassifier:
    """The DLG LeNet for ``data``, untrained (``train_epochs=0``) or trained on its training split."""
    train = load_dataset(data, train=True, image_size=32)
    torch.manual_seed(seed)
    channels = train.images.shape[1]
    model = ImageClassifier("lenet_dlg", num_classes=train.num_classes, in_channels=channels, standardize=False)
    if train_epochs:
        loader = DataLoader(TensorDataset(train.images, train.labels), batch_size=32, shuffle=True)
        options = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
        L.Trainer(max_epochs=train_epochs, accelerator="cpu", enable_model_summary=False, **options).fit(model, loader)
    return model.eval()


def pool(data: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The images batches are drawn from."""
    if data == "digits":
        test = load_dataset(data, train=False, image_size=32)
        return test.images, test.labels
    splits = [load_dataset(data, train=train, image_size=32) for train in (True, False)]
    return torch.cat([s.images for s in splits]), torch.cat([s.labels for s in splits])


def impacts(model: ImageClassifier, data: str, *, classifier_weight: str, seed: int) -> dict[str, LabelImpact]:
    """LLG+'s measurements of ``model`` by the source of its labelled batches: dummies, or the training split."""
    train = load_dataset(data, train=True, image_size=32)
    dummies = dummy_inputs(64, input_shape=train.images.shape[1:], seed=seed)
    by_class = [train.images[train.labels == c] for c in range(model.num_classes)]
    sources = {"llg_plus": [dummies] * len(by_class), "llg_plus_aux": by_class}
    return {k: label_impact(model, classifier_weight=classifier_weight, inputs_per_class=v) for k, v in sources.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+")
    parser.add_argument("--batch-sizes", nargs="+", type=int)
    parser.add_argument("--strategies", nargs="+")
    parser.add_argument("--seeds", type=int)
    parser.add_argument("--train-epochs", type=int)
    parser.add_argument("--local-steps", type=int, help="T > 1: attack the update of T SGD steps of B images each.")
    parser.add_argument("--config", type=Path, default=Path("configs/label_recovery.yaml"))
    args = parse_args(parser)
    torch.set_num_threads(1)
    for data in args.data:
        images, labels = pool(data)
        for trained in (False, True):
            scores: dict[tuple[int, str], list[tuple[float, float]]] = {}
            for seed in range(args.seeds):
                model = victim(data, seed=seed, train_epochs=args.train_epochs if trained else 0)
                num_classes = model.num_classes
                weight = last_layer_weight_name(model, num_classes=num_classes)
                bias = last_layer_bias_name(model, weight_name=weight)
                dummy = dummy_statistics(model, classifier_weight=weight, input_shape=images.shape[1:], seed=seed)
                measured = impacts(model, data, classifier_weight=weight, seed=seed)
                with torch.no_grad():
                    accuracy = (model(images).argmax(1) == labels).double().mean().item()
                scores.setdefault((0, "victim accuracy"), []).append((accuracy, accuracy))
                for size in args.batch_sizes:
                    count = size * args.local_steps
                    index = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))[:count]
                    view = client_view(
                        model,
                        images[index],
                        labels[index],
                        num_classes=num_classes,
                        local_steps=args.local_steps,
                        lr=0.1,
                    )
                    target = matching_target(view)
                    gradients = {n: t / args.local_steps for n, t in zip(target.names, target.tensors, strict=True)}
                    for strategy in args.strategies:
                        if strategy in ("idlg", "yin") and count > num_classes:
                            continue
                        found = infer_labels(
                            gradients[weight],
                            num_images=count,
                            strategy="llg_plus" if strategy in measured else strategy,
                            bias_gradient=gradients[bias],
                            dummy=dummy,
                            impact=measured.get(strategy),
                        )
                        truth = labels[index]
                        multiset = float(label_recovery_accuracy(found, truth, num_classes=num_classes))
                        scores.setdefault((size, strategy), []).append((multiset, label_set_accuracy(found, truth)))
            for (size, strategy), values in scores.items():
                count, sets = (sum(v) / len(v) for v in zip(*values, strict=True))
                row = {"data": data, "trained": trained, "batch_size": size, "local_steps": args.local_steps}
                row |= {"strategy": strategy}
                print(json.dumps(row | {"count_accuracy": round(count, 3), "set_accuracy": round(sets, 3)}), flush=True)


if __name__ == "__main__":
    main()
