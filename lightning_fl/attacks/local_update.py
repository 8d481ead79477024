"""What a client's training step would send for candidate data: one gradient, or a simulated multi-step update.

Functional (``torch.func``) so the attacks can differentiate through it and ``vmap`` it over restarts. A FedAvg
client update after T local SGD steps is :math:`\\Delta\\theta = \\theta_T - \\theta_0` with
:math:`\\theta_{t+1} = \\theta_t - \\eta \\nabla_\\theta L(x_t, y_t; \\theta_t)`; the attack simulates these steps
on its candidate batch, as breaching's local-update user does (Geiping et al.'s ``FedAvgReconstructor`` too), and
compares *pseudo-gradients* :math:`-\\Delta\\theta / \\eta`, which for T = 1 is exactly the gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad

__all__ = [
    "parameter_gradient",
    "parameter_gradient_and_inputs",
    "simulated_pseudo_gradient",
    "soft_cross_entropy",
    "step_positions",
]


def soft_cross_entropy(logits: Tensor, probabilities: Tensor) -> Tensor:
    r"""Mean cross-entropy against soft labels, :math:`-\frac{1}{B}\sum_b \sum_c y_{b,c} \log \mathrm{softmax}(z_b)_c`.

    DLG's ``cross_entropy_for_onehot`` (Zhu et al., 2019); with one-hot labels it equals ``F.cross_entropy``.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0]])
        >>> soft = soft_cross_entropy(logits, torch.tensor([[1.0, 0.0]]))
        >>> torch.allclose(soft, F.cross_entropy(logits, torch.tensor([0])))
        True
    """
    return torch.mean(torch.sum(-probabilities * F.log_softmax(logits, dim=-1), dim=-1))


def parameter_gradient(
    model: nn.Module, params: dict[str, Tensor], frozen: dict[str, Tensor], images: Tensor, probabilities: Tensor
) -> dict[str, Tensor]:
    """Gradient of the client's loss with respect to ``params`` (other parameters and buffers in ``frozen``).

    Differentiable in ``images`` and ``probabilities`` (create-graph semantics via ``torch.func.grad``).

    Example:
        >>> net = nn.Linear(3, 2)
        >>> params = {k: v.detach() for k, v in net.named_parameters()}
        >>> g = parameter_gradient(net, params, {}, torch.ones(1, 3), torch.tensor([[1.0, 0.0]]))
        >>> sorted(g), g["weight"].shape
        (['bias', 'weight'], torch.Size([2, 3]))
    """
    return parameter_gradient_and_inputs(model, params, frozen, images, probabilities, modules=())[0]


def parameter_gradient_and_inputs(
    model: nn.Module,
    params: dict[str, Tensor],
    frozen: dict[str, Tensor],
    images: Tensor,
    probabilities: Tensor,
    *,
    modules: Sequence[nn.Module],
) -> tuple[dict[str, Tensor], list[Tensor]]:
    """:func:`parameter_gradient` and the inputs that its forward pass fed to each of ``modules`` (submodules of
    ``model``, in call order), both differentiable in ``images``: a prior on a layer's inputs (the BatchNorm prior)
    then costs no second forward pass.

    Example:
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> params = {k: v.detach() for k, v in net.named_parameters()}
        >>> _, (hidden,) = parameter_gradient_and_inputs(
        ...     net, params, {}, torch.ones(1, 3), torch.tensor([[1.0, 0.0]]), modules=[net[2]]
        ... )
        >>> torch.allclose(hidden, net[1](net[0](torch.ones(1, 3))))
        True
    """

    def loss(p: dict[str, Tensor]) -> tuple[Tensor, list[Tensor]]:
        seen: list[Tensor] = []
        hooks = [m.register_forward_pre_hook(lambda _, args: seen.append(args[0])) for m in modules]
        try:
            logits = functional_call(model, {**frozen, **p}, (images,))
        finally:
            for hook in hooks:
                hook.remove()
        return soft_cross_entropy(logits, probabilities), seen

    return grad(loss, has_aux=True)(params)


def step_positions(
    count: int, *, local_steps: int, data_per_step: int, device: torch.device | str = "cpu"
) -> list[Tensor]:
    """Which of ``count`` candidates each simulated local step uses: step t takes ``[t * data_per_step, (t + 1) *
    data_per_step)`` modulo ``count``, so T steps over fewer candidates revisit them like local epochs do.

    Example:
        >>> [p.tolist() for p in step_positions(3, local_steps=2, data_per_step=2)]
        [[0, 1], [2, 0]]
    """
    first = torch.arange(data_per_step, device=device)
    return [(first + step * data_per_step) % count for step in range(local_steps)]


def simulated_pseudo_gradient(
    model: nn.Module,
    params: dict[str, Tensor],
    frozen: dict[str, Tensor],
    images: Tensor,
    probabilities: Tensor,
    *,
    local_steps: int,
    lr: float | None,
    data_per_step: int,
    modules: Sequence[nn.Module] = (),
) -> tuple[dict[str, Tensor], list[list[Tensor]]]:
    r"""Pseudo-gradient :math:`-(\theta_T - \theta_0)/\eta` of ``local_steps`` simulated SGD steps on the candidates,
    and, for each step, the inputs its forward pass fed to each of ``modules`` (``[step][module]``, each step at that
    step's parameters): the BatchNorm prior of a multi-step update matches the statistics of every step's batch
    (:func:`~lightning_fl.attacks.batch_norm.batch_norm_distance`).

    Step t uses the candidates :func:`step_positions` names (breaching's ``_grad_fn_multi_step``). Inferred: the
    client's optimiser is plain SGD with constant step :math:`\eta` (the FedAvg local update); the shuffle order of a
    real client is unknown and not modelled. For ``local_steps=1`` this is :func:`parameter_gradient_and_inputs`.

    Example:
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> params = {k: v.detach() for k, v in net.named_parameters()}
        >>> x, y = torch.ones(2, 3), torch.eye(2)
        >>> one, _ = simulated_pseudo_gradient(net, params, {}, x, y, local_steps=1, lr=0.1, data_per_step=2)
        >>> torch.allclose(one["0.weight"], parameter_gradient(net, params, {}, x, y)["0.weight"])
        True
        >>> _, inputs = simulated_pseudo_gradient(
        ...     net, params, {}, x, y, local_steps=2, lr=0.1, data_per_step=1, modules=[net[2]]
        ... )
        >>> len(inputs), len(inputs[0]), tuple(inputs[1][0].shape)
        (2, 1, (1, 4))
    """
    if local_steps < 1:
        raise ValueError(f"local_steps={local_steps} must be >= 1.")
    if local_steps == 1:
        gradient, inputs = parameter_gradient_and_inputs(model, params, frozen, images, probabilities, modules=modules)
        return gradient, [inputs]
    if lr is None or lr <= 0:
        raise ValueError(f"simulating {local_steps} local steps needs the client's learning rate, got lr={lr}.")
    current, step_inputs = params, []
    positions = step_positions(
        images.shape[0], local_steps=local_steps, data_per_step=data_per_step, device=images.device
    )
    for index in positions:
        gradient, inputs = parameter_gradient_and_inputs(
            model, current, frozen, images[index], probabilities[index], modules=modules
        )
        step_inputs.append(inputs)
        current = {k: current[k] - lr * gradient[k] for k in current}
    return {k: (params[k] - current[k]) / lr for k in params}, step_inputs
