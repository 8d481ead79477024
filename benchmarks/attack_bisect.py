"""Why DLG recovered nothing on natural photos through ``lightning-fl attack``: the victim, then the start.

One 32x32 crop of a natural photo (``photos``, scikit-learn's china, a tuning image), the 3-class sigmoid DLG
LeNet at the same U(-0.5, 0.5) init, one gradient. Each row changes one thing between the DLG authors' loop
(``attack_parity.reference_dlg``) and our engine:

1. victim: the LeNet fed [0, 1] pixels (the DLG code's victim) or the CLI's former victim, ``ImageClassifier``
   standardising its input with the data's mean and std inside ``forward``;
2. attack: the reference loop, our engine with the former defaults (N(0, 1) start, one restart, no early stop),
   our engine with the shipped defaults (U(0, 1) start, 4 restarts kept to the best after 100, early stop).

Run: ``OMP_NUM_THREADS=1 python benchmarks/attack_bisect.py`` (about 2 CPU minutes).
"""

from __future__ import annotations

import json
import time

import torch
from attack_parity import reference_dlg  # this script's folder is on sys.path

from lightning_fl.attacks import DLGAttack
from lightning_fl.attacks.metrics import psnr
from lightning_fl.attacks.standalone import client_view
from lightning_fl.datamodules.datasets import load_dataset
from lightning_fl.models import ImageClassifier


def main() -> None:
    torch.set_num_threads(1)
    data = load_dataset("photos", train=True, image_size=32)
    index = data.sources.index("sklearn:china[0,1]")
    image, label = data.images[index : index + 1], torch.tensor([0])
    mean, std = data.images.mean((0, 2, 3)).tolist(), data.images.std((0, 2, 3)).tolist()
    for victim in ("pixels", "standardised"):
        torch.manual_seed(1234)
        stats = {"input_mean": mean, "input_std": std} if victim == "standardised" else {}
        model = ImageClassifier("lenet_dlg", num_classes=3, in_channels=3, **stats)
        view = client_view(model, image, label, num_classes=3)
        rec, _, info = reference_dlg(view, image, seed=0, infer_label=False)
        rows = [("reference loop", float(psnr(rec, image)), info["evals"], info["cpu_s"])]
        former = DLGAttack(max_iterations=3000, restarts=1, init="randn", stop_below=None, keep_best_after=None)
        for name, attack in (("ours, former defaults", former), ("ours, shipped defaults", DLGAttack())):
            attack.progress_bar = False
            start = time.process_time()
            reconstruction = attack.reconstruct(view)
            rows.append(
                (
                    name,
                    float(psnr(reconstruction.images, image)),
                    reconstruction.info["iterations"],
                    time.process_time() - start,
                )
            )
        for name, value, evaluations, seconds in rows:
            record = {"victim": victim, "attack": name, "psnr": round(value, 1), "evaluations": evaluations}
            print(json.dumps(record | {"cpu_s": round(seconds, 1)}), flush=True)


if __name__ == "__main__":
    main()
