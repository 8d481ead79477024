"""Private/public layer split ("modified splitfed" of FDL-PP): the first layers stay on each client.

Implements the model split of FDL-PP (Gu et al., Sec. 2.1 and 3): the
first layers of the network are private to each client and never aggregated, the rest are averaged by FedAvg.
Step (3) of the paper, "clients download the updated public model and train their first several layers
without modifying the published layers", is :class:`PrivateFineTuning`, a Lightning callback.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn

from lightning_fl.defences.base import Defence, apply_layers
from lightning_fl.private import mark_private, private_modules, stateful_leaves

__all__ = ["PrivateFineTuning", "PrivateSplit", "split_private"]


def split_private(model: nn.Module, *, cut: int | str = 1) -> nn.Module:
    """Mark the first layers of ``model`` private (never uploaded or averaged); returns the model.

    Layers are the leaf modules that hold parameters or buffers, in registration order (the forward order of
    the models in :mod:`lightning_fl.models`). Modules without state (activations, pooling) need no marking.

    Args:
        model: any module.
        cut: where the private part ends. An int ``k`` makes everything before the (k+1)-th convolution
            private (so ``cut=1`` is FDL-PP's "first convolution and activation layers", with the batch norm
            that follows it, if any); a string names the last private module (e.g. ``"backbone.body.2"``).

    Raises:
        ValueError: if ``cut`` is not a positive number of convolutions the model has, or not a module name.

    Example:
        >>> from lightning_fl.models import LeNetDLG
        >>> from lightning_fl.private import private_state
        >>> sorted(private_state(split_private(LeNetDLG(in_channels=1), cut=1)))
        ['body.0.bias', 'body.0.weight']
    """
    leaves = stateful_leaves(model)
    if isinstance(cut, str):
        order = [name for name, _ in model.named_modules()]
        if cut not in order:
            raise ValueError(f"split_private(cut={cut!r}) is not a module of {type(model).__name__}.")
        last = max(i for i, name in enumerate(order) if name == cut or name.startswith(f"{cut}."))
        end = sum(1 for name, _ in leaves if order.index(name) <= last)
    else:
        conv_positions = [i for i, (_, m) in enumerate(leaves) if isinstance(m, nn.Conv2d)]
        if not 1 <= cut <= len(conv_positions):
            raise ValueError(
                f"split_private(cut={cut}) must be between 1 and the model's {len(conv_positions)} convolutions "
                "(or the name of the last private module)."
            )
        end = conv_positions[cut] if cut < len(conv_positions) else _first_linear_after(leaves, conv_positions[-1])
    if not end:
        raise ValueError(f"split_private(cut={cut!r}) leaves no private layer; name a module with parameters.")
    for _, module in leaves[:end]:
        mark_private(module)
    return model


def _first_linear_after(leaves: list[tuple[str, nn.Module]], start: int) -> int:
    return next((i for i in range(start, len(leaves)) if isinstance(leaves[i][1], nn.Linear)), len(leaves))


class PrivateSplit(Defence):
    """The splitfed baseline as a model defence: ``apply_to_model`` calls :func:`split_private`.

    Args:
        cut: number of leading convolutions kept private, or the name of the last private module.
    """

    model_stage = 2  # marks the final leading layers private, after the other model defences

    def __init__(self, cut: int | str = 1) -> None:
        self.cut = cut

    def apply_to_model(self, model: nn.Module) -> nn.Module:
        return apply_layers(split_private, model, self)

    def __repr__(self) -> str:
        return f"PrivateSplit(cut={self.cut!r})"


class PrivateFineTuning(L.Callback):
    """FDL-PP step (3): before local training, train only the private layers on the freshly downloaded model.

    Runs ``steps`` optimiser steps of the module's own ``training_step`` on the client's training data with
    every public parameter frozen, so the published layers are not modified (paper Sec. 2.1). The local pass
    after it sees the batches it would see without it: the loader's generator (and the global one, which a loader
    without its own draws from) is put back to its state before the fine-tuning, so a defended client and an
    undefended one train, and are attacked, on the same batches. Add it to
    ``FederatedLoop(client_callbacks=[...])``. Inferred: the paper trains the private layers after
    the download; in a round-based loop a client's next download is the start of its next local fit, so the
    fine-tuning runs there (before the full local pass, whose public update is what the server receives).

    Args:
        steps: private-only optimiser steps per client fit (0 disables).
        lr: learning rate of the fine-tuning (Adam).

    Raises:
        ValueError: if ``steps`` is negative or ``lr`` is not positive.
    """

    def __init__(self, steps: int = 10, *, lr: float = 2e-3) -> None:
        if steps < 0:
            raise ValueError(f"PrivateFineTuning(steps={steps}) must be >= 0.")
        if lr <= 0:
            raise ValueError(f"PrivateFineTuning(lr={lr}) must be > 0.")
        self.steps, self.lr = steps, lr

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        private = [p for _, m in private_modules(pl_module) for p in m.parameters() if p.requires_grad]
        if not private or not self.steps:
            return
        optimizer = torch.optim.Adam(private, lr=self.lr)
        loader = trainer.train_dataloader
        generator = getattr(loader, "generator", None)
        shuffle_state = generator.get_state() if generator is not None else None
        with torch.random.fork_rng(devices=[]):
            batches = iter(loader)
            for step in range(self.steps):
                try:
                    batch = next(batches)
                except StopIteration:
                    batches = iter(loader)
                    batch = next(batches)
                batch = [t.to(pl_module.device) for t in batch]
                optimizer.zero_grad()
                loss = pl_module.training_step(batch, step)
                grads = torch.autograd.grad(loss, private)
                for p, g in zip(private, grads, strict=True):
                    p.grad = g
                optimizer.step()
                optimizer.zero_grad()
        if shuffle_state is not None:
            generator.set_state(shuffle_state)
