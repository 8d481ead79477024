"""Attack one leak point of the federated loop at chosen rounds and clients, and log how much leaked."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_fl.attacks.base import GradientAttack
from lightning_fl.attacks.gradient_matching import leaked_batch_size
from lightning_fl.attacks.report import attack_report
from lightning_fl.callbacks.base import FederatedCallback
from lightning_fl.messages import LEAK_POINTS, GroundTruth, LeakPoint, ServerView

if TYPE_CHECKING:
    from lightning_fl.view import FederationView

__all__ = ["GradientLeakage"]

_HOOKS: dict[str, str] = {
    "local_gradient": "on_local_gradient",
    "client_update": "on_client_update",
    "aggregate": "on_aggregate_end",
}


class GradientLeakage(FederatedCallback):
    """Run a gradient-leakage attack on what the server sees at one leak point, then score and log it.

    At each attacked event the callback hands the :class:`~lightning_fl.messages.ServerView` (public state,
    intercepted tensors, public metadata: nothing else) to ``attack.reconstruct``, scores the result against the
    ground truth the loop kept aside, logs the scores to the loop's loggers, saves the labelled
    ground-truth-vs-reconstruction grid of :mod:`lightning_fl.attacks.report` to ``output_dir/attacks/`` (and to
    W&B when a W&B logger is attached), and appends one entry to ``summary.json["attacks"]``.

    What the ground truth is: at ``local_gradient`` the exact mini-batch; at ``client_update`` the examples the
    client's ``local_steps`` drew (its whole local training set when it trains whole epochs); at ``aggregate``
    the same for every participating client, together. Reconstructions are matched to distinct images of it, and
    an image left without one is scored as a miss
    (:func:`~lightning_fl.attacks.metrics.score_reconstruction`).

    A realistic FedAvg update (several epochs over ~140 samples) hides far more images than an optimisation
    attack can invert. ``max_images`` is the largest leaked batch (see
    :func:`~lightning_fl.attacks.gradient_matching.leaked_batch_size`) the callback will attack; larger ones are
    skipped with a warning. To attack ``client_update`` train the attacked setting with ``loop.local_steps: 1``,
    a small ``data.batch_size`` and ``model.optimizer: sgd``, or attack ``local_gradient`` (docs/attacks.md).

    A view with no readable tensors (updates encrypted with Paillier: the server holds only ciphertexts) is not
    attacked; its entry says ``"readable": False`` and carries no scores, which is the defence's result.

    Args:
        attack: the attack; anything with ``reconstruct(view) -> Reconstruction``.
        leak_point: ``"local_gradient"`` (Fed-CDP type 2), ``"client_update"`` (type 1) or ``"aggregate"``
            (type 0).
        rounds: 0-based rounds to attack.
        clients: client ids to attack; ``None`` attacks every selected client (ignored at ``aggregate``).
        step_indices: 0-based local optimiser steps to attack at ``local_gradient``.
        max_images: attack only views whose leaked batch has at most this many images.
        save_images: write the comparison grid PNG.

    Raises:
        ValueError: on an unknown leak point, a negative round or step, or ``max_images < 1``.

    Example:
        >>> from lightning_fl.attacks import DLGAttack
        >>> cb = GradientLeakage(DLGAttack(max_iterations=10), leak_point="local_gradient", rounds=[0], clients=[1])
        >>> cb.listens_to("on_local_gradient"), cb.listens_to("on_client_update")
        (True, False)
    """

    def __init__(
        self,
        attack: GradientAttack,
        *,
        leak_point: LeakPoint = "client_update",
        rounds: Sequence[int] = (0,),
        clients: Sequence[int] | None = None,
        step_indices: Sequence[int] = (0,),
        max_images: int = 8,
        save_images: bool = True,
    ) -> None:
        if leak_point not in LEAK_POINTS:
            raise ValueError(
                f"GradientLeakage(leak_point={leak_point!r}) is unknown; use one of {sorted(LEAK_POINTS)} "
                "('aggregate' = Fed-CDP type 0, 'client_update' = type 1, 'local_gradient' = type 2)."
            )
        if any(r < 0 for r in rounds) or any(s < 0 for s in step_indices):
            raise ValueError(
                f"GradientLeakage(rounds={list(rounds)}, step_indices={list(step_indices)}) must be 0-based (>= 0)."
            )
        if max_images < 1:
            raise ValueError(f"GradientLeakage(max_images={max_images}) must be >= 1.")
        self.attack, self.leak_point = attack, leak_point
        self.rounds = frozenset(rounds)
        self.clients = frozenset(clients) if clients is not None else None
        self.step_indices = frozenset(step_indices)
        self.max_images, self.save_images = max_images, save_images

    def listens_to(self, hook: str) -> bool:
        """Only the hook of the chosen leak point, so the loop builds no other views for this callback."""
        return hook == _HOOKS[self.leak_point]

    def wants(self, hook: str, *, round_idx: int, client_id: int | None = None, step: int | None = None) -> bool:
        """The chosen rounds, clients and (at ``local_gradient``) local steps: the loop builds no other views."""
        if round_idx not in self.rounds or (step is not None and step not in self.step_indices):
            return False
        return client_id is None or self.clients is None or client_id in self.clients

    @override
    def on_local_gradient(self, federation: FederationView, view: ServerView, ground_truth: GroundTruth) -> None:
        self.attack_and_log(federation, view, ground_truth, step=view.metadata["step"])

    @override
    def on_client_update(self, federation: FederationView, view: ServerView, ground_truth: GroundTruth) -> None:
        self.attack_and_log(federation, view, ground_truth)

    @override
    def on_aggregate_end(self, federation: FederationView, view: ServerView, ground_truth: GroundTruth) -> None:
        self.attack_and_log(federation, view, ground_truth)

    def attack_and_log(
        self, federation: FederationView, view: ServerView, ground_truth: GroundTruth, *, step: int | None = None
    ) -> None:
        """Attack one view, score it against ``ground_truth`` and log the entry (what every hook of the callback
        does); a subclass may wrap it, e.g. to record an attack's failure instead of stopping the run."""
        client = view.metadata.get("client_id")
        name = getattr(self.attack, "name", type(self.attack).__name__)
        if not view.tensors:  # the server reads nothing here (Paillier ciphertexts): the defence's result, recorded
            where = {"round": federation.round_idx, "client": client, "leak_point": self.leak_point, "step": step}
            federation.record_attack({"attack": name, **where, "readable": False})
            return
        leaked = leaked_batch_size(view)
        if leaked > self.max_images:
            warnings.warn(
                f"GradientLeakage skipped round {federation.round_idx}, client {client} at {self.leak_point!r}: the "
                f"view hides {leaked} images (batch_size x local_steps) > max_images={self.max_images}. Attack "
                "'local_gradient', or train the attacked setting with loop.local_steps=1 and a small "
                "data.batch_size, or raise max_images.",
                stacklevel=2,
            )
            return
        reconstruction = self.attack.reconstruct(view)
        tag = f"{name}_{self.leak_point}_r{federation.round_idx}" + (f"_c{client}" if client is not None else "")
        tag += f"_s{step}" if step is not None else ""
        report = attack_report(
            reconstruction,
            ground_truth,
            num_classes=view.metadata.get("num_classes"),
            path=federation.output_dir / "attacks" / f"{tag}.png" if self.save_images else None,
            title=f"{name} on {self.leak_point}, round {federation.round_idx}"
            + (f", client {client}" if client is not None else ""),
        )
        scores = {k: v for k, v in report.items() if k not in ("image", "matched_sources")}
        entry: dict[str, Any] = {
            "attack": name,
            "round": federation.round_idx,
            "client": client,
            "leak_point": self.leak_point,
            **scores,
            "step": step,
            "ground_truth_size": len(ground_truth.targets),
            "leaked_images": leaked,  # the images behind the view (ground truth may be the client's whole set)
            "seconds": reconstruction.info.get("seconds"),
        }
        if report["image"] is not None:
            entry["image"] = report["image"]
            for logger in federation.loggers:
                if hasattr(logger, "log_image"):
                    logger.log_image(key=f"attacks/{tag}", images=[report["image"]], step=federation.round_idx)
        prefix = f"attack/{name}/{self.leak_point}" + (f"/client_{client}" if client is not None else "")
        numeric = {f"{prefix}/{k}": v for k, v in scores.items() if isinstance(v, int | float)}
        for logger in federation.loggers:
            logger.log_metrics(numeric, step=federation.round_idx)
        federation.record_attack(entry)
