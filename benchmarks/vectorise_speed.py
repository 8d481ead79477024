"""CPU time of a federation's rounds with clients trained one by one and vectorised (``loop.vectorize``), A/B.

The federation is the quickstart's (digits, Dirichlet 0.5, Adam 2e-3, 3 local epochs, batch 32, the sigmoid DLG
LeNet, or ``--backbone``) with ``--clients`` clients, ``--per-round`` a round. Each repeat builds both loops from the
same seed and fits them one after the other, the order alternating between repeats (interleaved A/B on a shared
machine). The figures are the time inside ``run_round`` (start-up excluded): this process's CPU time (the one to read
on a shared CPU) and the wall time (the one to read on a GPU), with the ratios vectorised / sequential.
``--profile`` instead runs the vectorised rounds once under cProfile and prints the top entries; ``--layers`` times the
DLG LeNet's convolutional body (forward and backward, B = 32, ``--per-round`` clients) in the three forms: one NCHW
convolution per client (as the sequential fit), one channels-last convolution per client (the vectorised fit on a CPU)
and one grouped convolution (on a GPU; the form ``torch.func.vmap`` gives).

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/vectorise_speed.py --clients 10 --per-round 5
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/vectorise_speed.py --clients 100 --per-round 20
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time

import torch

from lightning_fl import FederatedLoop, ImageClassifier
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.federation.vectorised_fit import StackedConv2d
from lightning_fl.models.lenet import LeNetDLG


def _fit(
    dm: FederatedDataModule,
    *,
    vectorize: bool,
    per_round: int,
    rounds: int,
    seed: int,
    accelerator: str,
    backbone: str,
) -> tuple[float, float, list]:
    """The CPU and wall seconds of the loop's rounds, and its history."""
    with tempfile.TemporaryDirectory() as out:
        torch.manual_seed(seed)
        model = ImageClassifier(backbone, **dm.model_options, lr=2e-3)
        loop = FederatedLoop(
            model, dm, num_rounds=rounds, clients_per_round=per_round, local_epochs=3, seed=seed, output_dir=out,
            checkpoint=False, progress_bar=False, vectorize=vectorize, trainer={"accelerator": accelerator},
        )  # fmt: skip
        spent = [0.0, 0.0]
        run_round = loop.run_round

        def timed(*args, **kwargs):
            cpu, wall = time.process_time(), time.perf_counter()
            try:
                return run_round(*args, **kwargs)
            finally:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                spent[0] += time.process_time() - cpu
                spent[1] += time.perf_counter() - wall

        loop.run_round = timed
        loop.fit()
        return spent[0], spent[1], loop.history


def _body_times(clients: int, batch: int = 32, repeats: int = 5, calls: int = 10) -> dict[str, float]:
    """CPU ms per client of the DLG LeNet body's forward and backward in each form (best of ``repeats``)."""
    torch.manual_seed(0)
    convs = [m for m in LeNetDLG(in_channels=1).body if isinstance(m, torch.nn.Conv2d)]
    weights = [torch.stack([c.weight.detach()] * clients).requires_grad_() for c in convs]
    biases = [torch.stack([c.bias.detach()] * clients).requires_grad_() for c in convs]
    x = torch.rand(clients * batch, 1, 32, 32)

    def each(channels_last: bool) -> torch.Tensor:
        outs = []
        for part in x.split(batch):
            h = part.contiguous(memory_format=torch.channels_last) if channels_last else part
            for conv, weight, bias in zip(convs, weights, biases, strict=True):
                k = len(outs)
                h = torch.sigmoid(torch.nn.functional.conv2d(h, weight[k], bias[k], conv.stride, conv.padding))
            outs.append(h)
        return torch.cat(outs)

    def grouped() -> torch.Tensor:
        h = x
        for conv, weight, bias in zip(convs, weights, biases, strict=True):
            layer = StackedConv2d(conv)
            layer.sizes, layer.grouped, layer.weight, layer.bias = [batch] * clients, True, weight, bias
            h = torch.sigmoid(layer(h))
        return h

    forms = {"per client, NCHW": lambda: each(False), "per client, channels-last": lambda: each(True)}
    forms["grouped, channels-last"] = grouped
    times = {}
    for name, form in forms.items():
        best = float("inf")
        for _ in range(repeats):
            cpu = time.process_time()
            for _ in range(calls):
                torch.autograd.grad(form().sum(), weights + biases)
            best = min(best, (time.process_time() - cpu) / calls)
        times[name] = 1e3 * best / clients
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backbone", default="lenet_dlg", help="ImageClassifier's backbone (one that qualifies)")
    parser.add_argument("--accelerator", default="cpu", help="loop.trainer's accelerator: cpu or gpu")
    parser.add_argument("--layers", action="store_true", help="time the LeNet body's three forms instead")
    parser.add_argument("--profile", action="store_true", help="cProfile the vectorised rounds once instead")
    args = parser.parse_args()
    dm = FederatedDataModule("digits", num_clients=args.clients, partition="dirichlet", alpha=0.5, seed=0)
    dm.setup()
    run = {"per_round": args.per_round, "rounds": args.rounds, "seed": args.seed}
    run.update(accelerator=args.accelerator, backbone=args.backbone)
    if args.layers:
        for name, ms in _body_times(args.per_round).items():
            print(f"{name}: {ms:.2f} ms CPU per client step (B = 32, {args.per_round} clients)")
        return
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(_fit, dm, vectorize=True, **run)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    header = (
        "| repeat | order | rounds CPU s seq / vec | ratio | rounds wall s seq / vec | ratio | final accuracy seq / vec"
    )
    print(f"{header} | max abs diff train loss | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for repeat in range(args.repeats):
        load, order = os.getloadavg()[0], (False, True) if repeat % 2 == 0 else (True, False)
        timed = {vectorize: _fit(dm, vectorize=vectorize, **run) for vectorize in order}
        (seq, wseq, hs), (vec, wvec, hv) = timed[False], timed[True]
        loss = max(abs(a["train_loss"] - b["train_loss"]) for a, b in zip(hs, hv, strict=True))
        first = "seq, vec" if order[0] is False else "vec, seq"
        print(
            f"| {repeat} | {first} | {seq:.2f} / {vec:.2f} | {vec / seq:.2f} "
            f"| {wseq:.2f} / {wvec:.2f} | {wvec / wseq:.2f} "
            f"| {hs[-1]['test_accuracy']:.4f} / {hv[-1]['test_accuracy']:.4f} | {loss:.1e} | {load:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
