"""GPU check: the quickstart FedAvg run and the DLG / Inverting Gradients attacks on one device, in one go.

Measures, on ``--device`` (``cuda`` by default, or ``cpu``):

a) the quickstart (``configs/quickstart.yaml``): FedAvg, digits 32x32, 10 clients, Dirichlet(0.5), 5 clients per
   round, 3 local epochs, sigmoid LeNet standardised on the data, Adam lr 2e-3, 25 rounds: wall time and final
   test accuracy;
b) DLG (``configs/dlg_lenet_digits.yaml``: one 32x32 digit, the untrained sigmoid LeNet, L-BFGS, 4 restarts) and
   Inverting Gradients (``configs/ig_lenet_digits.yaml``, with 4 and 16 restarts): milliseconds per gradient
   evaluation (the batched objective of all restarts plus its backward pass, without the optimiser step), and
   the wall time of the whole attack with the PSNR it reaches (plus the time until it first reaches a target);
c) the torch version and the device name; everything goes to ``OUT/results.json`` and ``OUT/results.md`` (a table
   for the "## GPU" section of docs/performance.md).

Timings on CUDA are bracketed by ``torch.cuda.synchronize()``. The attacks run before FedAvg, so that nothing
Lightning's per-client trainers leave behind can disturb their timings. A section that fails records its
traceback in the results, the other still runs, and the exit status is 1. ``--quick`` shortens every run (for a
CPU smoke test); the full run is expected to take 1-3 minutes on one H100 (estimate). Needs only torch,
lightning, torchmetrics, torchvision, scikit-learn, scikit-image, rich and what ``import lightning_fl`` loads
(which includes opacus and phe).

Run: ``python benchmarks/gpu_check.py --device cuda --out runs/gpu_check``
CPU smoke test: ``OMP_NUM_THREADS=2 python benchmarks/gpu_check.py --device cpu --quick --out /tmp/gpucheck``
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from attack_speed import one_digit

from lightning_fl.attacks import DLGAttack, InvertingGradientsAttack
from lightning_fl.attacks.gradient_matching import GradientMatchingAttack
from lightning_fl.attacks.metrics import psnr
from lightning_fl.attacks.standalone import client_view, view_on
from lightning_fl.bench import build_loop, fit_config_spec
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.messages import ServerView
from lightning_fl.models import ImageClassifier

PSNR_TARGETS = {"dlg": 30.0, "inverting_gradients": 15.0}  # the targets of benchmarks/attack_speed.py


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fedavg(device: torch.device, *, num_rounds: int) -> dict[str, object]:
    """The quickstart FedAvg run on ``device``: wall time and final test accuracy."""
    spec = fit_config_spec("configs/quickstart.yaml")
    accelerator = "gpu" if device.type == "cuda" else "cpu"
    spec["loop"] = {**spec["loop"], "num_rounds": num_rounds, "trainer": {"accelerator": accelerator, "devices": 1}}
    with tempfile.TemporaryDirectory() as output_dir:
        loop = build_loop(spec, output_dir)
        _sync(device)
        start = time.perf_counter()
        summary = loop.fit()
        _sync(device)
        seconds = time.perf_counter() - start
    return {"rounds": num_rounds, "seconds": seconds, "test_accuracy": summary["test_accuracy"]}


def evaluation_ms(attack: GradientMatchingAttack, view: ServerView, *, repeats: int) -> float:
    """Milliseconds per batched objective evaluation plus backward (all restarts), after warm-up."""
    problem = attack.problem(view)

    def evaluate() -> None:
        losses, _ = problem.objective(problem.images, problem.label_input)
        torch.autograd.grad(losses.sum(), problem.variables)

    for _ in range(3):
        evaluate()
    _sync(problem.images.device)
    start = time.perf_counter()
    for _ in range(repeats):
        evaluate()
    _sync(problem.images.device)
    return 1e3 * (time.perf_counter() - start) / repeats


def attack_run(
    attack: GradientMatchingAttack, view: ServerView, truth: torch.Tensor, *, check_every: int = 50
) -> dict[str, object]:
    """Run ``attack`` to the end; PSNR of the lowest-loss restart every ``check_every`` iterations and at the end."""
    target = PSNR_TARGETS[attack.name]
    truth = truth.to(view.tensors[next(iter(view.tensors))].device)
    seconds_to_target = iterations_to_target = None
    _sync(truth.device)
    start = time.perf_counter()
    for state in attack.iterate(view):
        last = state.iteration + 1 == attack.max_iterations
        if iterations_to_target is None and ((state.iteration + 1) % check_every == 0 or last):
            best = int(state.losses.nan_to_num(torch.inf).argmin())
            if float(psnr(state.images[best].nan_to_num(0.5).clamp(0, 1), truth)) >= target:
                iterations_to_target, seconds_to_target = state.iteration + 1, time.perf_counter() - start
    best = int(state.losses.nan_to_num(torch.inf).argmin())
    final_psnr = float(psnr(state.images[best].nan_to_num(0.5).clamp(0, 1), truth))
    _sync(truth.device)
    seconds = time.perf_counter() - start
    return {
        "iterations": attack.max_iterations,
        "seconds": seconds,
        "ms_per_iteration": 1e3 * seconds / attack.max_iterations,
        "final_psnr": final_psnr,
        "psnr_target": target,
        "iterations_to_target": iterations_to_target,
        "seconds_to_target": seconds_to_target,
    }


def attacks(device: torch.device, *, quick: bool) -> list[dict[str, object]]:
    """DLG with 4 restarts and Inverting Gradients with 4 and 16 restarts, as the configs run them."""
    dlg_iterations, ig_iterations = (300, 300) if quick else (1500, 2400)
    makers: list[tuple[str, int, Callable[..., GradientMatchingAttack]]] = [
        ("dlg", 4, lambda **kw: DLGAttack(max_iterations=dlg_iterations, **kw)),
        ("inverting_gradients", 4, lambda **kw: InvertingGradientsAttack(max_iterations=ig_iterations, **kw)),
        ("inverting_gradients", 16, lambda **kw: InvertingGradientsAttack(max_iterations=ig_iterations, **kw)),
    ]
    rows = []
    for name, restarts, make in makers:
        view, truth, _ = one_digit()
        view = view_on(view, device)
        row: dict[str, object] = {"attack": name, "restarts": restarts}
        row["ms_per_evaluation"] = evaluation_ms(make(restarts=restarts, progress_bar=False), view, repeats=20)
        row |= attack_run(make(restarts=restarts, progress_bar=False, seed=0), view, truth)
        print(json.dumps(row))
        rows.append(row)
    return rows


def scaling(device: torch.device, *, quick: bool) -> list[dict[str, object]]:
    """Inverting Gradients' batched objective on ResNet-18 and one LFW face: where a GPU starts to matter."""
    rows = []
    sizes, restart_counts = ((64,), (4,)) if quick else ((64, 128), (4, 16))
    for size in sizes:
        dm = FederatedDataModule("lfw_faces", num_clients=2, partition="iid", image_size=size, channels=3)
        torch.manual_seed(0)
        images, labels = dm.sample_batch(0, 1, seed=0)
        model = ImageClassifier("resnet18", **dm.model_options)
        view = view_on(client_view(model, images, labels, num_classes=dm.num_classes), device)
        for restarts in restart_counts:
            attack = InvertingGradientsAttack(max_iterations=1, restarts=restarts, progress_bar=False)
            row = {"model": "resnet18", "image_size": size, "restarts": restarts}
            row["ms_per_evaluation"] = evaluation_ms(attack, view, repeats=3 if quick else 5)
            print(json.dumps(row))
            rows.append(row)
    return rows


def _number(value: object, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def markdown(results: dict[str, object]) -> str:
    """The results as markdown for docs/performance.md's "## GPU" section."""
    env, fed = results["environment"], results.get("fedavg") or {}
    lines = [
        f"Device: {env['device_name']} (`{env['device']}`), torch {env['torch']}, Python {env['python']}"
        + (" (--quick: shortened runs)" if results["quick"] else "")
        + ".",
        f"Command: `{results['command']}`",
        "",
        "| run | setting | ms / gradient evaluation | ms / iteration | wall s | result |",
        "|---|---|---|---|---|---|",
    ]
    if "seconds" in fed:
        lines.append(
            f"| FedAvg quickstart | {fed['rounds']} rounds x 5 clients x 3 local epochs | - | - | "
            f"{fed['seconds']:.1f} | test accuracy {_number(fed['test_accuracy'], 3)} |"
        )
    rows = results.get("attacks")
    for row in rows if isinstance(rows, list) else []:
        reached = (
            f"; {row['psnr_target']:.0f} dB after {row['iterations_to_target']} it, {row['seconds_to_target']:.1f} s"
            if row["iterations_to_target"] is not None
            else f"; {row['psnr_target']:.0f} dB not reached"
        )
        lines.append(
            f"| {row['attack']} | {row['restarts']} restarts, {row['iterations']} iterations | "
            f"{row['ms_per_evaluation']:.2f} | {row['ms_per_iteration']:.2f} | {row['seconds']:.1f} | "
            f"PSNR {row['final_psnr']:.1f} dB{reached} |"
        )
    rows = results.get("scaling")
    if isinstance(rows, list):
        lines += [
            "",
            "| IG objective + backward, ResNet-18, one LFW face | restarts | ms / evaluation |",
            "|---|---|---|",
        ]
        lines += [
            f"| {r['image_size']}x{r['image_size']} | {r['restarts']} | {r['ms_per_evaluation']:.1f} |" for r in rows
        ]
    failed = [
        key
        for key in ("attacks", "fedavg", "scaling")
        if isinstance(results.get(key), dict) and "error" in results[key]
    ]
    lines += [f"\n{key} failed:\n```\n{results[key]['error']}```" for key in failed]
    return "\n".join(lines) + "\n"


def _write(results: dict[str, object], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(markdown(results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where everything runs")
    parser.add_argument("--out", default="runs/gpu_check", help="folder for results.json and results.md")
    parser.add_argument("--quick", action="store_true", help="short runs (5 rounds, 300 attack iterations)")
    parser.add_argument(
        "--sections", nargs="+", default=["attacks", "fedavg", "scaling"], choices=["attacks", "fedavg", "scaling"]
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False; use --device cpu for a CPU run.")
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    environment = {"torch": torch.__version__, "python": platform.python_version(), "device": args.device}
    environment |= {"device_name": name, "cuda": torch.version.cuda, "threads": torch.get_num_threads()}
    print(json.dumps(environment))
    results: dict[str, object] = {
        "environment": environment,
        "quick": args.quick,
        "command": f"python benchmarks/gpu_check.py --device {args.device}" + (" --quick" if args.quick else ""),
    }
    out = Path(args.out)
    available = {
        "attacks": lambda: attacks(device, quick=args.quick),
        "fedavg": lambda: fedavg(device, num_rounds=5 if args.quick else 25),
        "scaling": lambda: scaling(device, quick=args.quick),
    }
    sections = {key: available[key] for key in args.sections}
    for key, run in sections.items():
        try:
            results[key] = run()
        except Exception:  # a one-shot check on a lent machine: keep the other section's numbers
            results[key] = {"error": traceback.format_exc()}
        print(json.dumps({key: results[key]}))
        if device.type == "cuda":
            environment["max_memory_allocated_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        _write(results, out)
    print(markdown(results))
    print(f"wrote {out / 'results.json'} and {out / 'results.md'}")
    if any(isinstance(results[key], dict) and "error" in results[key] for key in sections):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
