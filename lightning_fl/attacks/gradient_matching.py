"""The gradient-matching attack shared by DLG, iDLG and Inverting Gradients: one loop, pieces passed in.

An optimisation attack looks for candidate images (and labels) whose simulated client gradient matches the
intercepted one:

.. math:: \\hat x, \\hat y = \\arg\\min_{x, y} D(\\nabla_\\theta L(x, y; \\theta), g) + R(x)

DLG (Zhu et al., NeurIPS 2019, Eq. 4) uses the squared Euclidean distance, joint soft labels and L-BFGS;
iDLG (Zhao et al., 2020) infers the labels first; Inverting Gradients (Geiping et al., NeurIPS 2020, Eq. 4) uses
the cosine distance, total variation, signed Adam, a [0, 1] box and step decay. Their modules are presets of
:class:`GradientMatchingAttack`. All restarts run as one computation: the per-restart objective is
``torch.func.vmap``-ed, so R restarts cost one batched evaluation per iteration rather than R.

Devices: the attack runs where ``view.model``'s matched parameters live (CPU or CUDA), in their floating dtype
(at least float32). Random starts are drawn on the CPU from a seeded ``torch.Generator`` and then moved, so a
seed gives the same starting point on every device.
"""

from __future__ import annotations

import copy
import fnmatch
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from rich.progress import Progress
from torch import Tensor
from torch.func import replace_all_batch_norm_modules_, vmap

from lightning_fl.attacks.base import GradientAttack, IterationCallback, Reconstruction
from lightning_fl.attacks.batched_lbfgs import BatchedLBFGS
from lightning_fl.attacks.labels import LABEL_STRATEGIES, LabelStrategy, infer_labels, last_layer_weight_name
from lightning_fl.attacks.local_update import simulated_pseudo_gradient
from lightning_fl.messages import ServerView

__all__ = [
    "BATCH_MAX_ITERATIONS",
    "BATCH_TV_WEIGHT",
    "DISTANCES",
    "SINGLE_MAX_ITERATIONS",
    "SINGLE_STOP_BELOW",
    "BatchSettings",
    "DistanceName",
    "GradientMatchingAttack",
    "MatchingProblem",
    "MatchingState",
    "MatchingTarget",
    "TotalVariation",
    "cosine_distance",
    "euclidean_distance",
    "initial_images",
    "leaked_batch_size",
    "matching_target",
    "total_variation",
]

DistanceName = Literal["euclidean", "cosine"]
InitName = Literal["randn", "rand", "patterned"]
OptimizerName = Literal["lbfgs", "adam"]
Auto = Literal["auto"]
LabelMode = Literal["optimise", "infer"]
Step = Callable[[Sequence[Tensor]], None]

BATCH_TV_WEIGHT = 1e-3
"""``tv_weight="auto"`` on a batch (B > 1): DLG's objective with this total-variation prior recovered B = 8 digits on
4 of 4 seeds where the plain objective (0) converged to half-recovered images (docs/attacks.md, "Batch recovery")."""
SINGLE_MAX_ITERATIONS = 3000
"""``max_iterations="auto"`` on one image: the early stop ends most runs first (about 900-2300 evaluations on 32x32
photo crops; docs/attacks.md, "Parity")."""
BATCH_MAX_ITERATIONS = 6000
"""``max_iterations="auto"`` on a batch, which runs without an early stop: the DLG paper's budget (300 L-BFGS steps of
20 evaluations). A client's first 8 digits (two labels repeated) through ``lightning-fl attack``: 6 of 8 images at
3000 evaluations (22.1 dB), all 8 at 6000 (35.9 dB); photo pairs 0 of 3 seeds at 3000, 2 of 4 at 6000."""
SINGLE_STOP_BELOW = 3e-8
"""``stop_below="auto"`` on one image: about 32-42 dB on the LeNet (docs/attacks.md, "Parity"); on a batch "auto" is no
early stop, because the gradient distance reaches this on half-recovered batches (B = 8 digits: 7 of 8 images)."""


class BatchSettings(NamedTuple):
    """What the ``"auto"`` arguments of a gradient-matching attack resolve to for one view (see
    :meth:`GradientMatchingAttack.batch_settings`)."""

    tv_weight: float
    stop_below: float | None
    max_iterations: int


def _identity(x: Tensor) -> Tensor:
    return x


def euclidean_distance(*, candidate: Sequence[Tensor], target: Sequence[Tensor]) -> Tensor:
    r"""DLG's gradient distance :math:`\sum_l \|\nabla W'_l - \nabla W_l\|^2` (Zhu et al., 2019, Eq. 4).

    Example:
        >>> euclidean_distance(candidate=[torch.ones(2)], target=[torch.zeros(2)])
        tensor(2.)
    """
    return sum(((c - t) ** 2).sum() for c, t in zip(candidate, target, strict=True))


def cosine_distance(*, candidate: Sequence[Tensor], target: Sequence[Tensor]) -> Tensor:
    r"""Inverting Gradients' distance :math:`1 - \langle g', g\rangle / (\|g'\|\,\|g\|)` over all layers together.

    Implements the data term of Eq. (4) of Geiping et al. (NeurIPS 2020): the gradients of all matched layers are
    one vector (as ``inversefed.reconstruction_costs(cost_fn="sim")`` computes it), so the loss is invariant to the
    gradient's magnitude.

    Example:
        >>> cosine_distance(candidate=[torch.tensor([2.0, 0.0])], target=[torch.tensor([1.0, 0.0])])
        tensor(0.)
    """
    dot = sum((c * t).sum() for c, t in zip(candidate, target, strict=True))
    norm_c = sum(c.pow(2).sum() for c in candidate).sqrt()
    norm_t = sum(t.pow(2).sum() for t in target).sqrt()
    return 1 - dot / (norm_c * norm_t).clamp_min(1e-12)


DISTANCES: dict[str, Callable[..., Tensor]] = {"euclidean": euclidean_distance, "cosine": cosine_distance}


def total_variation(images: Tensor) -> Tensor:
    r"""Anisotropic total variation: mean absolute difference of vertical plus horizontal neighbours.

    The image prior of Inverting Gradients (Geiping et al., 2020, Eq. 4; ``inversefed.metrics.total_variation``).

    Example:
        >>> total_variation(torch.tensor([[[[0.0, 1.0], [0.0, 1.0]]]]))
        tensor(1.)
    """
    dy = (images[..., 1:, :] - images[..., :-1, :]).abs().mean()
    dx = (images[..., :, 1:] - images[..., :, :-1]).abs().mean()
    return dx + dy


class TotalVariation:
    """Total-variation regulariser :math:`\\alpha\\,TV(x)` (Geiping et al., 2020, Eq. 4).

    Args:
        weight: :math:`\\alpha`, must be >= 0.
    """

    def __init__(self, weight: float) -> None:
        if weight < 0:
            raise ValueError(f"TotalVariation(weight={weight}) must be >= 0.")
        self.weight = weight

    def __call__(self, images: Tensor) -> Tensor:
        return self.weight * total_variation(images)

    def __repr__(self) -> str:
        return f"TotalVariation(weight={self.weight})"


def initial_images(shape: Sequence[int], *, init: InitName, generator: torch.Generator) -> Tensor:
    """Starting candidates of ``shape`` ``(R, B, C, H, W)``.

    ``randn``: N(0, 1), the DLG and inversefed choice. ``rand``: U(0, 1). ``patterned``: a 4x4 U(0, 1) patch per
    restart, image and channel tiled over the image, the "patterned random seed" of CPL (Wei et al., ESORICS 2020)
    that Fed-CDP's attack uses (spec_001_004 B9; Inferred: 4x4 patch).

    Example:
        >>> initial_images((2, 1, 1, 8, 8), init="patterned", generator=torch.Generator().manual_seed(0)).shape
        torch.Size([2, 1, 1, 8, 8])
    """
    if init == "randn":
        return torch.randn(*shape, generator=generator)
    if init == "rand":
        return torch.rand(*shape, generator=generator)
    if init == "patterned":
        *lead, height, width = shape
        patch = torch.rand(*lead, 4, 4, generator=generator)
        return patch.repeat(*([1] * len(lead)), -(-height // 4), -(-width // 4))[..., :height, :width]
    raise ValueError(f"init={init!r} is unknown; use 'randn', 'rand' or 'patterned'.")


def leaked_batch_size(view: ServerView) -> int:
    """How many private images stand behind ``view``, from its public metadata.

    A gradient: ``batch_size``. An update of T local steps: ``batch_size * T`` capped at ``num_samples`` (T steps
    over n samples revisit them, as local epochs do). The aggregate: that times ``num_clients``.

    Raises:
        ValueError: when ``batch_size`` is missing from the metadata.
    """
    meta = view.metadata
    if not meta.get("batch_size"):
        raise ValueError(f"the {view.leak_point!r} view has no metadata['batch_size']; an attack needs it.")
    count = int(meta["batch_size"]) * int(meta.get("num_clients") or 1)
    if view.kind == "update":
        count *= int(meta.get("local_steps") or 1)
        if meta.get("num_samples"):
            count = min(count, int(meta["num_samples"]))
    return count


@dataclass(frozen=True)
class MatchingTarget:
    """What the attack matches, derived from a :class:`ServerView` (public information only).

    Args:
        names: matched parameter names, in model order.
        tensors: the target pseudo-gradient per name (the gradient, or ``-update / lr``), on the device of the
            matched parameters and in their dtype promoted to at least float32.
        local_steps: local SGD steps to simulate (1 for a gradient).
        lr: the client's learning rate (``None`` for a gradient).
        data_per_step: candidate images used per simulated step.
        num_images: candidate images to reconstruct.
    """

    names: tuple[str, ...]
    tensors: tuple[Tensor, ...]
    local_steps: int
    lr: float | None
    data_per_step: int
    num_images: int


def matching_target(view: ServerView, *, layers: Sequence[str] | None = None) -> MatchingTarget:
    """Turn the intercepted tensors into a pseudo-gradient target over the matched parameters.

    Args:
        view: what the server holds.
        layers: ``fnmatch`` patterns of parameter names to match (DPFL's partial-layer study); ``None``: all
            intercepted parameters.

    Raises:
        ValueError: when no parameter is left to match or an update lacks ``lr``/``local_steps``.
    """
    names = tuple(
        n
        for n, _ in view.model.named_parameters()
        if n in view.tensors and (layers is None or any(fnmatch.fnmatch(n, pattern) for pattern in layers))
    )
    if not names:
        raise ValueError(
            f"no parameter of {type(view.model).__name__} is both intercepted and selected by layers={layers}; "
            f"intercepted: {sorted(view.tensors)[:5]}..."
        )
    num_images = leaked_batch_size(view)
    reference = dict(view.model.named_parameters())[names[0]]
    device, dtype = reference.device, torch.promote_types(reference.dtype, torch.float32)
    if view.kind == "gradient":
        tensors = tuple(view.tensors[n].detach().to(device, dtype) for n in names)
        return MatchingTarget(names, tensors, 1, None, num_images, num_images)
    meta = view.metadata
    lr, steps = meta.get("lr"), int(meta.get("local_steps") or 0)
    if not lr or steps < 1:
        raise ValueError(
            f"attacking an update needs the client's metadata['lr'] and metadata['local_steps'], got lr={lr}, "
            f"local_steps={meta.get('local_steps')}."
        )
    optimizer = str(meta.get("optimizer", "sgd")).lower()
    if optimizer != "sgd":
        warnings.warn(
            f"the attacked update came from a {optimizer!r} optimiser but the attack simulates plain SGD steps; "
            "train the attacked clients with SGD (model.optimizer: sgd) or attack leak_point='local_gradient'.",
            stacklevel=3,
        )
    tensors = tuple(-view.tensors[n].detach().to(device, dtype) / lr for n in names)
    data_per_step = int(meta["batch_size"]) * int(meta.get("num_clients") or 1)
    return MatchingTarget(names, tensors, steps, float(lr), min(data_per_step, num_images), num_images)


def _over_restarts(
    objective: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], *, restarts: int
) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """``objective`` mapped over the leading restart dimension: ``vmap`` for several, a plain call for one."""
    if restarts > 1:
        return vmap(objective)

    def single(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        total, gap = objective(x[0], y[0])
        return total[None], gap[None]

    return single


class _Recovery:
    """Each L-BFGS restart's best iterate, and what happens to a restart the optimiser has lost.

    L-BFGS without a line search (DLG's setting) scales its first quasi-Newton step by :math:`s^T y / y^T y`, which
    is huge where the gradient barely changed along the first short step: the step throws the candidate so far
    that the sigmoid network saturates, every gradient becomes exactly zero and no later iteration can leave
    (measured: pixels at 5e5 after the second step, gap flat ever after). Later, an unguarded step can also
    diverge after real progress. A restart is lost when its relative gradient distance is not finite, rose above
    ``blow_up`` times its best, or it stalled: its gradient vanished, or it did not move in an iteration (torch's
    tolerances stop a row whose directional derivative is tiny). A lost restart whose best distance came below
    ``near`` goes back to its best iterate; the others (a saturated start's best is the saturated point itself,
    at 0.6-0.9) are re-drawn from the attack's seeded generator; either way its L-BFGS history is cleared.
    """

    near, blow_up = 0.1, 1e4

    def __init__(self, variables: list[Tensor], *, vanished: float) -> None:
        self.vanished = vanished  # L-BFGS's tolerance_grad
        self.best = torch.full((len(variables[0]),), torch.inf, device=variables[0].device)
        self.previous = self.best.clone()
        self.best_variables = [v.detach().clone() for v in variables]

    def keep(self, rows: Tensor) -> _Recovery:
        """The record of ``rows`` only (after ``keep_best_after``)."""
        self.best, self.best_variables = self.best[rows], [b[rows] for b in self.best_variables]
        self.previous = self.previous[rows]
        return self

    def record(self, relative: Tensor, variables: list[Tensor]) -> None:
        """Note the iterate ``variables`` (before this iteration's step) where its distance ``relative`` is a best."""
        improved = relative < self.best
        self.best = torch.where(improved, relative, self.best)
        for best, v in zip(self.best_variables, variables, strict=True):
            best.copy_(torch.where(improved.view(-1, *[1] * (v.dim() - 1)), v.detach(), best))

    def recover(
        self,
        relative: Tensor,
        grads: Sequence[Tensor],
        variables: list[Tensor],
        redraw: Callable[[int], list[Tensor]],
        reset: Callable[[Tensor], None],
    ) -> None:
        """After the step: move every lost restart back to its best iterate or to a fresh start."""
        vanished = torch.stack([g.flatten(1).abs().amax(1) for g in grads]).amax(0) <= self.vanished
        stalled = vanished | (relative == self.previous)
        lost = ~relative.isfinite() | (relative > self.blow_up * self.best) | stalled
        self.previous = relative
        if not bool(lost.any()):
            return
        back = lost & (self.best <= self.near)
        fresh = lost & ~back
        with torch.no_grad():
            for v, best in zip(variables, self.best_variables, strict=True):
                v[back] = best[back]
            if bool(fresh.any()):
                for v, start in zip(variables, redraw(int(fresh.sum())), strict=True):
                    v[fresh] = start
        self.best = torch.where(fresh, torch.inf, self.best)
        reset(lost)


@dataclass(frozen=True)
class MatchingState:
    """One iteration of :meth:`GradientMatchingAttack.iterate`, for every restart at once.

    Args:
        iteration: 0-based iteration (one objective evaluation).
        losses: objective of each restart ``(R,)`` at the iterate before this iteration's update.
        images: current candidates ``(R, B, C, H, W)`` after the update (before it, on the stopping iteration).
        labels: current labels ``(R, B)``.
        relative_gaps: each restart's gradient distance divided by the distance of an all-zero candidate
            gradient (``sum ||g||^2`` for the Euclidean distance, 1 for the cosine one), ``(R,)``.
        converged: true on the last state when a restart reached ``stop_below``.
        restart_ids: which of the original restarts each row is, ``(R,)`` (rows shrink to one after
            ``keep_best_after``).
    """

    iteration: int
    losses: Tensor
    images: Tensor
    labels: Tensor
    relative_gaps: Tensor
    converged: bool
    restart_ids: Tensor


@dataclass(frozen=True)
class MatchingProblem:
    """The optimisation behind :meth:`GradientMatchingAttack.iterate`, for every restart at once.

    Args:
        objective: ``(images, label_input) -> (objective, gradient distance)``, each ``(R,)``: the batched
            per-restart objective (gradient distance plus regularisers).
        images: starting candidates ``(R, B, C, H, W)``, a leaf that requires grad.
        label_input: soft-label logits ``(R, B, K)`` (optimised) or one-hot inferred labels.
        variables: what the optimiser updates: ``[images]`` or ``[images, label_input]``.
        gap_scale: the gradient distance of an all-zero candidate gradient, which makes a distance relative.
        single: ``objective`` for one remaining restart ``(1, ...)`` without ``vmap``.
        redraw: ``count -> fresh starts of variables``: new random values for each of ``variables``, ``(count, ...)``,
            from the same seeded generator as the first starts.
        stop_below: the early-stop threshold on the relative gradient distance for this batch (``None``: no stop).
        max_iterations: the iteration budget for this batch.
    """

    objective: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
    images: Tensor
    label_input: Tensor
    variables: list[Tensor]
    gap_scale: float
    single: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
    redraw: Callable[[int], list[Tensor]]
    stop_below: float | None
    max_iterations: int


class GradientMatchingAttack(GradientAttack):
    """Optimise candidate images (and labels) so that their simulated gradient matches the intercepted one.

    Args:
        distance: ``"euclidean"`` (DLG) or ``"cosine"`` (Inverting Gradients); see :data:`DISTANCES`.
        optimizer: ``"lbfgs"`` (:class:`BatchedLBFGS`, no line search) or ``"adam"``.
        lr: optimiser step size.
        max_iterations: objective evaluations per restart; ``"auto"``: :data:`SINGLE_MAX_ITERATIONS` for one image,
            :data:`BATCH_MAX_ITERATIONS` for a batch (B > 1), see :meth:`batch_settings`.
        restarts: independent random starts, run as one batched computation; the one with the smallest final
            gradient distance wins.
        labels: ``"optimise"`` soft labels jointly (DLG) or ``"infer"`` them analytically first (iDLG).
        label_strategy: the rule of :func:`~lightning_fl.attacks.labels.infer_labels` when ``labels="infer"``.
        init: starting images, see :func:`initial_images`.
        tv_weight: weight of the total-variation prior (0 disables); ``"auto"``: 0 for one image and
            :data:`BATCH_TV_WEIGHT` for a batch (B > 1 images per gradient, read from the view), see
            :meth:`batch_settings`.
        signed: step on the sign of the image gradient (Geiping et al.'s adversarial-attack trick).
        boxed: project the images onto [0, 1] after every step.
        lr_decay: multiply the step size by 0.1 at 3/8, 5/8 and 7/8 of ``max_iterations``.
        layers: ``fnmatch`` patterns of the parameter names to match; ``None`` matches every intercepted one.
        stop_below: stop as soon as one restart's relative gradient distance (see :class:`MatchingState`) is at
            most this, and keep that restart; ``None`` always runs ``max_iterations``; ``"auto"``:
            :data:`SINGLE_STOP_BELOW` for one image, ``None`` for a batch (B > 1).
        keep_best_after: with L-BFGS and several restarts, continue only the restart with the smallest gradient
            distance after this many iterations (a stalled start shows within ~100 iterations; one restart then
            costs what one run does); ``None`` runs every restart to the end.
        recover_stalled: with L-BFGS, re-draw a restart whose network saturated (gradient exactly zero far from a
            solution) and send one that diverged after progress back to its best iterate (see ``_Recovery``).
        progress_bar: show a rich progress bar.
        seed: seed of the starting images and labels.

    Raises:
        ValueError: on an unknown choice or a non-positive count, naming the argument.
    """

    name = "gradient_matching"

    def __init__(
        self,
        *,
        distance: DistanceName = "euclidean",
        optimizer: OptimizerName = "lbfgs",
        lr: float = 1.0,
        max_iterations: int = 300,
        restarts: int = 1,
        labels: LabelMode = "optimise",
        label_strategy: LabelStrategy = "idlg",
        init: InitName = "randn",
        tv_weight: float | Auto = 0.0,
        signed: bool = False,
        boxed: bool = False,
        lr_decay: bool = False,
        layers: Sequence[str] | None = None,
        stop_below: float | Auto | None = None,
        keep_best_after: int | None = None,
        recover_stalled: bool = False,
        progress_bar: bool = True,
        seed: int = 0,
    ) -> None:
        choices = {"distance": (distance, DISTANCES), "optimizer": (optimizer, ("lbfgs", "adam"))}
        choices |= {"labels": (labels, ("optimise", "infer")), "init": (init, ("randn", "rand", "patterned"))}
        choices |= {"label_strategy": (label_strategy, LABEL_STRATEGIES)}
        for field, (value, allowed) in choices.items():
            if value not in allowed:
                raise ValueError(f"{type(self).__name__}({field}={value!r}) is unknown; use one of {sorted(allowed)}.")
        for field, value in {"lr": lr, "max_iterations": max_iterations, "restarts": restarts}.items():
            if value != "auto" and value <= 0:
                raise ValueError(f"{type(self).__name__}({field}={value}) must be > 0.")
        if stop_below not in (None, "auto") and stop_below <= 0:
            raise ValueError(f"{type(self).__name__}(stop_below={stop_below}) must be > 0, None or 'auto'.")
        if tv_weight != "auto" and tv_weight < 0:
            raise ValueError(f"{type(self).__name__}(tv_weight={tv_weight}) must be >= 0 or 'auto'.")
        if keep_best_after is not None and (keep_best_after < 1 or optimizer != "lbfgs"):
            raise ValueError(
                f"{type(self).__name__}(keep_best_after={keep_best_after}) needs optimizer='lbfgs' and a value >= 1."
            )
        if recover_stalled and optimizer != "lbfgs":
            raise ValueError(f"{type(self).__name__}(recover_stalled=True) needs optimizer='lbfgs'.")
        self.stop_below, self.keep_best_after, self.recover_stalled = stop_below, keep_best_after, recover_stalled
        self.distance, self.optimizer, self.lr = distance, optimizer, lr
        self.max_iterations, self.restarts = max_iterations, restarts
        self.labels, self.label_strategy, self.init = labels, label_strategy, init
        self.tv_weight = tv_weight
        self.signed, self.boxed, self.lr_decay = signed, boxed, lr_decay
        self.layers = list(layers) if layers is not None else None
        self.progress_bar, self.seed = progress_bar, seed

    def batch_settings(self, batch_size: int, *, images: bool = True) -> BatchSettings:
        """The total-variation weight, early-stop threshold and iteration budget used when each (simulated) gradient
        is of ``batch_size`` inputs: explicit values as given, ``"auto"`` ones resolved by the batch size (one input:
        no prior, stop at :data:`SINGLE_STOP_BELOW`, :data:`SINGLE_MAX_ITERATIONS`: the paper's objective; B > 1:
        the prior :data:`BATCH_TV_WEIGHT`, no stop, :data:`BATCH_MAX_ITERATIONS`; measured in docs/attacks.md,
        "Batch recovery"). An update of T steps of one image each counts as B = 1 (not measured as a batch).
        ``images=False`` (the view's ``metadata["inputs"] == "features"``, e.g. the private output recovered at
        FDL-PP's cut) never gets the prior: total variation is an image prior, and on two feature maps it cost
        15 dB (48.8 -> 33.9 dB, ``configs/model_inversion_fdlpp_digits.yaml``).

        Example:
            >>> attack = GradientMatchingAttack(tv_weight="auto", stop_below="auto", max_iterations="auto")
            >>> attack.batch_settings(1)
            BatchSettings(tv_weight=0.0, stop_below=3e-08, max_iterations=3000)
            >>> attack.batch_settings(8), attack.batch_settings(8, images=False).tv_weight
            (BatchSettings(tv_weight=0.001, stop_below=None, max_iterations=6000), 0.0)
        """
        batch = batch_size > 1
        auto_tv = BATCH_TV_WEIGHT if batch and images else 0.0
        auto_iterations = BATCH_MAX_ITERATIONS if batch else SINGLE_MAX_ITERATIONS
        return BatchSettings(
            tv_weight=auto_tv if self.tv_weight == "auto" else float(self.tv_weight),
            stop_below=(None if batch else SINGLE_STOP_BELOW) if self.stop_below == "auto" else self.stop_below,
            max_iterations=auto_iterations if self.max_iterations == "auto" else int(self.max_iterations),
        )

    def _known_labels(self, view: ServerView, target: MatchingTarget, num_classes: int) -> Tensor:
        weight = last_layer_weight_name(view.model, num_classes=num_classes)
        if weight not in target.names:
            raise ValueError(f"labels='infer' needs the classifier weight {weight!r} among the matched layers.")
        gradient = target.tensors[target.names.index(weight)]
        return infer_labels(gradient, num_images=target.num_images, strategy=self.label_strategy)

    def problem(self, view: ServerView) -> MatchingProblem:
        """Set up the optimisation for ``view``: starting variables on the attacked model's device, and the
        objective of all restarts (what :meth:`iterate` evaluates and differentiates once per iteration)."""
        target = matching_target(view, layers=self.layers)
        num_classes = int(view.metadata.get("num_classes") or 0)
        if num_classes < 1:
            raise ValueError("the view has no metadata['num_classes']; an attack needs it.")
        model = copy.deepcopy(view.model)
        if model.training:  # batch statistics without running-stat writes (vmap-safe); eval mode uses the running ones
            replace_all_batch_norm_modules_(model)
        names = set(target.names)
        params = {n: p.detach() for n, p in model.named_parameters() if n in names}
        frozen = {n: p.detach() for n, p in model.named_parameters() if n not in names}
        frozen |= {n: b.detach() for n, b in model.named_buffers()}
        input_shape = tuple(view.metadata.get("input_shape") or view.tensors[target.names[0]].shape[1:])
        device, dtype = target.tensors[0].device, target.tensors[0].dtype
        generator = torch.Generator().manual_seed(self.seed)  # CPU draws, then moved: seed-identical on any device
        shape = (self.restarts, target.num_images, *input_shape)
        images = initial_images(shape, init=self.init, generator=generator).to(device, dtype).requires_grad_()
        label_shape = (target.num_images, num_classes)

        def redraw(count: int) -> list[Tensor]:
            fresh = [initial_images((count, *shape[1:]), init=self.init, generator=generator)]
            if self.labels == "optimise":
                fresh.append(torch.randn(count, *label_shape, generator=generator))
            return [f.to(device, dtype) for f in fresh]

        if self.labels == "infer":
            labels = self._label_orders(self._known_labels(view, target, num_classes).cpu(), target, generator)
            label_input, to_probabilities = F.one_hot(labels, num_classes).to(device, dtype), _identity
            variables = [images]
        else:
            label_input = torch.randn(self.restarts, *label_shape, generator=generator)
            label_input = label_input.to(device, dtype)
            to_probabilities = partial(torch.softmax, dim=-1)
            variables = [images, label_input.requires_grad_()]
        distance = DISTANCES[self.distance]
        settings = self.batch_settings(target.data_per_step, images=view.metadata.get("inputs", "images") == "images")
        regularisers = [TotalVariation(settings.tv_weight)] if settings.tv_weight > 0 else []

        def objective(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
            candidate = simulated_pseudo_gradient(
                model,
                params,
                frozen,
                x,
                to_probabilities(y),
                local_steps=target.local_steps,
                lr=target.lr,
                data_per_step=target.data_per_step,
            )
            gap = distance(candidate=[candidate[n] for n in target.names], target=target.tensors)
            return gap + sum(r(x) for r in regularisers), gap

        gap_scale = float(sum(t.pow(2).sum() for t in target.tensors)) if self.distance == "euclidean" else 1.0
        batched, single = _over_restarts(objective, restarts=self.restarts), _over_restarts(objective, restarts=1)
        return MatchingProblem(
            batched,
            images,
            label_input,
            variables,
            max(gap_scale, 1e-30),
            single,
            redraw,
            settings.stop_below,
            settings.max_iterations,
        )

    def iterate(self, view: ServerView, *, problem: MatchingProblem | None = None) -> Iterator[MatchingState]:
        """Run the optimisation, yielding the state of all restarts after every iteration.

        :meth:`reconstruct` consumes this; benchmarks and notebooks can watch or stop it early. The states'
        tensors live on the attacked model's device. ``problem``: ``self.problem(view)`` made beforehand (to read
        its iteration budget first); made here when ``None``.
        """
        problem = problem if problem is not None else self.problem(view)
        images, label_input, variables = problem.images, problem.label_input, problem.variables
        objective = problem.objective
        # a victim that already predicts its image with p ~ 1 leaks a gradient so small (sum ||g||^2 = 4e-5 measured)
        # that the plain distance sits below L-BFGS's absolute tolerances (torch's) from the start: the optimiser
        # then sees the distance relative to sum ||g||^2 (unchanged when that is >= 1, the usual case)
        unit = min(problem.gap_scale, 1.0)
        step, keep, reset = self._stepper(variables, problem.max_iterations)
        ids, relative = torch.arange(self.restarts), torch.zeros(self.restarts)
        recovery = _Recovery(variables, vanished=1e-7) if self.recover_stalled else None
        for iteration in range(problem.max_iterations):
            if iteration == self.keep_best_after and len(ids) > 1:
                best = int(relative.nan_to_num(torch.inf).argmin())
                rows = torch.tensor([best], device=images.device)
                ids, optimised = ids[best : best + 1], len(variables) == 2
                images = images.detach()[rows].requires_grad_()
                label_input = label_input.detach()[rows].requires_grad_(optimised)
                variables = [images, label_input] if optimised else [images]
                objective = problem.single
                step = keep(rows, variables)
                recovery = recovery.keep(rows) if recovery is not None else None
            losses, gaps = objective(images, label_input)
            relative = gaps.detach() / problem.gap_scale
            if problem.stop_below is not None and bool((relative <= problem.stop_below).any()):
                labels = label_input.detach().argmax(-1)
                yield MatchingState(iteration, losses.detach(), images.detach(), labels, relative, True, ids)
                return
            grads = torch.autograd.grad(losses.sum() / unit, variables)
            if recovery is not None:
                recovery.record(relative, variables)
            step(grads)
            if recovery is not None:
                recovery.recover(relative, grads, variables, problem.redraw, reset)
            labels = label_input.detach().argmax(-1)
            yield MatchingState(iteration, losses.detach(), images.detach(), labels, relative, False, ids)

    def _label_orders(self, labels: Tensor, target: MatchingTarget, generator: torch.Generator) -> Tensor:
        """Inferred labels per restart ``(R, B)``.

        Inferred: in a multi-step update the assignment of the inferred label multiset to local steps is unknown
        (the gradient of one step is symmetric in its batch, the steps are not), so restart 0 keeps the inferred
        order, restart 1 reverses it and later restarts draw random permutations; the best restart picks the
        assignment.
        """
        count = len(labels)
        orders = [torch.arange(count)]
        if target.local_steps > 1:
            orders.append(torch.arange(count).flip(0))
            orders += [torch.randperm(count, generator=generator) for _ in range(self.restarts - 2)]
        else:
            orders *= self.restarts
        orders = orders[: self.restarts]
        return labels[torch.stack(orders)]

    def _stepper(
        self, variables: list[Tensor], max_iterations: int
    ) -> tuple[Step, Callable[[Tensor, list[Tensor]], Step], Callable[[Tensor], None]]:
        """The update rule: a function taking the gradients of ``variables`` and updating them in place, and (for
        L-BFGS) ``keep(rows, new_variables)``, which drops all other restarts and returns the rule for the rest,
        and ``reset(mask)``, which clears the history of the masked restarts."""
        if self.optimizer == "lbfgs":
            lbfgs = BatchedLBFGS(num_rows=self.restarts, lr=self.lr)

            def keep(rows: Tensor, kept: list[Tensor]) -> Step:
                lbfgs.keep(rows)
                return self._lbfgs_step(lbfgs, kept)

            return self._lbfgs_step(lbfgs, variables), keep, lbfgs.reset
        images = variables[0]
        adam = torch.optim.Adam(variables, lr=self.lr)
        third = max_iterations / 8
        milestones = [int(3 * third), int(5 * third), int(7 * third)] if self.lr_decay else []
        schedule = torch.optim.lr_scheduler.MultiStepLR(adam, milestones=milestones, gamma=0.1)

        def adam_step(grads: Sequence[Tensor]) -> None:
            for v, g in zip(variables, grads, strict=True):
                v.grad = g
            if self.signed:
                images.grad.sign_()
            adam.step()
            schedule.step()
            if self.boxed:
                with torch.no_grad():
                    images.clamp_(0, 1)

        def no_keep(rows: Tensor, kept: list[Tensor]) -> Step:
            raise ValueError("keep_best_after needs optimizer='lbfgs'.")

        def no_reset(rows: Tensor) -> None:
            raise ValueError("recover_stalled needs optimizer='lbfgs'.")

        return adam_step, no_keep, no_reset

    def _lbfgs_step(self, lbfgs: BatchedLBFGS, variables: list[Tensor]) -> Step:
        images = variables[0]

        def lbfgs_step(grads: Sequence[Tensor]) -> None:
            update = lbfgs.step(torch.cat([g.reshape(lbfgs.num_rows, -1) for g in grads], 1))
            with torch.no_grad():
                offset = 0
                for v in variables:
                    size = v[0].numel()
                    v.add_(update[:, offset : offset + size].reshape(v.shape))
                    offset += size
                if self.boxed:
                    images.clamp_(0, 1)

        return lbfgs_step

    def reconstruct(self, view: ServerView, *, callback: IterationCallback | None = None) -> Reconstruction:
        """Reconstruct the private batch behind ``view``; the restart with the smallest final objective wins (on an
        early stop, the restart whose relative gradient distance reached ``stop_below``).

        The attack runs on the attacked model's device; the returned images and labels are on the CPU.
        """
        start = time.perf_counter()
        history: list[tuple[Tensor, Tensor]] = []
        state: MatchingState | None = None
        with Progress(disable=not self.progress_bar, transient=True) as progress:
            problem = self.problem(view)
            task = progress.add_task(f"{self.name} attack", total=problem.max_iterations)
            for state in self.iterate(view, problem=problem):
                history.append((state.losses.cpu(), state.restart_ids))
                if callback is not None:
                    callback(state.iteration, float(state.losses.nan_to_num(torch.inf).min()))
                progress.advance(task)
        assert state is not None  # max_iterations > 0 is checked in __init__
        deciding = state.relative_gaps if state.converged else state.losses
        best = int(deciding.nan_to_num(torch.inf).argmin())
        winner = int(state.restart_ids[best])
        loss_history = [float(losses[int((ids == winner).nonzero()[0])]) for losses, ids in history]
        return Reconstruction(
            images=state.images[best].nan_to_num(0.5).clamp(0, 1).cpu(),
            labels=state.labels[best].cpu().clone(),
            loss_history=loss_history,
            info={
                "restarts": self.restarts,
                "best_restart": winner,
                "iterations": len(history),
                "final_loss": loss_history[-1],
                "relative_gap": float(state.relative_gaps[best]),
                "converged": state.converged,
                "seconds": time.perf_counter() - start,
            },
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(distance={self.distance!r}, optimizer={self.optimizer!r}, lr={self.lr}, "
            f"max_iterations={self.max_iterations!r}, restarts={self.restarts}, labels={self.labels!r}, "
            f"init={self.init!r}, stop_below={self.stop_below!r}, tv_weight={self.tv_weight!r})"
        )
