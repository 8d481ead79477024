"""Run the cells of one federated run: a short run with every attack as a :class:`GradientLeakage` callback.

The cells of one defence, leak point and seed differ only by the attack, and an attack only reads what the loop
releases (its own copies, its own random generator), so one federated run serves all of them: each attack is
one callback on the same run, and the run's training is paid once, not once per attack.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["run_cells"]

_DATA_LINKS = ("num_classes", "in_channels", "image_size", "input_mean", "input_std")
METRICS = ("psnr", "ssim", "lpips", "label_accuracy")


def _mean(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def _result(spec: Mapping[str, Any], summary: Mapping[str, Any], seconds: float) -> dict[str, Any]:
    """One cell's scores from its run's summary, whose ``attacks`` are this cell's attack entries only."""
    attacks = [a for a in summary["attacks"] if a.get("readable", True)]
    unreadable = len(summary["attacks"]) - len(attacks)  # views with nothing readable (Paillier ciphertexts)
    epsilons = [h["epsilon"] for h in summary["history"] if h.get("epsilon") is not None]
    result: dict[str, Any] = {
        "test_accuracy": summary["test_accuracy"],
        "epsilon": epsilons[-1] if epsilons else None,
        **{m: _mean([a.get(m) for a in attacks]) for m in METRICS},
        "success_rate": _mean([float((a.get("ssim") or 0.0) >= spec["success_ssim"]) for a in attacks]),
        "attacked": len(attacks),
        "unreadable": unreadable,
        "cpu_seconds": seconds,
        "status": "ok" if attacks else "not attacked (see warnings.txt)",
    }
    if unreadable and not attacks:  # every intercepted view was ciphertext: nothing to reconstruct from
        result.update(success_rate=0.0, status="ok: nothing readable at the leak point")
    return result


def failure(err: Exception) -> str:
    """A failed cell's status: the exception, on one line."""
    return f"failed: {type(err).__name__}: {' '.join(str(err).split())[:200]}"


def _leakage(*args: Any, **kwargs: Any) -> Any:
    """A :class:`GradientLeakage` whose failing attack fails its own cell, not the run it shares with the others."""
    from lightning_fl.callbacks import GradientLeakage

    class IsolatedLeakage(GradientLeakage):
        error: str | None = None

        def _attack_and_log(self, *a: Any, **kw: Any) -> None:
            if self.error is None:
                try:
                    super()._attack_and_log(*a, **kw)
                except Exception as err:
                    self.error = failure(err)

    return IsolatedLeakage(*args, **kwargs)


def _attack(spec: Mapping[str, Any], name: str, seed: int) -> Any:
    """The cell's attack, named after its bench key so that two settings of one attack class stay apart."""
    from lightning_fl.bench.grid import build, load_class

    attack_type = load_class(spec["attack"]["class_path"])
    accepted = inspect.signature(attack_type).parameters
    init_args = build(spec["attack"].get("init_args") or {})
    init_args.update(
        {k: v for k, v in (("seed", seed), ("progress_bar", False)) if k in accepted and k not in init_args}
    )
    attack = attack_type(**init_args)
    attack.name = name
    return attack


def run_cells(specs: Mapping[str, Mapping[str, Any]], output_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Train the federation shared by ``specs``, attack it with each spec's attack, and score every cell.

    Args:
        specs: attack name → :meth:`Cell.spec <lightning_fl.bench.grid.Cell.spec>` (plain data) of cells that
            share the defence, leak point and seed (everything but the attack).
        output_dir: the run directory (``summary.json``, ``curves.png``, one attack grid per attacked event).

    Returns:
        per attack name: test accuracy, ε (``None`` without a DP defence), the mean attack scores, the attack
        success rate (share of attacked events with SSIM ≥ ``success_ssim``), the cell's share of the run's CPU
        seconds and a status.
    """
    import lightning as L

    from lightning_fl.bench.grid import build, load_class
    from lightning_fl.datamodules import FederatedDataModule
    from lightning_fl.federation import FederatedLoop

    spec = next(iter(specs.values()))  # the run's settings: the same in every spec but the attack
    seed = int(spec["seed"])
    start = time.process_time()
    L.seed_everything(seed, verbose=False)
    data = FederatedDataModule(**{**spec["data"], "seed": seed})
    data.setup()
    model_type = load_class(spec["model"]["class_path"])
    accepted = inspect.signature(model_type).parameters
    links = {k: v for k, v in data.model_options.items() if k in _DATA_LINKS and k in accepted}  # as the CLI links
    model = model_type(**{**links, **build(spec["model"].get("init_args") or {})})
    leakages = [
        _leakage(
            _attack(cell_spec, name, seed),
            leak_point=spec["leak_point"],
            rounds=spec["attack_rounds"],
            max_images=spec["max_images"],
        )
        for name, cell_spec in specs.items()
    ]
    output_dir = Path(output_dir)
    loop = FederatedLoop(
        model,
        data,
        defences=build(spec["defences"]),
        callbacks=leakages,
        client_callbacks=build(spec["client_callbacks"]),
        output_dir=output_dir,
        seed=seed,
        checkpoint=False,
        progress_bar=False,
        **{k: build(v) for k, v in spec["loop"].items()},
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = loop.fit()
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "warnings.txt").write_text("".join(f"{w.message}\n" for w in caught))
    share = (time.process_time() - start) / len(specs)
    results = {}
    for leakage, (name, cell_spec) in zip(leakages, specs.items(), strict=True):
        own = {**summary, "attacks": [a for a in summary["attacks"] if a["attack"] == name]}
        results[name] = {"status": leakage.error} if leakage.error else _result(cell_spec, own, share)
    return results


def write_atomically(path: Path, payload: Mapping[str, Any]) -> None:
    """Write JSON to ``path`` via a temporary file and ``os.replace``, so a killed run leaves no half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=float))
    os.replace(tmp, path)
