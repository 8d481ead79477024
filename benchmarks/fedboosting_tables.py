"""Thesis Tables 4.1 and 4.3, direction only, on digits: FedAvg vs FedBoosting, with Paillier HE and "DP" fusion.

The thesis trains a CRNN on Synth90K + SynthText (2 clients, ~10M images); here the same comparison runs at
reduced scale on the offline digits data: 4 clients with Dirichlet(0.3) label skew, all training every round,
20% of each client's data held out as its validation set, the sigmoid LeNet, Adam lr 2e-3, batch 32.

* Table 4.1 direction: FedAvg vs FedBoosting (plaintext) at 1 and 3 local epochs. FedAvg weights clients by
  sample count (McMahan et al.); the thesis' baseline is the uniform mean, which is a row of its own.
* Table 4.3 direction: FedAvg, FedAvg + HE, FedBoosting, FedBoosting + HE, FedBoosting + HE + DP fusion, at
  ``--epochs`` local epochs; plus the literal Eq. 4.2 weighting as an ablation.

HE uses the packed Paillier encoding with ``--key-size`` bits (512 by default to keep the run short; the
thesis used 128-bit keys, 2048 is the library default), P = 100 pieces and p_hat = 0.9 (thesis Sec. 4.3.2.1).
Each row is the mean over ``--seeds`` (partition and initialisation) of the final test accuracy. About 12
minutes on one CPU core with the defaults; not run in CI. The settings (rounds, seeds, key size, data, model) are in
``configs/fedboosting_tables.yaml``; a flag overrides its key.

    .venv/bin/python benchmarks/fedboosting_tables.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from _config import parse_args

from lightning_fl.bench import scratch_loop

FED_AVG = {"class_path": "lightning_fl.server.FedAvg"}
SECURE_FED_AVG = {"class_path": "lightning_fl.defences.SecureFedAvg"}


def fed_boosting(**init_args: Any) -> dict[str, Any]:
    """FedBoosting's ``class_path``/``init_args`` (thesis Alg. 1) with ``init_args``."""
    return {"class_path": "lightning_fl.server.FedBoosting", "init_args": init_args}


def run(setting: dict[str, Any], aggregator: dict[str, Any], transforms: list, *, epochs: int) -> dict[str, float]:
    """One row's run: ``setting`` (the shared builder's spec without the loop), all 4 clients every round."""
    rounds = setting["rounds"]
    spec = {
        "seed": setting["seed"],
        "data": setting["data"],
        "model": setting["model"],
        "loop": {
            "num_rounds": rounds,
            "clients_per_round": 4,
            "local_epochs": epochs,
            "aggregator": aggregator,
            "client_transforms": transforms,
        },
    }
    with scratch_loop(spec) as loop:
        start = time.perf_counter()
        summary = loop.fit()
        elapsed = time.perf_counter() - start
    history = summary["history"]
    he_time = statistics.mean(
        sum(h.get(k, 0.0) for k in ("he_encrypt_s", "he_aggregate_s", "he_decrypt_s")) for h in history
    )
    return {
        "final": summary["test_accuracy"],
        "best": max(h["test_accuracy"] for h in history),
        "seconds_per_round": elapsed / rounds,
        "he_seconds_per_round": he_time,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/fedboosting_tables.yaml", help="the settings; flags override")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--epochs", type=int, help="local epochs of the Table 4.3 rows")
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--key-size", type=int)
    parser.add_argument("--only", nargs="+", help="run only the rows with these method names")
    args = parse_args(parser)
    setting = {"data": args.fit["data"], "model": args.fit["model"], "rounds": args.rounds}
    he = [{"class_path": "lightning_fl.defences.PaillierEncryption", "init_args": {"key_size": args.key_size}}]
    plain: list = []
    rows = [
        ("4.1", "FedAvg", 1, FED_AVG, plain),
        ("4.1", "FedBoosting", 1, fed_boosting(), plain),
        ("4.1 / 4.3", "FedAvg", args.epochs, FED_AVG, plain),
        (
            "4.1 / 4.3",
            "FedAvg, uniform 1/N (thesis baseline)",
            args.epochs,
            {**FED_AVG, "init_args": {"weighted": False}},
            plain,
        ),
        ("4.1 / 4.3", "FedBoosting", args.epochs, fed_boosting(), plain),
        ("4.3", "FedAvg + HE", args.epochs, SECURE_FED_AVG, he),
        ("4.3", "FedBoosting + HE", args.epochs, fed_boosting(), he),
        ("4.3", "FedBoosting + HE + DP (p_hat 0.9)", args.epochs, fed_boosting(fusion_p_hat=0.9), he),
        ("ablation", "FedBoosting, Eq. 4.2 literal", args.epochs, fed_boosting(weighting="softmax_losses"), plain),
    ]
    print(f"{setting['data']}, {args.rounds} rounds, seeds {args.seeds}, key {args.key_size} bits\n")
    print("| table | method | local epochs | final test acc. (per seed) | best acc. | s/round | HE s/round |")
    print("|---|---|---|---|---|---|---|")
    for table, name, epochs, aggregator, transforms in rows:
        if args.only is not None and name not in args.only:
            continue
        results = [run({**setting, "seed": s}, aggregator, transforms, epochs=epochs) for s in args.seeds]
        finals = " / ".join(f"{r['final']:.3f}" for r in results)
        mean = {k: statistics.mean(r[k] for r in results) for k in results[0]}
        print(
            f"| {table} | {name} | {epochs} | {mean['final']:.3f} ({finals}) | {mean['best']:.3f} | "
            f"{mean['seconds_per_round']:.1f} | {mean['he_seconds_per_round']:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
