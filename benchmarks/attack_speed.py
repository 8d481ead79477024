"""Attack speed: our batched gradient-matching engine vs the loop the papers' code writes, same model and image.

Measures process CPU time (one torch thread; wall time moves with other jobs on a shared machine):

1. time per gradient evaluation (one objective + its gradient w.r.t. the dummy data) for DLG and Inverting
   Gradients: the reference closure (``torch.autograd.grad(create_graph=True)`` over ``net.parameters()`` as in
   DLG's ``main.py`` and ``inversefed``), ours with one restart, ours with R restarts batched (per restart);
2. time to a PSNR target with R restarts: both run the same R starting points (same seeds, images and labels)
   and keep the restart with the smallest gradient loss. The reference runs the restarts one after another
   (``torch.optim.LBFGS`` with DLG's settings; ``inversefed``'s signed Adam with its schedule); ours runs them as
   one vmapped computation. We find the iteration budget k at which our selected restart reaches the target,
   then time both implementations for exactly that budget;
3. our engine's restarts as a Python loop vs batched: ``ours_ms_per_eval_r1`` (one restart per call) against
   ``ours_ms_per_eval_batched_per_restart``.

Run: ``OMP_NUM_THREADS=1 python benchmarks/attack_speed.py`` (about 2-3 minutes on the 2-core dev machine).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from lightning_fl.attacks import DLGAttack, InvertingGradientsAttack
from lightning_fl.attacks.gradient_matching import GradientMatchingAttack, initial_images, total_variation
from lightning_fl.attacks.metrics import psnr
from lightning_fl.attacks.standalone import client_view
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.messages import ServerView
from lightning_fl.models import ImageClassifier


def one_digit(image_size: int = 32) -> tuple[ServerView, torch.Tensor, torch.Tensor]:
    """The attack configs' problem: client 0's first digit behind the untrained LeNet's gradient (seed 0)."""
    dm = FederatedDataModule("digits", num_clients=10, partition="iid", image_size=image_size)
    torch.manual_seed(0)
    model = ImageClassifier("lenet_dlg", **dm.model_options)
    images, labels = dm.sample_batch(0, 1, seed=0)
    return client_view(model, images, labels, num_classes=10), images, labels


MAKERS = {
    "dlg": lambda **kw: DLGAttack(progress_bar=False, **kw),
    "inverting_gradients": lambda **kw: InvertingGradientsAttack(progress_bar=False, **kw),
}
"""Each attack timed, built with the given settings (no progress bar)."""

BUDGETS = {
    "dlg": {"target": 30.0, "max_iterations": 2000},
    "inverting_gradients": {"target": 15.0, "max_iterations": 1000},
}
"""Per attack: the PSNR target its selected restart must reach and the most iterations it may take."""


def _soft_ce(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.mean(torch.sum(-target * F.log_softmax(pred, dim=-1), 1))


class Reference:
    """The attack loops as the original code writes them: one restart at a time, closures over net.parameters()."""

    def __init__(self, view: ServerView, attack: GradientMatchingAttack, labels: torch.Tensor) -> None:
        self.net, self.attack, self.input_shape = view.model, attack, tuple(view.metadata["input_shape"])
        self.target = [view.tensors[n] for n, _ in self.net.named_parameters()]
        self.onehot = F.one_hot(labels, 10).float()

    def _distance(self, dummy: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
        grads = torch.autograd.grad(_soft_ce(self.net(dummy), soft), self.net.parameters(), create_graph=True)
        if self.attack.distance == "euclidean":  # DLG main.py
            return sum(((gx - gy) ** 2).sum() for gx, gy in zip(grads, self.target, strict=True))
        dot = sum((gx * gy).sum() for gx, gy in zip(grads, self.target, strict=True))  # inversefed cost_fn="sim"
        norms = sum(gx.pow(2).sum() for gx in grads).sqrt() * sum(gy.pow(2).sum() for gy in self.target).sqrt()
        return 1 - dot / norms

    def run(self, image: torch.Tensor, logits: torch.Tensor, evaluations: int) -> tuple[torch.Tensor, float]:
        """One restart for ``evaluations`` objective evaluations; returns (image, final gradient loss).

        Adam's step decay follows ``attack.max_iterations`` (as our engine does), whatever ``evaluations`` is.
        """
        dummy = image.clone().requires_grad_()
        if self.attack.optimizer == "lbfgs":  # DLG: LBFGS([dummy_data, dummy_label]), step(closure) in a loop
            label = logits.clone().requires_grad_()
            opt = torch.optim.LBFGS([dummy, label], lr=self.attack.lr)
            count = [0]

            def closure() -> torch.Tensor:
                opt.zero_grad()
                count[0] += 1
                loss = self._distance(dummy, F.softmax(label, dim=-1))
                loss.backward()
                return loss

            while count[0] < evaluations:
                loss = opt.step(closure)
            return dummy.detach(), float(loss.detach())
        opt = torch.optim.Adam([dummy], lr=self.attack.lr)  # inversefed GradientReconstructor._run_trial
        n = self.attack.max_iterations
        schedule = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[n // 2.667, n // 1.6, n // 1.142], gamma=0.1)
        tv = self.attack.batch_settings(len(self.onehot)).tv_weight
        for _ in range(evaluations):

            def closure() -> torch.Tensor:
                opt.zero_grad()
                loss = self._distance(dummy, self.onehot) + tv * total_variation(dummy)
                loss.backward()
                dummy.grad.sign_()
                return loss

            loss = opt.step(closure)
            schedule.step()
            with torch.no_grad():
                dummy.data = torch.clamp(dummy, 0, 1)
        return dummy.detach(), float(loss.detach())

    def eval_time(self, repeats: int) -> float:
        dummy = torch.rand(1, *self.input_shape).requires_grad_()
        soft = self.onehot.clone().requires_grad_()
        start = time.process_time()
        for _ in range(repeats):
            loss = self._distance(dummy, soft)
            loss.backward()
        return (time.process_time() - start) / repeats


def _ours_eval_time(attack: GradientMatchingAttack, view: ServerView, repeats: int) -> float:
    states = attack.iterate(view)
    next(states)  # warm-up iteration
    start = time.process_time()
    for _ in range(repeats):
        next(states)
    return (time.process_time() - start) / repeats


def _iterations_to_target(
    attack: GradientMatchingAttack, view: ServerView, truth: torch.Tensor, target: float, check_every: int
) -> tuple[int | None, float]:
    """Budget k at which the lowest-loss restart first reaches ``target`` dB, and the wall time to get there."""
    start = time.process_time()
    for state in attack.iterate(view):
        if (state.iteration + 1) % check_every == 0:
            best = int(state.losses.nan_to_num(torch.inf).argmin())
            if float(psnr(state.images[best].clamp(0, 1), truth)) >= target:
                return state.iteration + 1, time.process_time() - start
    return None, time.process_time() - start


def _reference_restarts(
    reference: Reference, inits: tuple[torch.Tensor, torch.Tensor], budget: int, truth: torch.Tensor
) -> tuple[float, float]:
    images, logits = inits
    start = time.process_time()
    results = [reference.run(images[r], logits[r], budget) for r in range(len(images))]
    seconds = time.process_time() - start
    best_image, _ = min(results, key=lambda result: result[1])
    return seconds, float(psnr(best_image.clamp(0, 1), truth))


def _inits(attack: GradientMatchingAttack, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(attack.seed)  # the engine's own draw order
    images = initial_images((attack.restarts, 1, *shape), init=attack.init, generator=generator)
    return images, torch.randn(attack.restarts, 1, 10, generator=generator)


def bench(
    name: str,
    make: Callable[..., GradientMatchingAttack],
    *,
    image_size: int,
    restarts: int,
    target: float,
    max_iterations: int,
    check_every: int,
) -> dict[str, float | int | None]:
    view, images, labels = one_digit(image_size)
    shape = tuple(images.shape[1:])
    reference = Reference(view, make(restarts=1, max_iterations=max_iterations), labels)
    row: dict[str, float | int | None] = {"attack": name, "image_size": image_size, "restarts": restarts}
    row["ref_ms_per_eval"] = 1e3 * reference.eval_time(30)
    row["ours_ms_per_eval_r1"] = 1e3 * _ours_eval_time(make(restarts=1, max_iterations=10**6), view, 30)
    batched_ms = 1e3 * _ours_eval_time(make(restarts=restarts, max_iterations=10**6), view, 30)
    row["ours_ms_per_eval_batched_per_restart"] = batched_ms / restarts
    attack = make(restarts=restarts, max_iterations=max_iterations)
    budget, ours_seconds = _iterations_to_target(attack, view, images, target, check_every)
    row["target_psnr"], row["iterations_to_target"], row["ours_seconds_to_target"] = target, budget, ours_seconds
    if budget is None:
        return row
    ref_seconds, ref_psnr = _reference_restarts(reference, _inits(attack, shape), budget, images)
    row["ref_seconds_to_target"], row["ref_psnr_at_budget"] = ref_seconds, ref_psnr
    row["ratio_ours_over_ref"] = ours_seconds / ref_seconds
    return row


def restart_sweep(image_size: int, counts: list[int]) -> None:
    """Print our per-restart iteration time relative to the reference's evaluation, for several restart counts."""
    view, _, labels = one_digit(image_size)
    for name, make in MAKERS.items():
        ref = Reference(view, make(restarts=1, max_iterations=10), labels).eval_time(40)
        ratios = {
            r: round(_ours_eval_time(make(restarts=r, max_iterations=10**6), view, 40) / r / ref, 2) for r in counts
        }
        print(json.dumps({"attack": name, "ref_ms_per_eval": round(1e3 * ref, 3), "ratio_per_restart": ratios}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--restarts", type=int, default=4)
    parser.add_argument("--output", type=str, default=None, help="also write the rows as JSON here")
    parser.add_argument("--sweep", type=int, nargs="*", default=None, help="only time these restart counts")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.sweep:
        restart_sweep(args.image_size, args.sweep)
        return
    rows = [
        bench(name, MAKERS[name], image_size=args.image_size, restarts=args.restarts, check_every=50, **budget)
        for name, budget in BUDGETS.items()
    ]
    for row in rows:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}))
    if args.output:
        with open(args.output, "w") as handle:
            json.dump(rows, handle, indent=2)


if __name__ == "__main__":
    main()
