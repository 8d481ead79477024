"""Run a bench's two kinds of run: a defence's utility run, and the short attack run its cells share.

The cells of one defence, threat model and seed differ only by the attack, and an attack only reads what the loop
releases (its own copies, its own random generator), so one short federated run serves all of them: each attack is
one :class:`GradientLeakage` callback on the same run, and the run's training is paid once, not once per attack.
An attack that changes the run (a malicious server's model) has a run of its own, built the same way.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_fl.attacks.metrics import image_successes
from lightning_fl.bench.experiment import build_loop, fit_loop, recorded_warnings

__all__ = [
    "IMAGE_METRICS",
    "METRICS",
    "dp_sgd_history",
    "failure",
    "public_data",
    "run_attacks",
    "run_utility",
    "write_atomically",
]

METRICS = ("psnr", "ssim", "lpips", "label_accuracy")
"""Attack scores averaged over a cell's attacked events, besides ``exact`` and ``success_rate``."""
IMAGE_METRICS = ("psnr", "ssim", "lpips", "own_colour_ssim")
"""Scores kept per attacked image (``images``), what the report's intervals resample."""


def _mean(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def _per_image(attacks: list[Mapping[str, Any]], metric: str) -> list[float]:
    """``metric`` of every attacked image of a cell (an entry without per-image scores counts once, its mean)."""
    values: list[float | None] = []
    for a in attacks:
        per_image = (a.get("per_image") or {}).get(metric)
        values += per_image if per_image is not None else [a.get(metric)]
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _scores(
    spec: Mapping[str, Any], entries: list[Mapping[str, Any]], seconds: float, guess: list[float] | None = None
) -> dict[str, Any]:
    """One cell's scores from its attack entries (``summary.json["attacks"]`` of its attack only); ``guess``: per
    attacked image, the best prior-only guess's SSIM in the same run (:func:`_best_guess`), kept as
    ``images["guess_ssim"]``.

    ``images`` holds each attacked image's PSNR, SSIM and LPIPS, ``by_round`` its PSNR and SSIM per attacked round
    (leakage over training); ``success_rate`` is the share of attacked images whose reconstruction reaches SSIM ≥
    ``success_ssim`` and beats its own mean colour and the best guess of it
    (:func:`~lightning_fl.attacks.metrics.image_successes`).
    """
    attacks = [a for a in entries if a.get("readable", True)]
    unreadable = len(entries) - len(attacks)  # views with nothing readable (Paillier ciphertexts)
    images = {m: _per_image(attacks, m) for m in IMAGE_METRICS}
    if guess is not None and len(guess) == len(images["ssim"]):
        images["guess_ssim"] = guess
    result: dict[str, Any] = {
        **{m: _mean([a.get(m) for a in attacks]) for m in METRICS},
        "success_rate": _mean(image_successes(images, spec["success_ssim"])),
        "exact": _mean([min(1.0, a["recovered"] / a["leaked_images"]) for a in attacks if a.get("leaked_images")]),
        "images": images,
        "by_round": {
            str(r): {m: _per_image([a for a in attacks if a.get("round") == r], m) for m in ("psnr", "ssim")}
            for r in sorted({a.get("round", 0) for a in attacks})
        },
        "success_ssim": spec["success_ssim"],
        "attacked": len(attacks),
        "unreadable": unreadable,
        "cpu_seconds": seconds,
        "status": "ok" if attacks else "not attacked (see warnings.txt)",
    }
    if unreadable and not attacks:  # every intercepted view was ciphertext: nothing to reconstruct from
        result.update(success_rate=0.0, status="ok: nothing readable at the leak point")
    return result


def failure(err: BaseException) -> str:
    """A failed run's status: the exception, on one line."""
    return f"failed: {type(err).__name__}: {' '.join(str(err).split())[:400]}"


def run_utility(spec: Mapping[str, Any], output_dir: str | Path) -> dict[str, Any]:
    """Train one defence at the utility setting and return its test accuracy, ε and CPU seconds.

    A spec with ``tune`` (a defence's ``tune:`` entry) first picks its settings on the validation split
    (:func:`~lightning_fl.bench.tuning.tune`, trials in ``<output_dir>__tuning``) and trains with them.

    Returns:
        ``test_accuracy``, ``epsilon`` (the last round's; ``None`` without a DP defence), ``rounds`` completed,
        ``dp_sgd_history`` (:func:`dp_sgd_history`), ``tuned`` (the chosen settings and every trial's validation
        accuracy, or ``None``), ``cpu_seconds`` and ``status``.
    """
    start = time.process_time()
    tuned = None
    if spec.get("tune"):  # the defence's settings chosen on the validation split first (lightning_fl.bench.tuning)
        from lightning_fl.bench.tuning import tune

        output_dir = Path(output_dir)
        tuned = tune(spec, spec["tune"], output_dir.with_name(f"{output_dir.name}__tuning"))
        spec = tuned.pop("spec")
    loop, summary = fit_loop(spec, output_dir)
    epsilons = [h["epsilon"] for h in summary["history"] if h.get("epsilon") is not None]
    return {
        "test_accuracy": summary["test_accuracy"],
        "epsilon": epsilons[-1] if epsilons else None,
        "rounds": summary["rounds_completed"],
        "dp_sgd_history": dp_sgd_history(loop),
        "tuned": tuned,
        "cpu_seconds": time.process_time() - start,
        "status": "ok",
    }


def dp_sgd_history(loop: Any) -> list[list[float]] | None:
    """The DP-SGD mechanism a run's most-trained client ran (``(noise_multiplier, sample_rate, steps)`` triples of
    its accountant, the noise multiplier over the whole gradient's clip norm), or ``None`` without a per-client
    DP-SGD defence (:class:`~lightning_fl.defences.dp.ClientDPSGD`: Fed-CDP, 2DP-FL); what the ReRo bounds of
    :mod:`lightning_fl.privacy.reconstruction` are computed from."""
    from lightning_fl.defences.dp import ClientDPSGD

    # a bundle (2DP-FL's DualDPFL) is not itself a ClientDPSGD: its DP-SGD part is one of the loop's callbacks
    keys = {d.extra_key for d in [*loop.defences, *loop.callbacks] if isinstance(d, ClientDPSGD)}
    histories = [c.extra[k]["history"] for c in loop.clients for k in keys if k in c.extra]
    histories = [h for h in histories if h]
    if not histories:
        return None
    return [[float(s), float(q), int(n)] for s, q, n in max(histories, key=lambda h: sum(n for *_, n in h))]


def _leakage(*args: Any, **kwargs: Any) -> Any:
    """A :class:`GradientLeakage` whose failing attack fails its own cell, not the run it shares with the others."""
    from lightning_fl.callbacks import GradientLeakage

    class IsolatedLeakage(GradientLeakage):
        error: str | None = None

        def attack_and_log(self, *a: Any, **kw: Any) -> None:
            if self.error is None:
                try:
                    super().attack_and_log(*a, **kw)
                except Exception as err:
                    self.error = failure(err)

    return IsolatedLeakage(*args, **kwargs)


def build_attack(spec: Mapping[str, Any], name: str, seed: int) -> Any:
    """The cell's attack, named after its bench key so that two settings of one attack class stay apart."""
    from lightning_fl.config import build, load_class

    class_path = spec["attack"]["class_path"]
    accepted = inspect.signature(load_class(class_path)).parameters
    init_args = dict(spec["attack"].get("init_args") or {})
    init_args.update(
        {k: v for k, v in (("seed", seed), ("progress_bar", False)) if k in accepted and k not in init_args}
    )
    if "public_data" in accepted and "public_data" not in init_args:  # the attacker's own data: the test split
        init_args["public_data"] = public_data(spec, attack=name)
    attack = build({"class_path": class_path, "init_args": init_args})
    attack.name = name
    return attack


def public_data(spec: Mapping[str, Any], *, attack: str = "<attack>") -> Any:
    """The data a bench gives an attack that asks for ``public_data`` (a prior-only baseline): the test split of the
    cell's data set, at its image size; the clients train, and are attacked, on the training split only.

    ``data`` is read as the run reads it (:func:`~lightning_fl.bench.experiment.data_config`, every ``class_path``
    built): a user's ``LightningDataModule`` gives the split its ``test_dataloader()`` holds after ``setup``. The
    split is built once per process and data setting (:func:`_test_split`) and shared by every attack and cell
    that asks for it: only the partition differs between them, and the test split is not partitioned.

    Raises:
        ValueError: naming ``attacks.<attack>`` when the data has no test (or validation) split to give.
    """
    kind, test_set = _test_split(spec["data"])
    if test_set is None:
        raise ValueError(
            f"attacks.{attack} takes public_data, the test split of data.dataset ({kind}), which has none; give the "
            "LightningDataModule a test_dataloader() (or val_dataloader()), or set the attack's init_args.public_data."
        )
    return test_set


_PARTITION_KEYS = frozenset(
    {"num_clients", "partition", "alpha", "shards_per_client", "overlapping_buckets", "val_fraction", "batch_size"}
    | {"eval_batch_size", "seed"}
)
"""``data`` keys that change how the training split is partitioned and batched, never the test split."""


def _test_split(data: Mapping[str, Any]) -> tuple[str, Any]:
    """``(the data set's kind, its test split or None)`` of a spec's ``data``, from :func:`_cached_test_split` when
    the settings are plain data (a built data set, from Python, is read each time)."""
    settings = {k: v for k, v in data.items() if k not in _PARTITION_KEYS}
    try:
        key = json.dumps(settings, sort_keys=True)
    except TypeError:
        return _read_test_split(settings)
    return _cached_test_split(key)


@functools.lru_cache(maxsize=4)
def _cached_test_split(settings: str) -> tuple[str, Any]:
    return _read_test_split(json.loads(settings))


def _read_test_split(settings: Mapping[str, Any]) -> tuple[str, Any]:
    from lightning_fl.bench.experiment import data_config
    from lightning_fl.config import build
    from lightning_fl.datamodules import FederatedDataModule

    data = FederatedDataModule(**build(data_config(settings)))
    return type(data.dataset).__name__, data.test_set if data.has_test_set else None


def attack_loop(specs: Mapping[str, Mapping[str, Any]], output_dir: str | Path) -> tuple[Any, list[Any]]:
    """The short run of ``specs`` (one cell per attack name, everything else shared) with one leakage callback per
    attack; nothing is written yet."""
    spec = next(iter(specs.values()))
    leakages = [
        _leakage(
            build_attack(cell_spec, name, int(spec["seed"])),
            leak_point=spec["leak_point"],
            rounds=spec["attack_rounds"],
            clients=spec.get("clients"),
            max_images=spec["max_images"],
        )
        for name, cell_spec in specs.items()
    ]
    return build_loop(spec, output_dir, callbacks=leakages), leakages


def run_attacks(
    specs: Mapping[str, Mapping[str, Any]], output_dir: str | Path, *, trained: str | Path | None = None
) -> dict[str, dict[str, Any]]:
    """Run the attack run shared by ``specs``, attack it with each spec's attack, and score every cell.

    Args:
        specs: attack name → :meth:`Cell.spec <lightning_fl.bench.grid.Cell.spec>` (plain data) of cells that
            share the defence, threat model and seed (everything but the attack).
        output_dir: the run directory (``summary.json``, one attack grid per attacked event).
        trained: the utility run's ``global_model.safetensors`` to start from (a trained-model threat model);
            ``None`` starts from the seed's initial model.

    Returns:
        per attack name: the mean attack scores, the attack success rate (share of attacked images with SSIM ≥
        ``success_ssim``), the cell's share of the run's CPU seconds and a status.
    """
    from lightning_fl.federation.export import load_global_model
    from lightning_fl.federation.run_dir import holds_run

    start = time.process_time()
    output_dir = Path(output_dir)
    with recorded_warnings(output_dir / "warnings.txt"):
        loop, leakages = attack_loop(specs, output_dir)
        if trained is not None:
            load_global_model(loop.global_model, trained)
        summary = loop.fit(overwrite=holds_run(output_dir))  # a cell run again with other settings replaces its run
    share = (time.process_time() - start) / len(specs)
    released = dp_sgd_history(loop)  # the attacked client's steps, each on a fixed batch that holds its target
    attacked = [[sigma, 1.0, steps] for sigma, _, steps in released] if released else None
    entries = {name: [a for a in summary["attacks"] if a["attack"] == name] for name in specs}
    guessed = [name for leakage, name in zip(leakages, specs, strict=True) if _prior_only(leakage)]
    guess = _best_guess([entries[name] for name in guessed])
    results = {}
    for leakage, (name, cell_spec) in zip(leakages, specs.items(), strict=True):
        reference = None if name in guessed else guess
        own = entries[name]
        results[name] = {"status": leakage.error} if leakage.error else _scores(cell_spec, own, share, reference)
        results[name]["prior_only"] = _prior_only(leakage)
        results[name]["dp_sgd_attacked"] = attacked
    return results


def _prior_only(leakage: Any) -> bool:
    return bool(getattr(leakage.attack, "prior_only", False))


def _best_guess(guesses: list[list[Mapping[str, Any]]]) -> list[float] | None:
    """Per attacked image, the highest SSIM any prior-only guess of the run scored on it (``guesses``: each guess's
    attack entries), or ``None`` without a guess that scored every image. The guesses attack the run's events in
    the order the attacks do, so the lists line up image by image.

    Example:
        >>> _best_guess([[{"per_image": {"ssim": [0.2, 0.7]}}], [{"per_image": {"ssim": [0.5, 0.1]}}]])
        [0.5, 0.7]
    """
    scored = [_per_image(entries, "ssim") for entries in guesses]
    scored = [s for s in scored if s and len(s) == len(scored[0])]
    return [max(values) for values in zip(*scored, strict=True)] if scored else None


def write_atomically(path: Path, payload: Mapping[str, Any]) -> None:
    """Write JSON to ``path`` via a temporary file and ``os.replace``, so a killed run leaves no half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=float))
    os.replace(tmp, path)
