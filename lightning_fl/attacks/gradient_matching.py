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
import inspect
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from rich.progress import Progress
from torch import Tensor, nn
from torch.func import replace_all_batch_norm_modules_

from lightning_fl.attacks.base import GradientAttack, IterationCallback, Reconstruction
from lightning_fl.attacks.batch_norm import (
    BN_STATISTICS,
    BatchNormStatisticsName,
    batch_norm_distance,
    batch_norm_layer_names,
    batch_norm_prior,
    batch_norm_statistics,
    batch_norm_step_weights,
)
from lightning_fl.attacks.batch_settings import (
    BATCH_MAX_ITERATIONS,
    BATCH_TV_WEIGHT,
    SINGLE_MAX_ITERATIONS,
    SINGLE_STOP_BELOW,
    Auto,
    BatchSettings,
    resolve_batch_settings,
)
from lightning_fl.attacks.distances import DISTANCES, DistanceName, cosine_distance, euclidean_distance
from lightning_fl.attacks.initialisation import INITS, InitName, initial_images
from lightning_fl.attacks.labels import LABEL_STRATEGIES, LabelStrategy, last_layer_weight_name
from lightning_fl.attacks.local_update import simulated_pseudo_gradient
from lightning_fl.attacks.matching_labels import restart_label_orders, target_label_sets
from lightning_fl.attacks.matching_problem import MatchingProblem, MatchingState, over_restarts
from lightning_fl.attacks.metrics import match_reconstructions
from lightning_fl.attacks.priors import TotalVariation, total_variation
from lightning_fl.attacks.restart_recovery import RestartRecovery
from lightning_fl.attacks.steppers import OPTIMIZERS, OptimizerName, make_stepper
from lightning_fl.attacks.targets import MatchingTarget, leaked_batch_size, matching_target
from lightning_fl.messages import ServerView
from lightning_fl.presets import Preset

__all__ = [
    "BATCH_MAX_ITERATIONS",
    "BATCH_TV_WEIGHT",
    "DISTANCES",
    "SINGLE_MAX_ITERATIONS",
    "SINGLE_STOP_BELOW",
    "Auto",
    "BatchSettings",
    "DistanceName",
    "GradientMatchingAttack",
    "InitName",
    "LabelMode",
    "MatchingProblem",
    "MatchingState",
    "MatchingTarget",
    "OptimizerName",
    "TotalVariation",
    "cosine_distance",
    "euclidean_distance",
    "initial_images",
    "leaked_batch_size",
    "matching_target",
    "restart_consensus",
    "total_variation",
]

LabelMode = Literal["optimise", "infer", "auto"]


def _identity(x: Tensor) -> Tensor:
    return x


class GradientMatchingAttack(GradientAttack):
    """Optimise candidate images (and labels) so that their simulated gradient matches the intercepted one.

    A paper's attack is a subclass that declares a :class:`~lightning_fl.presets.Preset` (``preset``: the settings
    the paper fixes and the arguments it offers, with the paper's values) instead of a constructor of its own; its
    ``__init__`` is made from that declaration and calls :meth:`_configure`.

    Args:
        distance: ``"euclidean"`` (DLG) or ``"cosine"`` (Inverting Gradients); see :data:`DISTANCES`.
        optimizer: ``"lbfgs"`` (:class:`BatchedLBFGS`, no line search) or ``"adam"``.
        lr: optimiser step size.
        max_iterations: objective evaluations per restart; ``"auto"``: :data:`SINGLE_MAX_ITERATIONS` for one image,
            :data:`BATCH_MAX_ITERATIONS` for a batch (B > 1), see :meth:`batch_settings`.
        restarts: independent random starts, run as one batched computation; the one with the smallest final
            gradient distance wins (or, with ``consensus``, all of them are averaged).
        labels: ``"optimise"`` soft labels jointly (DLG) or ``"infer"`` them analytically first (iDLG); ``"auto"``:
            optimise them for one image per gradient, infer them for a batch (see :meth:`label_mode`).
        label_strategy: the rule of :func:`~lightning_fl.attacks.labels.infer_labels` when ``labels="infer"``.
        init: starting images, see :func:`initial_images`.
        tv_weight: weight of the total-variation prior (0 disables); ``"auto"``: 0 for one image and
            :data:`BATCH_TV_WEIGHT` for a batch (B > 1 images per gradient, read from the view), see
            :meth:`batch_settings`.
        signed: step on the sign of the image gradient (Geiping et al.'s adversarial-attack trick).
        boxed: project the images onto [0, 1] after every step.
        lr_decay: multiply the step size by 0.1 at 3/8, 5/8 and 7/8 of ``max_iterations``.
        layers: ``fnmatch`` patterns of the parameter names to match; ``None`` matches every intercepted one.
        bn_statistics: which BatchNorm statistics the attacker knows (the threat-model axis of Huang et al., 2021;
            see :mod:`~lightning_fl.attacks.batch_norm`): ``"none"``, ``"running"`` (the broadcast model's),
            ``"leaked"`` (the batches' own, read off an update's buffers) or ``"auto"`` (leaked where the view
            holds them, else none).
        bn_weight: weight of the BatchNorm prior :math:`R_{BN}` against those statistics (0 disables).
        stop_below: stop as soon as one restart's relative gradient distance (see :class:`MatchingState`) is at
            most this, and keep that restart; ``None`` always runs ``max_iterations``; ``"auto"``:
            :data:`SINGLE_STOP_BELOW` for one image, ``None`` for a batch (B > 1).
        keep_best_after: with L-BFGS and several restarts, continue only the restart with the smallest gradient
            distance after this many iterations (a stalled start shows within ~100 iterations; one restart then
            costs what one run does); ``None`` runs every restart to the end.
        settle_labels_after: with fixed labels that differ between restarts (the assignments of inferred labels to
            the local steps of a multi-step update, :func:`restart_label_orders`), after this many iterations every
            restart takes the labels of the restart with the smallest objective so far: those that had others
            start again from fresh images (their unknowns from the first guess), and the optimiser and its step
            decay start again for the remaining iterations, so that every restart (and the consensus) works on the
            chosen assignment. Not in the papers: a search over the assignments before the attack proper. ``None``
            keeps each restart on its own assignment; with labels shared by every restart it changes nothing.
        recover_stalled: with L-BFGS, re-draw a restart whose network saturated (gradient exactly zero far from a
            solution) and send one that diverged after progress back to its best iterate (see
            :class:`~lightning_fl.attacks.restart_recovery.RestartRecovery`).
        consensus: return the mean of every restart's best iterate (the group consensus :math:`E(x_g)` of Yin et
            al., CVPR 2021, Eq. 10-11) instead of the best restart's: each restart ends in its own local optimum, and
            the mean averages their independent errors out. Each restart's batch is first put in the best
            restart's order (:func:`~lightning_fl.attacks.metrics.match_reconstructions`, standing in for the
            paper's image registration); the labels are the best restart's. Restarts given other fixed labels than
            the best one's (another assignment of labels to local steps, :func:`restart_label_orders`) stay out of
            the mean.
        progress_bar: show a rich progress bar.
        seed: seed of the starting images and labels.

    Raises:
        ValueError: on an unknown choice or a non-positive count, naming the argument.
    """

    name = "gradient_matching"
    preset: ClassVar[Preset | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("preset") is not None:
            engine = inspect.get_annotations(GradientMatchingAttack.__init__, eval_str=True)
            own = inspect.get_annotations(cls._configure, eval_str=True)
            cls.__init__ = cls.preset.constructor(cls._configure, owner=cls, types={**own, **engine})

    def __init__(
        self,
        *,
        distance: DistanceName = "euclidean",
        optimizer: OptimizerName = "lbfgs",
        lr: float = 1.0,
        max_iterations: int | Auto = 300,
        restarts: int = 1,
        labels: LabelMode = "optimise",
        label_strategy: LabelStrategy = "bias_count",
        init: InitName = "randn",
        tv_weight: float | Auto = 0.0,
        signed: bool = False,
        boxed: bool = False,
        lr_decay: bool = False,
        layers: Sequence[str] | None = None,
        bn_statistics: BatchNormStatisticsName = "none",
        bn_weight: float = 0.0,
        stop_below: float | Auto | None = None,
        keep_best_after: int | None = None,
        settle_labels_after: int | None = None,
        recover_stalled: bool = False,
        consensus: bool = False,
        progress_bar: bool = True,
        seed: int = 0,
    ) -> None:
        choices = {"distance": (distance, DISTANCES), "optimizer": (optimizer, OPTIMIZERS)}
        choices |= {"labels": (labels, ("optimise", "infer", "auto")), "init": (init, INITS)}
        choices |= {"label_strategy": (label_strategy, LABEL_STRATEGIES)}
        choices |= {"bn_statistics": (bn_statistics, BN_STATISTICS)}
        for field, (value, allowed) in choices.items():
            if value not in allowed:
                raise ValueError(f"{type(self).__name__}({field}={value!r}) is unknown; use one of {sorted(allowed)}.")
        for field, value in {"lr": lr, "max_iterations": max_iterations, "restarts": restarts}.items():
            if value != "auto" and value <= 0:
                raise ValueError(f"{type(self).__name__}({field}={value}) must be > 0.")
        if stop_below not in (None, "auto") and stop_below <= 0:
            raise ValueError(f"{type(self).__name__}(stop_below={stop_below}) must be > 0, None or 'auto'.")
        if bn_weight < 0:
            raise ValueError(f"{type(self).__name__}(bn_weight={bn_weight}) must be >= 0.")
        if tv_weight != "auto" and tv_weight < 0:
            raise ValueError(f"{type(self).__name__}(tv_weight={tv_weight}) must be >= 0 or 'auto'.")
        if keep_best_after is not None and (keep_best_after < 1 or optimizer != "lbfgs"):
            raise ValueError(
                f"{type(self).__name__}(keep_best_after={keep_best_after}) needs optimizer='lbfgs' and a value >= 1."
            )
        if settle_labels_after is not None and (
            settle_labels_after < 1
            or keep_best_after is not None
            or (max_iterations != "auto" and settle_labels_after >= max_iterations)
        ):
            raise ValueError(
                f"{type(self).__name__}(settle_labels_after={settle_labels_after}) must be >= 1, below "
                f"max_iterations={max_iterations} and not combined with keep_best_after."
            )
        if recover_stalled and optimizer != "lbfgs":
            raise ValueError(f"{type(self).__name__}(recover_stalled=True) needs optimizer='lbfgs'.")
        self.consensus = consensus
        self.stop_below, self.keep_best_after, self.recover_stalled = stop_below, keep_best_after, recover_stalled
        self.settle_labels_after = settle_labels_after
        self.distance, self.optimizer, self.lr = distance, optimizer, lr
        self.max_iterations, self.restarts = max_iterations, restarts
        self.labels, self.label_strategy, self.init = labels, label_strategy, init
        self.tv_weight, self.bn_statistics, self.bn_weight = tv_weight, bn_statistics, bn_weight
        self.signed, self.boxed, self.lr_decay = signed, boxed, lr_decay
        self.layers = list(layers) if layers is not None else None
        self.progress_bar, self.seed = progress_bar, seed

    def _configure(self, **settings: Any) -> None:
        """Set a preset up from its settings (the paper's, with the user's over them). A preset with options that
        are not engine arguments takes them out here, keyword-only and typed in its override's signature, checks
        and keeps them, and passes the rest on."""
        GradientMatchingAttack.__init__(self, **settings)

    def batch_settings(self, batch_size: int, *, images: bool = True) -> BatchSettings:
        """The total-variation weight, early-stop threshold and iteration budget used when each (simulated) gradient
        is of ``batch_size`` inputs (see :func:`~lightning_fl.attacks.batch_settings.resolve_batch_settings`);
        ``images=False`` when the view's ``metadata["inputs"] == "features"``.

        Example:
            >>> attack = GradientMatchingAttack(tv_weight="auto", stop_below="auto", max_iterations="auto")
            >>> attack.batch_settings(1)
            BatchSettings(tv_weight=0.0, stop_below=3e-08, max_iterations=3000)
            >>> attack.batch_settings(8), attack.batch_settings(8, images=False).tv_weight
            (BatchSettings(tv_weight=0.001, stop_below=None, max_iterations=6000), 0.0)
        """
        return resolve_batch_settings(
            tv_weight=self.tv_weight,
            stop_below=self.stop_below,
            max_iterations=self.max_iterations,
            batch_size=batch_size,
            images=images,
        )

    def label_mode(self, batch_size: int) -> Literal["optimise", "infer"]:
        """How labels are handled when each (simulated) gradient is of ``batch_size`` inputs: ``labels`` as given, or
        for ``"auto"`` DLG's joint soft labels for one input and the analytic ``label_strategy`` for a batch.

        Example:
            >>> attack = GradientMatchingAttack(labels="auto")
            >>> attack.label_mode(1), attack.label_mode(8)
            ('optimise', 'infer')
        """
        if self.labels == "auto":
            return "infer" if batch_size > 1 else "optimise"
        return self.labels

    def check_model(self, model: nn.Module, *, num_classes: int) -> None:
        """Refuse, before any work, a model this attack cannot simulate, naming the layer.

        A dropout layer with ``p > 0`` makes every simulated gradient random (the attack matches a deterministic
        function of the candidate images); inferred labels need a classifier layer (the last 2-D parameter with
        ``num_classes`` rows, :func:`~lightning_fl.attacks.labels.last_layer_weight_name`).

        Raises:
            ValueError: naming the dropout layer, or saying that no classifier layer was found and what to set.

        Example:
            >>> net = nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.5))
            >>> GradientMatchingAttack().check_model(net, num_classes=3)  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            ValueError: the attack cannot simulate layer '1' (Dropout(p=0.5, inplace=False)): a random mask ...
        """
        for name, module in model.named_modules():
            if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
                raise ValueError(
                    f"the attack cannot simulate layer {name!r} ({module}): a random mask in every forward pass makes "
                    "the client's gradient a random function of its images; set its p to 0 or attack a model "
                    "without it."
                )
        if self.labels != "optimise":
            last_layer_weight_name(model, num_classes=num_classes)

    def problem(self, view: ServerView) -> MatchingProblem:
        """Set up the optimisation for ``view``: starting variables on the attacked model's device, and the
        objective of all restarts (what :meth:`iterate` evaluates and differentiates once per iteration)."""
        target = self.target(view)
        num_classes = int(view.metadata.get("num_classes") or 0)
        if num_classes < 1:
            raise ValueError("the view has no metadata['num_classes']; an attack needs it.")
        model = copy.deepcopy(view.model)
        norm_names = batch_norm_layer_names(model)
        if model.training:  # batch statistics without running-stat writes (vmap-safe); eval mode uses the running ones
            replace_all_batch_norm_modules_(model)
        unknown = self.unknowns(model)
        if unknown and self.optimizer != "adam":  # Adam is element-wise, so each restart's unknowns step alone
            raise ValueError(f"{type(self).__name__}(optimizer={self.optimizer!r}) with unknowns needs 'adam'.")
        names = set(target.names)
        params = {n: p.detach() for n, p in model.named_parameters() if n in names}
        frozen = {n: p.detach() for n, p in model.named_parameters() if n not in names}
        frozen |= {n: b.detach() for n, b in model.named_buffers()}
        frozen = {n: t for n, t in frozen.items() if n not in unknown}
        input_shape = tuple(view.metadata.get("input_shape") or view.tensors[target.names[0]].shape[1:])
        device, dtype = target.tensors[0].device, target.tensors[0].dtype
        generator = torch.Generator().manual_seed(self.seed)  # CPU draws, then moved: seed-identical on any device
        shape = (self.restarts, target.num_images, *input_shape)
        images = initial_images(shape, init=self.init, generator=generator).to(device, dtype).requires_grad_()
        label_shape = (target.num_images, num_classes)
        label_mode = self.label_mode(target.data_per_step)

        def redraw(count: int) -> list[Tensor]:
            fresh = [initial_images((count, *shape[1:]), init=self.init, generator=generator)]
            if label_mode == "optimise":
                fresh.append(torch.randn(count, *label_shape, generator=generator))
            fresh += [u.expand(count, *u.shape) for u in unknown.values()]  # the unknowns' guess is their start
            return [f.to(device, dtype) for f in fresh]

        if label_mode == "infer":
            known = target_label_sets(
                view.model,
                target,
                num_classes=num_classes,
                input_shape=input_shape,
                strategy=self.label_strategy,
                seed=self.seed,
                limit=self.restarts,
            )
            labels = restart_label_orders(
                known.cpu(),
                local_steps=target.local_steps,
                restarts=self.restarts,
                generator=generator,
                data_per_step=target.data_per_step,
            )
            label_input, to_probabilities = F.one_hot(labels, num_classes).to(device, dtype), _identity
            variables = [images]
        else:
            label_input = torch.randn(self.restarts, *label_shape, generator=generator)
            label_input = label_input.to(device, dtype)
            to_probabilities = partial(torch.softmax, dim=-1)
            variables = [images, label_input.requires_grad_()]
        shifts = {n: u.expand(self.restarts, *u.shape).clone().requires_grad_() for n, u in unknown.items()}
        variables += list(shifts.values())
        distance = self.gradient_distance()
        settings = self.batch_settings(target.data_per_step, images=view.metadata.get("inputs", "images") == "images")
        regularisers = [TotalVariation(settings.tv_weight)] if settings.tv_weight > 0 else []
        statistics = batch_norm_statistics(view, self.bn_statistics) if self.bn_weight > 0 else None
        correction = 0 if self.bn_statistics == "running" else 1
        # in train mode the simulated steps' own forward passes feed the BatchNorm prior, each step's batch weighted
        # as the running buffers weight it (the separate prior model runs in train mode, so only then is it the same)
        fused = statistics is not None and model.training
        norms = [model.get_submodule(name) for name in norm_names] if fused else []
        step_weights = batch_norm_step_weights(view.model, target.local_steps) if fused else None
        if statistics is not None and not fused:
            prior = batch_norm_prior(view.model, statistics, correction=correction)
            regularisers.append(lambda x: self.bn_weight * prior(x))

        def objective(x: Tensor, y: Tensor, guess: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
            candidate, step_inputs = simulated_pseudo_gradient(
                model,
                params,
                frozen | guess,
                x,
                to_probabilities(y),
                local_steps=target.local_steps,
                lr=target.lr,
                data_per_step=target.data_per_step,
                modules=norms,
            )
            penalty = (
                self.bn_weight
                * batch_norm_distance(step_inputs, statistics, correction=correction, step_weights=step_weights)
                if fused
                else 0.0
            )
            matched = [candidate[n] for n in target.names]
            if target.masks is not None:
                matched = [c * m for c, m in zip(matched, target.masks, strict=True)]
            gap = distance(candidate=matched, target=target.tensors)
            return gap + penalty + sum(r(x) for r in regularisers), gap

        gap_scale = float(distance(candidate=[t.new_zeros(()) for t in target.tensors], target=target.tensors))
        batched = over_restarts(objective, restarts=self.restarts, unknowns=shifts)
        single = over_restarts(objective, restarts=1, unknowns=shifts)  # after keep_best_after: L-BFGS, no unknowns
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

    def gradient_distance(self) -> Callable[..., Tensor]:
        """The data term ``(candidate=..., target=...) -> distance``: :data:`DISTANCES` of ``distance`` (an adaptive
        attack may model the defence's noise with another)."""
        return DISTANCES[self.distance]

    def target(self, view: ServerView) -> MatchingTarget:
        """What :meth:`problem` matches: the view's tensors over ``layers`` (an adaptive attack narrows it)."""
        return matching_target(view, layers=self.layers)

    def unknowns(self, model: torch.nn.Module) -> dict[str, Tensor]:
        """The starting values of tensors optimised jointly with the images, keyed by their state-dict name in
        ``model`` (the attack's own copy, which the hook may reparametrise): an adaptive attack's guess of a client's
        private tensors, of which each restart optimises its own copy; none here."""
        return {}

    def iterate(self, view: ServerView, *, problem: MatchingProblem | None = None) -> Iterator[MatchingState]:
        """Run the optimisation, yielding the state of all restarts after every iteration.

        :meth:`reconstruct` consumes this; benchmarks and notebooks can watch or stop it early. The states'
        tensors live on the attacked model's device. ``problem``: ``self.problem(view)`` made beforehand (to read
        its iteration budget first); made here when ``None``.
        """
        problem = problem if problem is not None else self.problem(view)
        images, label_input, variables = problem.images, problem.label_input, problem.variables
        objective = problem.objective
        # a victim that already predicts its image with p ~ 1 leaks a gradient so small that the plain distance sits
        # below L-BFGS's absolute tolerances (torch's) from the start: the optimiser then sees the distance relative
        # to sum ||g||^2 (unchanged when that is >= 1, the usual case)
        unit = min(problem.gap_scale, 1.0)
        stepper = partial(
            make_stepper,
            optimizer=self.optimizer,
            lr=self.lr,
            signed=self.signed,
            boxed=self.boxed,
            lr_decay=self.lr_decay,
        )
        step, keep, reset = stepper(variables, max_iterations=problem.max_iterations)
        ids, relative = torch.arange(self.restarts), torch.zeros(self.restarts)
        best = _BestIterates(images, label_input)
        recovery = RestartRecovery(variables, vanished=1e-7) if self.recover_stalled else None
        for iteration in range(problem.max_iterations):
            if iteration == self.keep_best_after and len(ids) > 1:
                kept = int(relative.nan_to_num(torch.inf).argmin())
                rows = torch.tensor([kept], device=images.device)
                ids, optimised = ids[kept : kept + 1], len(variables) == 2
                images = images.detach()[rows].requires_grad_()
                label_input = label_input.detach()[rows].requires_grad_(optimised)
                variables = [images, label_input] if optimised else [images]
                objective = problem.single
                step = keep(rows, variables)
                recovery = recovery.keep(rows) if recovery is not None else None
                best.keep(rows)
            if iteration == self.settle_labels_after and not label_input.requires_grad:
                settled = _settle_labels(label_input, variables, best, problem.redraw)
                if settled is not None:
                    label_input = settled
                    step, keep, reset = stepper(variables, max_iterations=problem.max_iterations - iteration)
            losses, gaps = objective(images, label_input)
            relative = gaps.detach() / problem.gap_scale
            labels = label_input.detach().argmax(-1)
            best.update(losses.detach(), images.detach(), labels)
            if problem.stop_below is not None and bool((relative <= problem.stop_below).any()):
                yield best.state(iteration, losses.detach(), images.detach(), labels, relative, True, ids)
                return
            grads = torch.autograd.grad(losses.sum() / unit, variables)
            if recovery is not None:
                recovery.record(relative, variables)
            step(grads)
            if recovery is not None:
                recovery.recover(relative, grads, variables, problem.redraw, reset)
            labels = label_input.detach().argmax(-1)
            yield best.state(iteration, losses.detach(), images.detach(), labels, relative, False, ids)

    def reconstruct(self, view: ServerView, *, callback: IterationCallback | None = None) -> Reconstruction:
        """Reconstruct the private batch behind ``view``: each restart's iterate of smallest objective, of the
        restart whose is smallest, or with ``consensus`` their mean (on an early stop, the restart whose relative
        gradient distance reached ``stop_below``, at that iterate).

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
        if state.converged:
            best = int(state.relative_gaps.nan_to_num(torch.inf).argmin())
            images, labels = state.images[best], state.labels[best]
        else:
            best = int(state.best_losses.nan_to_num(torch.inf).argmin())
            images, labels = state.best_images[best], state.best_labels[best]
            if self.consensus:  # restarts given other fixed labels (a multi-step order) solved another problem
                fixed = not problem.label_input.requires_grad
                among = (state.best_labels == state.best_labels[best]).all(-1) if fixed else None
                images = restart_consensus(state.best_images, best=best, among=among)
        winner = int(state.restart_ids[best])
        loss_history = [float(losses[int((ids == winner).nonzero()[0])]) for losses, ids in history]
        return Reconstruction(
            images=images.nan_to_num(0.5).clamp(0, 1).cpu(),
            labels=labels.cpu().clone(),
            loss_history=loss_history,
            info={
                "restarts": self.restarts,
                "best_restart": winner,
                "output": "consensus" if self.consensus and not state.converged else "best restart",
                "iterations": len(history),
                "final_loss": loss_history[-1],
                "best_loss": float(state.best_losses[best]),
                "relative_gap": float(state.relative_gaps[best]),
                "converged": state.converged,
                "seconds": time.perf_counter() - start,
            },
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(distance={self.distance!r}, optimizer={self.optimizer!r}, lr={self.lr}, "
            f"max_iterations={self.max_iterations!r}, restarts={self.restarts}, labels={self.labels!r}, "
            f"init={self.init!r}, stop_below={self.stop_below!r}, tv_weight={self.tv_weight!r}, "
            f"bn_statistics={self.bn_statistics!r}, bn_weight={self.bn_weight}, consensus={self.consensus})"
        )


def restart_consensus(images: Tensor, *, best: int, among: Tensor | None = None) -> Tensor:
    """The mean over restarts of ``images`` ``(R, B, ...)`` (clamped to [0, 1]), each restart's batch first put in
    the order of restart ``best``'s (its images matched to restart ``best``'s by the Hungarian algorithm: a batch's
    order is arbitrary in each restart); ``among``: which restarts enter the mean (``(R,)`` bool, ``best``'s
    included), default all.

    Example:
        >>> a, b = torch.zeros(1, 4), torch.ones(1, 4)
        >>> restart_consensus(torch.stack([torch.cat([a, b]), torch.cat([b, a])]), best=0)
        tensor([[0., 0., 0., 0.],
                [1., 1., 1., 1.]])
    """
    images = images.nan_to_num(0.5).clamp(0, 1)
    aligned = []
    for candidate in images if among is None else images[among]:
        rows, cols = match_reconstructions(candidate, images[best])
        aligned.append(candidate[rows[cols.argsort()]])
    return torch.stack(aligned).mean(0)


def _settle_labels(
    label_input: Tensor, variables: list[Tensor], best: _BestIterates, redraw: Callable[[int], list[Tensor]]
) -> Tensor | None:
    """Every restart's fixed labels ``(R, B, K)`` set to those of the restart of smallest objective so far; the
    ``variables`` (images, then any unknowns) of the restarts that had other labels re-drawn in place and their
    record restarted. ``None`` (nothing changed) when every restart already has the winner's labels."""
    labels = label_input.argmax(-1)
    winner = int(best.losses.nan_to_num(torch.inf).argmin())
    other = (labels != labels[winner]).any(-1)
    if not bool(other.any()):
        return None
    with torch.no_grad():
        for variable, start in zip(variables, redraw(int(other.sum())), strict=True):
            variable[other] = start
    best.forget(other)
    return label_input[winner].expand_as(label_input).clone()


class _BestIterates:
    """Each restart's smallest objective so far and the candidates that reached it (what
    :meth:`GradientMatchingAttack.reconstruct` returns)."""

    def __init__(self, images: Tensor, label_input: Tensor) -> None:
        self.losses = images.new_full((images.shape[0],), torch.inf)
        self.images, self.labels = images.detach().clone(), label_input.detach().argmax(-1)

    def update(self, losses: Tensor, images: Tensor, labels: Tensor) -> None:
        """Keep, per restart, ``images``/``labels`` where ``losses`` (evaluated at them) is a new minimum."""
        better = losses < self.losses  # NaN never is
        self.losses = torch.where(better, losses, self.losses)
        self.images = torch.where(better.view(-1, *[1] * (images.dim() - 1)), images, self.images)
        self.labels = torch.where(better.view(-1, *[1] * (labels.dim() - 1)), labels, self.labels)

    def keep(self, rows: Tensor) -> None:
        """Only the restarts at ``rows`` from now on."""
        self.losses, self.images, self.labels = self.losses[rows], self.images[rows], self.labels[rows]

    def forget(self, rows: Tensor) -> None:
        """Start the record of the restarts at ``rows`` (a bool mask) again."""
        self.losses = self.losses.masked_fill(rows, torch.inf)

    def state(self, *fields: object) -> MatchingState:
        """A :class:`MatchingState` of ``fields`` (its leading fields, in order) with these best iterates."""
        return MatchingState(*fields, self.losses, self.images, self.labels)
