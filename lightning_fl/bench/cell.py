"""Run one benchmark cell: a short federated run with the attack as a :class:`GradientLeakage` callback."""

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

__all__ = ["run_cell"]

_DATA_LINKS = ("num_classes", "in_channels", "image_size", "input_mean", "input_std")
METRICS = ("psnr", "ssim", "lpips", "label_accuracy")


def _mean(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def _result(spec: Mapping[str, Any], summary: Mapping[str, Any], seconds: float) -> dict[str, Any]:
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


def run_cell(spec: Mapping[str, Any], output_dir: str | Path) -> dict[str, Any]:
    """Train the cell's federation, attack it at ``spec["leak_point"]``, and score it.

    Args:
        spec: a :meth:`Cell.spec <lightning_fl.bench.grid.Cell.spec>` (plain data).
        output_dir: the cell's run directory (``summary.json``, ``curves.png``, attack grids).

    Returns:
        test accuracy, ε (``None`` without a DP defence), the mean attack scores, the attack success rate (share
        of attacked events with SSIM ≥ ``success_ssim``), CPU seconds and a status.
    """
    import lightning as L

    from lightning_fl.bench.grid import build, load_class
    from lightning_fl.callbacks import GradientLeakage
    from lightning_fl.datamodules import FederatedDataModule
    from lightning_fl.federation import FederatedLoop

    seed = int(spec["seed"])
    start = time.process_time()
    L.seed_everything(seed, verbose=False)
    data = FederatedDataModule(**{**spec["data"], "seed": seed})
    data.setup()
    model_type = load_class(spec["model"]["class_path"])
    accepted = inspect.signature(model_type).parameters
    links = {k: v for k, v in data.model_options.items() if k in _DATA_LINKS and k in accepted}  # as the CLI links
    model = model_type(**{**links, **build(spec["model"].get("init_args") or {})})
    attack_type = load_class(spec["attack"]["class_path"])
    accepted = inspect.signature(attack_type).parameters
    init_args = build(spec["attack"].get("init_args") or {})
    init_args.update(
        {k: v for k, v in (("seed", seed), ("progress_bar", False)) if k in accepted and k not in init_args}
    )
    attack = attack_type(**init_args)
    leakage = GradientLeakage(
        attack,
        leak_point=spec["leak_point"],
        rounds=spec["attack_rounds"],
        max_images=spec["max_images"],
    )
    loop_options = {k: build(v) for k, v in spec["loop"].items()}
    output_dir = Path(output_dir)
    loop = FederatedLoop(
        model,
        data,
        defences=build(spec["defences"]),
        callbacks=[leakage],
        client_callbacks=build(spec["client_callbacks"]),
        output_dir=output_dir,
        seed=seed,
        checkpoint=False,
        progress_bar=False,
        **loop_options,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = loop.fit()
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "warnings.txt").write_text("".join(f"{w.message}\n" for w in caught))
    return _result(spec, summary, time.process_time() - start)


def write_atomically(path: Path, payload: Mapping[str, Any]) -> None:
    """Write JSON to ``path`` via a temporary file and ``os.replace``, so a killed run leaves no half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=float))
    os.replace(tmp, path)
