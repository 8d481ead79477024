"""Model-inversion attacks: FDL-PP's colluding-client inversion and the MI-Face class inversion of 2DP-FL.

Both optimise an input in [0, 1] against a model the attacker holds (:func:`descend_inputs`); they differ in what
they match and where the target comes from, so they are two attacks:

- :class:`ColludingClientInversion` (FDL-PP, Gu et al., Eq. 3): the server and one curious client collude. The
  server recovers the victim's *private-model output* at the private/public cut from the public-layer gradient
  (DLG at the cut layer), and inverts the colluder's own private layers to map that output back to an image.
- :class:`MIFace` (2DP-FL, Xiong et al., Sec. B.6, citing Fredrikson et al. 2015): a class-level inversion
  :math:`x^* = \\arg\\min_x 1 - F_y(x)` of a white-box model: the global model (passive attack) or the victim's
  local model rebuilt from its intercepted update (active attack).

References:
    Gu et al., "A novel approach to simultaneously improve privacy, efficiency and reliability of federated DNN
    learning" (FDL-PP). Xiong et al., "Privacy Threat and Defense for Federated Learning with Non-i.i.d. Data in
    AIoT" (2DP-FL). Fredrikson, Jha, Ristenpart, CCS 2015, https://doi.org/10.1145/2810103.2813677.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from rich.progress import Progress
from torch import Tensor, nn

from lightning_fl.attacks.base import GradientAttack, IterationCallback, Reconstruction
from lightning_fl.attacks.dlg import DLGAttack
from lightning_fl.attacks.gradient_matching import GradientMatchingAttack, MatchingState
from lightning_fl.messages import ServerView
from lightning_fl.private import load_state_into, private_modules, public_state

__all__ = ["ColludingClientInversion", "MIFace", "descend_inputs", "forward_to_cut", "private_cut"]


def descend_inputs(
    inputs: Tensor,
    *,
    cost: Callable[[Tensor], Tensor],
    optimizer: torch.optim.Optimizer,
    iterations: int,
    patience: int | None = None,
    stop_below: float | None = None,
    callback: IterationCallback | None = None,
    progress_bar: bool = False,
    description: str = "inversion",
) -> list[float]:
    """Minimise ``cost(inputs)`` over ``inputs`` projected onto [0, 1] after each step; returns the cost history.

    The input-space descent of model inversion (Fredrikson et al., 2015, Algorithm 1): a step of ``optimizer``
    on the cost's gradient, then the projection onto the valid pixel box.

    Args:
        inputs: leaf tensor (``requires_grad``) in [0, 1], updated in place; ``optimizer`` must own it.
        cost: scalar objective of the inputs.
        optimizer: the update rule (plain SGD for MI-Face's gradient descent, Adam for FDL-PP's inversion).
        iterations: maximum number of steps.
        patience: stop when the cost has not improved for this many steps (Fredrikson's :math:`\\beta`).
        stop_below: stop once the cost is at most this value (Fredrikson's :math:`\\gamma`).
        callback: called as ``callback(iteration, cost)`` after every step.
        progress_bar: show a rich progress bar.
        description: label of the progress bar.

    Example:
        >>> x = torch.zeros(3, requires_grad=True)
        >>> history = descend_inputs(x, cost=lambda v: (v - 2).pow(2).sum(), optimizer=torch.optim.SGD([x], lr=0.1),
        ...                          iterations=100)
        >>> x.detach()  # the optimum 2 lies outside the box, the projection keeps x at 1
        tensor([1., 1., 1.])
    """
    history: list[float] = []
    best, since_best = float("inf"), 0
    with Progress(disable=not progress_bar, transient=True) as progress:
        task = progress.add_task(description, total=iterations)
        for iteration in range(iterations):
            optimizer.zero_grad()
            loss = cost(inputs)
            loss.backward(inputs=[inputs])
            optimizer.step()
            with torch.no_grad():
                inputs.clamp_(0, 1)
            history.append(loss.item())
            if callback is not None:
                callback(iteration, history[-1])
            progress.advance(task)
            best, since_best = (history[-1], 0) if history[-1] < best else (best, since_best + 1)
            if (stop_below is not None and history[-1] <= stop_below) or (patience and since_best >= patience):
                break
    return history


# -- the private/public cut -------------------------------------------------------------------------------------------
def private_cut(model: nn.Module, *, input_shape: Sequence[int]) -> nn.Module:
    """The last private module that runs in ``model``'s forward pass: its output is the private-model output.

    FDL-PP (Sec. 3) makes the first layers private; everything after the cut is public. The cut is found by running
    one zero input of ``input_shape`` ``(C, H, W)`` and recording the private modules in call order.

    Raises:
        ValueError: when ``model`` has no private module, its private modules do not run, or it is not split into
            private layers first and public ones after (FedKL's key-lock layers, interleaved with public
            convolutions and returning ``(output, key)``, are not an FDL-PP split: the attack does not apply).

    Example:
        >>> from lightning_fl.private import mark_private
        >>> net = nn.Sequential(mark_private(nn.Conv2d(1, 2, 3)), mark_private(nn.Sigmoid()), nn.Flatten())
        >>> private_cut(net, input_shape=(1, 4, 4))
        Sigmoid()
    """
    calls: list[nn.Module] = []
    modules = [m for _, m in private_modules(model)]
    if not modules:
        raise ValueError(
            f"{type(model).__name__} has no private module; mark its leading layers private with "
            "lightning_fl.private.mark_private (FDL-PP's private/public split)."
        )
    inside = {id(sub) for m in modules for sub in m.modules()}
    public = [m for m in model.modules() if id(m) not in inside and any(True for _ in m.parameters(recurse=False))]
    outputs: dict[int, object] = {}

    def record(module: nn.Module, _args: object, out: object) -> None:
        calls.append(module)
        outputs[id(module)] = out

    handles = [m.register_forward_hook(record) for m in (*modules, *public)]
    try:
        with torch.no_grad():
            model(_zeros_like_input(model, (1, *input_shape)))
    finally:
        for handle in handles:
            handle.remove()
    private_ids = {id(m) for m in modules}
    ran = [i for i, m in enumerate(calls) if id(m) in private_ids]
    if not ran:
        raise ValueError(f"none of the private modules of {type(model).__name__} runs in its forward pass.")
    cut = calls[ran[-1]]
    early = [type(m).__name__ for m in calls[: ran[-1]] if id(m) not in private_ids]
    if early:
        raise ValueError(
            f"{type(model).__name__} is not split as FDL-PP splits it (private layers first, then public ones): "
            f"public {early} run before its last private module {type(cut).__name__}."
        )
    if not isinstance(outputs[id(cut)], Tensor):
        raise ValueError(f"{type(model).__name__}'s last private module {type(cut).__name__} does not output a tensor.")
    return cut


def _zeros_like_input(model: nn.Module, shape: Sequence[int]) -> Tensor:
    """Zeros of ``shape`` on the device and in the dtype of ``model``'s first parameter."""
    reference = next(model.parameters())
    return torch.zeros(*shape, device=reference.device, dtype=reference.dtype)


class _CutReached(Exception):
    def __init__(self, output: Tensor) -> None:
        super().__init__("forward stopped at the private/public cut")
        self.output = output


def forward_to_cut(model: nn.Module, cut: nn.Module, inputs: Tensor) -> Tensor:
    """Run ``model`` on ``inputs`` only up to ``cut`` and return the cut's output (the private-model output).

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 3), nn.Sigmoid(), nn.Linear(3, 1))
        >>> forward_to_cut(net, net[1], torch.zeros(1, 2)).shape
        torch.Size([1, 3])
    """

    def stop(_module: nn.Module, _args: object, output: Tensor) -> None:
        raise _CutReached(output)

    handle = cut.register_forward_hook(stop)
    try:
        model(inputs)
    except _CutReached as reached:
        return reached.output
    finally:
        handle.remove()
    raise RuntimeError(f"the cut module {type(cut).__name__} did not run in the forward pass.")


class _InjectedOutput(nn.Module):
    """Stands in for the cut module and returns whatever private output was injected last."""

    def __init__(self) -> None:
        super().__init__()
        self.value: Tensor | None = None

    def forward(self, *_args: object) -> Tensor:
        assert self.value is not None, "the private output is injected by _PublicModel.forward"
        return self.value


class _PublicModel(nn.Module):
    """A copy of ``model`` whose private output is an input: the public layers as a function of the features.

    The cut module is replaced by :class:`_InjectedOutput`; the gradients of this module's parameters are the
    public-layer gradients the server intercepts. The private modules before the cut still run on a zero input
    and their output is ignored, so this works for any model whose leading layers are private.
    """

    def __init__(self, model: nn.Module, cut: nn.Module, input_shape: Sequence[int]) -> None:
        super().__init__()
        cut_name = next(name for name, module in model.named_modules() if module is cut)
        parent_name, _, child_name = cut_name.rpartition(".")
        self.model, self.input_shape, self.injected = copy.deepcopy(model), tuple(input_shape), _InjectedOutput()
        setattr(self.model.get_submodule(parent_name), child_name, self.injected)

    def forward(self, features: Tensor) -> Tensor:
        self.injected.value = features
        try:
            return self.model(features.new_zeros(features.shape[0], *self.input_shape))
        finally:
            self.injected.value = None


def _public_view(view: ServerView, cut: nn.Module, feature_shape: Sequence[int]) -> ServerView:
    """The public-layer gradient as a view on :class:`_PublicModel`, whose input is the private output."""
    wrapper = _PublicModel(view.model, cut, view.metadata["input_shape"])
    public = public_state(view.model)
    tensors = {f"model.{name}": tensor for name, tensor in view.tensors.items() if name in public}
    metadata = {**view.metadata, "input_shape": tuple(feature_shape), "inputs": "features"}
    return ServerView(view.leak_point, wrapper, tensors, view.kind, metadata)


# -- FDL-PP: colluding-client inversion --------------------------------------------------------------------------------
class ColludingClientInversion(GradientAttack):
    """FDL-PP's black-box model inversion by a server colluding with one client (Gu et al., Sec. 2.2, Eq. 3).

    Stage 1 recovers the victim's private-model output :math:`O_{prt}` from the public-layer gradient: DLG with the
    private output as the unknown input of the public layers. Stage 2 inverts the colluder's own private model
    :math:`F` (the target model of Eq. 3):

    .. math:: x'^* = \\arg\\min_{x'} \\|F(x') - O_{prt}\\|^2

    with Adam on :math:`x' \\in [0, 1]`. Works on any model whose leading layers are marked private
    (:func:`~lightning_fl.private.mark_private`): passports, FDL-PP's split, or a plain split.

    Inferred: the two-stage reading, DLG's optimiser for stage 1, and Adam lr 1e-2 for 2000 steps
    from U(0, 1) for stage 2; the paper gives no hyper-parameters. The "initial model" of Sec. 3.2 is read as the
    colluder's private model kept fixed.

    Args:
        colluder_private: the colluding client's private tensors, keyed like the model's state dict (e.g.
            ``loop.clients[k].private``); ``None`` uses the private modules of ``view.model`` (the server's own
            initialisation, which every FDL-PP/splitfed client starts from).
        feature_attack: the stage-1 gradient-matching attack on the public layers; default DLG (L-BFGS, 1200
            iterations, 4 batched restarts as some seeds stall) started from U(0, 1) rather than N(0, 1): a private
            output after a sigmoid or ReLU is non-negative, and from N(0, 1) L-BFGS diverged in our runs (cosine
            0.94 vs 1.00 to the true output).
        iterations: stage-2 Adam steps.
        lr: stage-2 Adam learning rate.
        seed: seed of the stage-2 starting image.
        progress_bar: show rich progress bars.

    Raises:
        ValueError: for a non-positive ``iterations`` or ``lr``.
    """

    name = "colluding_mi"

    def __init__(
        self,
        *,
        colluder_private: dict[str, Tensor] | None = None,
        feature_attack: GradientMatchingAttack | None = None,
        iterations: int = 2000,
        lr: float = 1e-2,
        seed: int = 0,
        progress_bar: bool = True,
    ) -> None:
        if iterations <= 0 or lr <= 0:
            raise ValueError(f"ColludingClientInversion(iterations={iterations}, lr={lr}): both must be > 0.")
        self.colluder_private = colluder_private
        self.feature_attack = feature_attack or DLGAttack(init="rand", restarts=4, progress_bar=progress_bar)
        self.iterations, self.lr, self.seed, self.progress_bar = iterations, lr, seed, progress_bar

    def recover_private_output(self, view: ServerView) -> tuple[Tensor, Tensor]:
        """Stage 1: the victim's private-model output at the cut and the soft-label argmax, from the public gradient.

        Returns:
            ``(features, labels)``: the recovered private output ``(B, *feature_shape)`` and labels ``(B,)``.
        """
        input_shape = tuple(view.metadata["input_shape"])
        cut = private_cut(view.model, input_shape=input_shape)
        feature_shape = forward_to_cut(view.model, cut, _zeros_like_input(view.model, (1, *input_shape))).shape[1:]
        public_view = _public_view(view, cut, feature_shape)
        final: MatchingState | None = None
        with Progress(disable=not self.progress_bar, transient=True) as progress:
            problem = self.feature_attack.problem(public_view)
            task = progress.add_task("colluding MI: private output", total=problem.max_iterations)
            for state in self.feature_attack.iterate(public_view, problem=problem):
                progress.advance(task)
                final = state
        assert final is not None  # the feature attack checks max_iterations > 0
        best = int(final.losses.nan_to_num(torch.inf).argmin())
        return final.images[best].detach(), final.labels[best].clone()

    def invert_private_model(
        self,
        model: nn.Module,
        features: Tensor,
        *,
        input_shape: Sequence[int],
        callback: IterationCallback | None = None,
    ) -> tuple[Tensor, list[float]]:
        """Stage 2 (Eq. 3): images of ``input_shape`` whose private output under ``model`` is ``features``.

        Args:
            model: the target model :math:`F`, holding the colluder's private layers (see :meth:`colluder_model`).
            features: :math:`O_{prt}`, the recovered private output ``(B, *feature_shape)``.
            input_shape: ``(C, H, W)`` of the images.
            callback: called as ``callback(iteration, distance)``.

        Returns:
            ``(images, history)``: images in [0, 1] on ``features``' device and the per-step feature distance.
        """
        cut = private_cut(model, input_shape=input_shape)
        generator = torch.Generator().manual_seed(self.seed)  # CPU draw, then moved: seed-identical on any device
        images = torch.rand(features.shape[0], *input_shape, generator=generator)
        images = images.to(features.device, features.dtype).requires_grad_()
        history = descend_inputs(
            images,
            cost=lambda x: (forward_to_cut(model, cut, x) - features).pow(2).sum(),
            optimizer=torch.optim.Adam([images], lr=self.lr),
            iterations=self.iterations,
            callback=callback,
            progress_bar=self.progress_bar,
            description="colluding MI: inverting the private layers",
        )
        return images.detach(), history

    def colluder_model(self, view: ServerView) -> nn.Module:
        """The attacker's model: a copy of ``view.model`` with the colluder's private tensors loaded."""
        model = copy.deepcopy(view.model)
        if self.colluder_private is not None:
            load_state_into(model, self.colluder_private)
        return model

    def reconstruct(self, view: ServerView, *, callback: IterationCallback | None = None) -> Reconstruction:
        """Recover the private output from the public gradient, then invert the colluder's private layers.

        Both stages run on the attacked model's device; the returned images and labels are on the CPU.
        """
        start = time.perf_counter()
        features, labels = self.recover_private_output(view)
        images, history = self.invert_private_model(
            self.colluder_model(view), features, input_shape=view.metadata["input_shape"], callback=callback
        )
        return Reconstruction(
            images=images.cpu(),
            labels=labels.cpu(),
            loss_history=history,
            info={"feature_shape": str(tuple(features.shape[1:])), "seconds": time.perf_counter() - start},
        )


# -- 2DP-FL: MI-Face class inversion -----------------------------------------------------------------------------------
class MIFace(GradientAttack):
    """Class-level model inversion (MI-Face, Fredrikson et al. 2015) as 2DP-FL evaluates it (Xiong et al., Sec. B.6).

    For each target class :math:`y`, gradient descent on :math:`c(x) = 1 - F_y(x; w)` from :math:`x_0 = 0`, with
    :math:`x \\leftarrow \\mathrm{clip}_{[0,1]}(x - \\lambda \\nabla_x c(x))`, stopping after ``iterations`` steps,
    when the summed cost has not improved for ``patience`` steps, or once the mean :math:`c \\le` ``stop_below``.
    The inverted model :math:`w` is what the view holds: the model itself for a gradient view (passive attack on
    the global model) or the model plus the intercepted update (active attack on the victim's local model
    :math:`w_t^k`, or the next global model at the aggregate).

    The passive and active attacks of 2DP-FL are this one algorithm on different models, and FDL-PP's colluding
    inversion (:class:`ColludingClientInversion`) matches a recovered feature instead of a class score, hence two
    classes. Inferred (ART's ``MIFace``): :math:`\\lambda = 0.1`, :math:`\\beta = 100`,
    :math:`\\gamma = 0.01` on the cost (confidence 0.99), at most 5000 steps.

    Args:
        target_classes: classes to invert (one image each); ``None``: every class.
        iterations: maximum gradient steps.
        lr: step size :math:`\\lambda`.
        patience: :math:`\\beta`, steps without improvement before stopping.
        stop_below: :math:`\\gamma`, the mean cost over the target classes at which to stop.
        progress_bar: show a rich progress bar.

    Raises:
        ValueError: for a non-positive ``iterations``, ``lr`` or ``patience``.
    """

    name = "mi_face"

    def __init__(
        self,
        *,
        target_classes: Sequence[int] | None = None,
        iterations: int = 5000,
        lr: float = 0.1,
        patience: int = 100,
        stop_below: float = 0.01,
        progress_bar: bool = True,
    ) -> None:
        for field_name, value in (("iterations", iterations), ("lr", lr), ("patience", patience)):
            if value <= 0:
                raise ValueError(f"MIFace({field_name}={value}) must be > 0.")
        self.target_classes = list(target_classes) if target_classes is not None else None
        self.iterations, self.lr, self.patience, self.stop_below = iterations, lr, patience, stop_below
        self.progress_bar = progress_bar

    def reconstruct(self, view: ServerView, *, callback: IterationCallback | None = None) -> Reconstruction:
        """Invert every target class of the model the view holds; labels are the target classes.

        The descent runs on the attacked model's device; the returned images and labels are on the CPU.
        """
        start = time.perf_counter()
        model = copy.deepcopy(view.model).eval()
        if view.kind == "update":
            state = model.state_dict()
            load_state_into(model, {k: state[k] + v.to(state[k].dtype) for k, v in view.tensors.items()})
        num_classes = int(view.metadata.get("num_classes") or 0)
        classes = torch.tensor(self.target_classes if self.target_classes is not None else range(num_classes))
        if classes.numel() == 0 or int(classes.min()) < 0 or int(classes.max()) >= num_classes:
            raise ValueError(
                f"MIFace(target_classes={self.target_classes}) must be classes in [0, {num_classes}) "
                "(metadata['num_classes'])."
            )
        images = _zeros_like_input(model, (len(classes), *view.metadata["input_shape"])).requires_grad_()
        index = classes[:, None].to(images.device)
        history = descend_inputs(
            images,
            cost=lambda x: (1 - F.softmax(model(x), dim=-1).gather(1, index)).sum(),
            optimizer=torch.optim.SGD([images], lr=self.lr),
            iterations=self.iterations,
            patience=self.patience,
            stop_below=self.stop_below * len(classes),
            callback=callback,
            progress_bar=self.progress_bar,
            description="MI-Face inversion",
        )
        return Reconstruction(
            images=images.detach().cpu(),
            labels=classes,
            loss_history=history,
            info={"iterations": len(history), "seconds": time.perf_counter() - start},
        )
