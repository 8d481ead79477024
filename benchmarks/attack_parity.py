"""Parity of our DLG, iDLG and Inverting Gradients with the papers' own loops, on natural photos held out of tuning.

For every case (victim x image x seed) both sides attack the *same* intercepted gradient of the *same* victim:

* ``reference``: a faithful re-implementation of the authors' loop. DLG (``mit-han-lab/dlg`` ``main.py``): dummy
  image and label logits from ``torch.randn``, ``torch.optim.LBFGS(lr=1)`` (torch defaults: 20 iterations a step,
  ``tolerance_grad=1e-7``, ``tolerance_change=1e-9``, history 100, no line search), soft-label cross-entropy, squared
  gradient differences summed over layers, 300 ``step()`` calls. iDLG (``PatrickZH/Improved-Deep-Leakage-from-
  Gradients``): the label is ``argmin`` of the row sums of the last layer's weight gradient, then the same loop on
  the image only, stopping when the loss falls below 1e-6. Inverting Gradients (``inversefed``): signed Adam 0.1,
  box in normalised space, cosine distance + TV, step decay x0.1 at 3/8, 5/8, 7/8, one restart.
* ``ours``: the shipped attack with its defaults (``DLGAttack()``, ``IDLGAttack()``) through
  :func:`~lightning_fl.attacks.standalone.client_view`, or ``InvertingGradientsAttack`` with the same budget.

Victims: the sigmoid DLG LeNet (U(-0.5, 0.5) weights, [0, 1] pixels in) at 32x32 with 10 and 100 classes; for IG
torchvision's ResNet-18 (CIFAR stem) at 32x32, untrained and trained a few epochs on the photo crops.
Images: centre crops of the ``photos`` data set's scikit-image photographs, which were never used for tuning
(``--images tuning`` uses the two scikit-learn photos instead). Success: PSNR >= 30 dB (DLG, iDLG); SSIM >= 0.6
(IG). Time: process CPU seconds with one torch thread: ``cpu_s`` for the whole run as its code runs it,
``cpu_to_success_s`` until PSNR first reached 30 dB (reference: checked after every ``step()``, checks not timed).

Each side of each case is one job. ``--workers N`` runs N jobs at once, each in its own spawned process: on a GPU,
where one small victim leaves the device idle between kernel launches, 16 jobs ran about as fast each as one alone
(with CUDA MPS; ``benchmarks/gpu_attacks.sh``). Victims are built once by this process and loaded by both sides of a
case (a network trained on a GPU is not bit-reproducible). ``--deadline-s`` stops the run and keeps what finished.

Settings: ``configs/attack_parity.yaml`` (``--config``); flags override them, e.g.
``OMP_NUM_THREADS=1 python benchmarks/attack_parity.py --attacks dlg --classes 10 --seeds 0``.
"""

from __future__ import annotations

import argparse
import copy
import json
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from _config import parse_args
from _timing import clock
from torch import Tensor, nn

from lightning_fl.attacks import DLGAttack, IDLGAttack, InvertingGradientsAttack
from lightning_fl.attacks.gradient_matching import total_variation
from lightning_fl.attacks.metrics import psnr, ssim
from lightning_fl.attacks.standalone import client_view, view_on
from lightning_fl.datamodules.datasets import load_dataset
from lightning_fl.messages import ServerView
from lightning_fl.models import LeNetDLG

SUCCESS_PSNR, SUCCESS_SSIM = 30.0, 0.6
DEVICE = torch.device("cpu")


@dataclass
class Result:
    """One attack on one case."""

    attack: str
    side: str
    victim: str
    image: str
    seed: int
    psnr: float
    ssim: float
    label_correct: bool
    success: bool
    cpu_s: float
    cpu_to_success_s: float | None
    evaluations: int


def photo_crops(which: str) -> list[tuple[str, Tensor, int]]:
    """``(source, image (1, 3, 32, 32), label)`` of the centre crop of each photo: ``held_out`` (scikit-image) or
    ``tuning`` (scikit-learn)."""
    crops = []
    for train in (True, False):
        data = load_dataset("photos", train=train, image_size=32)
        for image, label, source in zip(data.images, data.labels, data.sources, strict=True):
            if source.endswith("[1,1]") and source.startswith("sklearn:" if which == "tuning" else "skimage:"):
                crops.append((source, image[None], int(label)))
    return sorted(crops)


def _soft_ce(logits: Tensor, probabilities: Tensor) -> Tensor:
    return torch.mean(torch.sum(-probabilities * F.log_softmax(logits, dim=-1), dim=-1))


class _Clock:
    """Process CPU time with pauses for the (untimed) success checks."""

    def __init__(self) -> None:
        self.spent, self.started = 0.0, clock(DEVICE)

    def pause(self) -> float:
        self.spent += clock(DEVICE) - self.started
        return self.spent

    def resume(self) -> None:
        self.started = clock(DEVICE)


def reference_dlg(view: ServerView, truth: Tensor, *, seed: int, infer_label: bool) -> tuple[Tensor, int, dict]:
    """DLG's ``main.py`` loop (``infer_label=False``) or iDLG's (``True``) on ``view``'s gradient."""
    net = view.model
    params = list(net.parameters())
    target = [view.tensors[n] for n, _ in net.named_parameters()]
    num_classes = int(view.metadata["num_classes"])
    generator = torch.Generator().manual_seed(seed)
    clock = _Clock()
    dummy = torch.randn(truth.shape, generator=generator).to(DEVICE).requires_grad_()
    if infer_label:
        label = torch.argmin(torch.sum(target[-2], dim=-1), dim=-1).view(1)
        soft, variables = F.one_hot(label, num_classes).float(), [dummy]
    else:
        logits = torch.randn(1, num_classes, generator=generator).to(DEVICE).requires_grad_()
        variables = [dummy, logits]
    optimizer = torch.optim.LBFGS(variables, lr=1)
    evaluations, to_success = 0, None

    def closure() -> Tensor:
        nonlocal evaluations
        evaluations += 1
        optimizer.zero_grad()
        probabilities = soft if infer_label else F.softmax(logits, dim=-1)
        grads = torch.autograd.grad(_soft_ce(net(dummy), probabilities), params, create_graph=True)
        distance = sum(((g - t) ** 2).sum() for g, t in zip(grads, target, strict=True))
        distance.backward()
        return distance

    for _ in range(300):
        loss = optimizer.step(closure)
        spent = clock.pause()
        if to_success is None and float(psnr(dummy.detach().cpu().clamp(0, 1), truth)) >= SUCCESS_PSNR:
            to_success = spent
        if infer_label and float(loss) < 1e-6:  # iDLG's convergence break
            break
        clock.resume()
    clock.pause()
    recovered = int(label) if infer_label else int(logits.argmax())
    return dummy.detach().cpu().clamp(0, 1), recovered, {"cpu_s": clock.spent, "to": to_success, "evals": evaluations}


def reference_ig(view: ServerView, truth: Tensor, *, seed: int, iterations: int, tv: float) -> tuple[Tensor, dict]:
    """``inversefed``'s ``GradientReconstructor`` loop (one restart, known label as its ``reconstruct(labels=...)``)."""
    net = view.model
    params = list(net.parameters())
    target = [view.tensors[n] for n, _ in net.named_parameters()]
    label = torch.argmin(torch.sum(target[-2], dim=-1), dim=-1).view(1)
    generator = torch.Generator().manual_seed(seed)
    clock = _Clock()
    x = torch.randn(truth.shape, generator=generator).to(DEVICE).requires_grad_()
    optimizer = torch.optim.Adam([x], lr=0.1)
    milestones = [int(iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=0.1)
    for _ in range(iterations):
        optimizer.zero_grad()
        grads = torch.autograd.grad(F.cross_entropy(net(x), label), params, create_graph=True)
        dot = sum((g * t).sum() for g, t in zip(grads, target, strict=True))
        norm = sum(g.pow(2).sum() for g in grads).sqrt() * sum(t.pow(2).sum() for t in target).sqrt()
        loss = 1 - dot / norm + tv * total_variation(x)
        (x.grad,) = torch.autograd.grad(loss, x)
        x.grad.sign_()
        optimizer.step()
        scheduler.step()
        with torch.no_grad():
            x.clamp_(0, 1)
    return x.detach().cpu(), {"cpu_s": clock.pause(), "to": None, "evals": iterations}


def lenet_victim(num_classes: int, seed: int) -> nn.Module:
    """The DLG LeNet: U(-0.5, 0.5) weights (the authors' ``weights_init``), [0, 1] pixels in."""
    torch.manual_seed(seed)
    return LeNetDLG(in_channels=3, num_classes=num_classes, image_size=32)


def resnet_victim(num_classes: int, seed: int, epochs: int) -> nn.Module:
    """ResNet-18 (torchvision's ImageNet stem, as measured in docs/attacks.md), untrained or trained ``epochs``
    epochs of Adam on the photo crops' training split."""
    from lightning_fl.models.cifar import resnet18

    torch.manual_seed(seed)
    net = resnet18(in_channels=3, num_classes=num_classes).to(DEVICE)
    if epochs:
        data = load_dataset("photos", train=True, image_size=32)
        images, labels = data.images.to(DEVICE), data.labels.to(DEVICE)
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
        for _ in range(epochs):
            for batch in torch.randperm(len(images)).split(16):
                optimizer.zero_grad()
                F.cross_entropy(net(images[batch]), labels[batch] % num_classes).backward()
                optimizer.step()
    return net.cpu().eval()


@dataclass(frozen=True)
class Victim:
    """A victim network: the LeNet (``epochs`` None) or a ResNet-18 trained ``epochs`` epochs."""

    name: str
    classes: int
    epochs: int | None
    seed: int

    def build(self) -> nn.Module:
        if self.epochs is None:
            return lenet_victim(self.classes, self.seed)
        return resnet_victim(self.classes, self.seed, self.epochs)


@dataclass(frozen=True)
class Job:
    """One side of one case. Both sides of a case load the same victim weights from ``victim_file``: a ResNet
    trained on a GPU is not bit-reproducible, so it is trained once, by the parent process."""

    attack: str
    side: str
    victim: Victim
    victim_file: str
    source: str
    image: Tensor
    label: int
    ig_iterations: int
    ig_restarts: int
    ig_tv: float
    device: str


def _score(
    attack: str, side: str, victim: str, image: str, seed: int, rec: Tensor, truth: Tensor, label_ok: bool, info: dict
) -> Result:
    p, s = float(psnr(rec, truth)), float(ssim(rec, truth))
    success = s >= SUCCESS_SSIM if attack == "ig" else p >= SUCCESS_PSNR
    to = info["to"] if info["to"] is not None else (info["cpu_s"] if success else None)
    return Result(attack, side, victim, image, seed, p, s, label_ok, success, info["cpu_s"], to, info["evals"])


def eval_view(net: nn.Module, image: Tensor, label: int, num_classes: int) -> ServerView:
    """The gradient of ``net`` in eval mode (batch norm on running statistics), as ``inversefed``'s experiments
    compute it (``model.eval()``)."""
    net = copy.deepcopy(net).eval()
    grads = torch.autograd.grad(F.cross_entropy(net(image), torch.tensor([label])), list(net.parameters()))
    tensors = {n: g.detach() for (n, _), g in zip(net.named_parameters(), grads, strict=True)}
    metadata = {"num_classes": num_classes, "input_shape": tuple(image.shape[1:]), "batch_size": 1}
    return ServerView("local_gradient", net, tensors, "gradient", metadata)


def run_job(job: Job) -> Result:
    """The reference loop or our attack on one case (``job.side``), in this process or a pool worker."""
    global DEVICE
    DEVICE = torch.device(job.device)
    torch.set_num_threads(1)
    net = replace(job.victim, epochs=job.victim.epochs and 0).build()  # the architecture; weights from the file
    net.load_state_dict(torch.load(job.victim_file, weights_only=True))
    label = job.label % job.victim.classes
    image, seed = job.image, job.victim.seed
    view = (
        client_view(net, image, torch.tensor([label]), num_classes=job.victim.classes)
        if job.attack != "ig"
        else eval_view(net, image, label, job.victim.classes)
    )
    view = view_on(view, DEVICE)
    if job.side == "reference":
        if job.attack == "ig":
            rec, info = reference_ig(view, image, seed=seed, iterations=job.ig_iterations, tv=job.ig_tv)
            recovered = label
        else:
            rec, recovered, info = reference_dlg(view, image, seed=seed, infer_label=job.attack == "idlg")
        return _score(job.attack, job.side, job.victim.name, job.source, seed, rec, image, recovered == label, info)
    if job.attack == "ig":
        engine = InvertingGradientsAttack(
            max_iterations=job.ig_iterations,
            restarts=job.ig_restarts,
            tv_weight=job.ig_tv,
            progress_bar=False,
            seed=seed,
        )
    else:
        engine = (DLGAttack if job.attack == "dlg" else IDLGAttack)(progress_bar=False, seed=seed)
    start = clock(DEVICE)
    reconstruction = engine.reconstruct(view)
    info = {"cpu_s": clock(DEVICE) - start, "to": None, "evals": reconstruction.info["iterations"]}
    label_ok = reconstruction.labels is not None and int(reconstruction.labels[0]) == label
    return _score(job.attack, job.side, job.victim.name, job.source, seed, reconstruction.images, image, label_ok, info)


def run_jobs(jobs: list[Job], workers: int, deadline_s: float | None, report: Callable[[Result], None]) -> list[Job]:
    """Run ``jobs`` (in order, ``workers`` at a time in spawned processes when ``workers > 1``), calling ``report``
    with each result as it arrives; at ``deadline_s`` seconds, or on Ctrl+C or SIGTERM, the workers are killed.
    Returns the unfinished jobs."""
    started = time.perf_counter()
    if workers <= 1:
        for k, job in enumerate(jobs):
            if deadline_s is not None and time.perf_counter() - started > deadline_s:
                return jobs[k:]
            report(run_job(job))
        return []
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from multiprocessing import get_context

    # SIGTERM raises like Ctrl+C, so that the finally below also stops the workers (else they run on, orphaned)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"))
    pending = {pool.submit(run_job, job): job for job in jobs}
    try:
        while pending:
            timeout = None if deadline_s is None else max(0.0, deadline_s - (time.perf_counter() - started))
            done, _ = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
            if not done:
                break
            for future in done:
                pending.pop(future)
                report(future.result())
    finally:
        for process in list(pool._processes.values()):  # a deadline must not wait for running jobs
            process.kill()
        pool.shutdown(wait=False, cancel_futures=True)
    return list(pending.values())


def summarise(results: list[Result]) -> list[dict]:
    """Per attack, victim and side: success rate, median PSNR/SSIM, label accuracy, median CPU seconds."""
    rows = []
    keys = sorted({(r.attack, r.victim, r.side) for r in results})
    for attack, victim, side in keys:
        group = [r for r in results if (r.attack, r.victim, r.side) == (attack, victim, side)]
        reached = [r.cpu_to_success_s for r in group if r.cpu_to_success_s is not None]
        rows.append(
            {
                "attack": attack,
                "victim": victim,
                "side": side,
                "cases": len(group),
                "success": f"{sum(r.success for r in group)}/{len(group)}",
                "median_psnr": round(statistics.median(r.psnr for r in group), 1),
                "median_ssim": round(statistics.median(r.ssim for r in group), 3),
                "label_accuracy": round(sum(r.label_correct for r in group) / len(group), 2),
                "median_cpu_s": round(statistics.median(r.cpu_s for r in group), 1),
                "total_cpu_s": round(sum(r.cpu_s for r in group), 1),
                "median_cpu_to_success_s": round(statistics.median(reached), 1) if reached else None,
            }
        )
    return rows


def _jobs(args: argparse.Namespace, folder: Path) -> list[Job]:
    """Every (attack, victim, photo, seed, side) of the run, the two sides of a case next to each other; each
    victim is built once and saved in ``folder``."""
    crops = photo_crops(args.which)[: args.images]
    jobs = []
    sides = ["ours"] if args.no_reference else ["reference", "ours"]
    for attack in args.attacks:
        victims = (
            [(f"lenet{k}", k, None) for k in args.classes]
            if attack != "ig"
            else [(f"resnet18_e{e}", 10, e) for e in args.ig_epochs]
        )
        for name, classes, epochs in victims:
            for seed in args.seeds:
                victim = Victim(name, classes, epochs, seed)
                file = folder / f"{name}_seed{seed}.pt"
                if not file.exists():
                    torch.save(victim.build().state_dict(), file)
                for source, image, label in crops:
                    for side in sides:
                        jobs.append(
                            Job(
                                attack,
                                side,
                                victim,
                                str(file),
                                source,
                                image,
                                label,
                                args.ig_iterations,
                                args.ig_restarts,
                                args.ig_tv,
                                args.device,
                            )
                        )
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attacks", nargs="+", choices=["dlg", "idlg", "ig"])
    parser.add_argument("--classes", nargs="+", type=int, help="LeNet victims' class counts.")
    parser.add_argument("--images", type=int, help="photos per victim (centre crops, in source order).")
    parser.add_argument("--which", choices=["held_out", "tuning"])
    parser.add_argument("--seeds", nargs="+", type=int)
    parser.add_argument("--ig-iterations", type=int)
    parser.add_argument("--ig-epochs", nargs="+", type=int, help="ResNet-18 training epochs.")
    parser.add_argument("--ig-restarts", type=int, help="restarts of our Inverting Gradients (the reference: 1).")
    parser.add_argument("--ig-tv", type=float, help="total-variation weight of both Inverting Gradients sides.")
    parser.add_argument("--workers", type=int, help="jobs at once, each in its own process (1: in this process).")
    parser.add_argument("--deadline-s", type=float, default=None, help="stop after this many seconds, keep results.")
    parser.add_argument("--output", default=None, help="write all results as JSON here (after every job).")
    parser.add_argument("--reuse", nargs="*", default=[], help="JSON outputs whose reference results to reuse.")
    parser.add_argument("--no-reference", action="store_true", help="run ours only (compare with a saved run).")
    parser.add_argument("--device", default="cpu", help="cuda: times are wall seconds after synchronising.")
    parser.add_argument(
        "--config", type=Path, default=Path("configs/attack_parity.yaml"), help="settings file; flags override it"
    )
    args = parse_args(parser)
    global DEVICE
    DEVICE = torch.device(args.device)
    torch.set_num_threads(1)
    results: list[Result] = []
    for path in args.reuse:
        with open(path) as f:
            results += [Result(**r) for r in json.load(f)["results"] if r["side"] == "reference"]
    known = {(r.attack, r.victim, r.image, r.seed) for r in results}

    def report(result: Result) -> None:
        results.append(result)
        print(json.dumps(asdict(result)), flush=True)
        if args.output:
            with open(args.output, "w") as f:
                json.dump({"results": [asdict(r) for r in results], "summary": summarise(results)}, f, indent=1)

    with tempfile.TemporaryDirectory() as folder:
        jobs = [
            job
            for job in _jobs(args, Path(folder))
            if job.side == "ours" or (job.attack, job.victim.name, job.source, job.victim.seed) not in known
        ]
        unfinished = run_jobs(jobs, args.workers, args.deadline_s, report)
    print("SUMMARY")
    for row in summarise(results):
        print(json.dumps(row))
    for job in unfinished:
        print(
            f"unfinished at the deadline: {job.attack} {job.side} {job.victim.name} {job.source} seed {job.victim.seed}"
        )


if __name__ == "__main__":
    main()
