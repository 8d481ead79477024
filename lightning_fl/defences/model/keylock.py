r"""FedKL key-lock module: a normalisation whose scale and shift come from a private key through private locks.

Implements the key-lock module of FedKL (Ren, "Gradient Leakage and Protection for Federated Learning", PhD
thesis, Swansea 2023, ch. 5, Sec. 5.2.3, Fig. 5.2 and Proposition 2):

.. math::

    F(X_{conv}, X_{key}) = \gamma \odot \hat X_{conv} + \beta, \qquad
    \gamma = X_{key} W_{lock\text{-}\gamma} + b_{lock\text{-}\gamma}, \quad
    \beta = X_{key} W_{lock\text{-}\beta} + b_{lock\text{-}\beta},

with :math:`X_{key} \in \mathbb{R}^S` a private key (S = 1024) and :math:`\hat X_{conv}` the normalised
convolution output. The key and the two lock layers are private (see :mod:`lightning_fl.private`): they never
leave the client, the global model never contains the client's versions, and each client re-attaches its own
lock to every new global model. Without the key, Eq. (5.24)-(5.26) cannot be evaluated from the shared
gradient (Proposition 2), so gradient-matching attacks reconstruct noise.

References:
    Thesis text: Ren, "Gradient Leakage and Protection for Federated Learning" (PhD thesis), ch. 5.
    Reference code: Rand2AI/FedKL (``Defense_block``).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from lightning_fl.defences.base import Defence, apply_layers

__all__ = [
    "KeyLock",
    "KeyLockNorm",
    "KeyLockNorm2d",
    "KeyLocks",
    "LockActivation",
    "add_keylock",
    "lock_parameter_share",
]

LockActivation = Literal["none", "relu", "sigmoid"]
"""Activation on :math:`\\gamma, \\beta`: ``none`` is the thesis formula (the default); the reference code applies
``relu`` in its training networks (Tables 5.1, 5.3) and ``sigmoid`` in its attack networks (Tables 5.4-5.6).
``relu`` can leave dead channels (the measured cost is in docs/defences.md)."""

_ACTIVATIONS: dict[str, type[nn.Module]] = {"none": nn.Identity, "relu": nn.ReLU, "sigmoid": nn.Sigmoid}

KeyLockNorm = Literal["batch", "group"]
"""The normalisation under the lock: ``batch`` is ``BatchNorm2d(affine=False)`` (thesis reference code); ``group`` is
``GroupNorm(affine=False)`` with ``gcd(32, C)`` groups, which normalises each example on its own, as per-example
DP-SGD (:class:`~lightning_fl.defences.PerExampleDP`) needs."""


def _normalisation(norm: str, num_features: int, eps: float, momentum: float) -> nn.Module:
    if norm == "group":
        return nn.GroupNorm(math.gcd(32, num_features), num_features, eps=eps, affine=False)
    return nn.BatchNorm2d(num_features, eps=eps, momentum=momentum, affine=False)


class KeyLock(nn.Module):
    """The private part of a key-lock module: the key sequence and the two lock layers (``scale_fc``, ``shift_fc``).

    ``fl_private = True``: the key, the lock weights and their gradients stay on the client. :meth:`reset_private`
    draws the client's own key; the lock layers start from the common initialisation and train locally.

    Inferred (reference code): keys are i.i.d. U[0, 1), drawn once per client and fixed for the run.
    The same key feeds both lock layers (reference code: ``forward(x, key, key)``).

    Args:
        num_features: channels O of the normalised feature map (the length of :math:`\\gamma, \\beta`).
        key_length: key length S (the thesis uses 1024, Sec. 5.3.1).
        lock_act: activation on :math:`\\gamma, \\beta` (see :data:`LockActivation`).
        init_range: draw the lock weights and biases from U(-r, r); ``None`` keeps PyTorch's ``Linear`` default
            U(+-1/sqrt(S)). How far a wrong key moves :math:`\\gamma, \\beta` scales with it: the reference code's
            attack networks draw every weight, locks included, from U(-0.5, 0.5) (the DLG LeNet's init), and
            with r = 0.5 a wrong key defeats DLG and IG on our sigmoid LeNet where the default leaves SSIM ~0.6
            (docs/defences.md).

    Example:
        >>> lock = KeyLock(4, key_length=8)
        >>> [t.shape for t in lock()]
        [torch.Size([4]), torch.Size([4])]
    """

    fl_private = True

    def __init__(
        self,
        num_features: int,
        *,
        key_length: int = 1024,
        lock_act: LockActivation = "none",
        init_range: float | None = None,
    ) -> None:
        super().__init__()
        if num_features < 1:
            raise ValueError(f"KeyLock(num_features={num_features}) must be >= 1.")
        if key_length < 1:
            raise ValueError(f"KeyLock(key_length={key_length}) must be >= 1; the thesis uses 1024.")
        if lock_act not in _ACTIVATIONS:
            raise ValueError(f"KeyLock(lock_act={lock_act!r}) is unknown; use one of {sorted(_ACTIVATIONS)}.")
        self.lock_act = lock_act
        self.register_buffer("key", torch.rand(key_length))
        self.scale_fc = nn.Linear(key_length, num_features)
        self.shift_fc = nn.Linear(key_length, num_features)
        self.activation = _ACTIVATIONS[lock_act]()
        if init_range is not None:
            if init_range <= 0:
                raise ValueError(f"KeyLock(init_range={init_range}) must be > 0 (or None for PyTorch's default).")
            for p in self.parameters():
                nn.init.uniform_(p, -init_range, init_range)

    def reset_private(self, generator: torch.Generator) -> None:
        """Draw this client's secret key from ``generator``."""
        with torch.no_grad():
            self.key.copy_(torch.rand(self.key.shape, generator=generator).to(self.key.device))

    def forward(self) -> tuple[Tensor, Tensor]:
        """:math:`(\\gamma, \\beta)`, each of shape ``(O,)``."""
        return self.activation(self.scale_fc(self.key)), self.activation(self.shift_fc(self.key))


class KeyLockNorm2d(nn.Module):
    r"""Batch normalisation without its own affine, scaled and shifted by a private key-lock (FedKL).

    A drop-in for ``nn.BatchNorm2d`` after the convolution of a conv-norm block:
    :math:`\gamma \odot \mathrm{BN}_{\text{affine=False}}(x) + \beta`, with :math:`\gamma, \beta` from
    :class:`KeyLock`. The normalisation (its running statistics) is public and averaged like any other
    buffer; the key and the locks (``lock``) are private.

    Inferred (reference code): the thesis formula omits the normalisation but the text replaces "the
    scale and shift processes in the normalisation layer"; the reference ``Defense_block`` uses
    ``BatchNorm2d(affine=False)``, and so do we.

    Args:
        num_features: channels O.
        key_length: key length S.
        lock_act: activation on :math:`\gamma, \beta` (see :data:`LockActivation`).
        lock_init_range: initialise the locks from U(-r, r) (see :class:`KeyLock`); ``None``: PyTorch's default.
            Default 0.5, the reference code's init: with PyTorch's U(+-1/32) a wrong key barely moves gamma, beta.
        norm: ``batch`` or ``group`` (per example, for DP-SGD); see :data:`KeyLockNorm`.
        eps: normalisation eps.
        momentum: ``BatchNorm2d`` momentum of the running statistics (``norm="batch"``).

    Raises:
        ValueError: on an unknown ``norm``.

    Example:
        >>> layer = KeyLockNorm2d(12, key_length=16)
        >>> layer(torch.rand(2, 12, 8, 8)).shape
        torch.Size([2, 12, 8, 8])
        >>> sorted(k for k in layer.state_dict() if k.startswith("lock."))
        ['lock.key', 'lock.scale_fc.bias', 'lock.scale_fc.weight', 'lock.shift_fc.bias', 'lock.shift_fc.weight']
    """

    per_example_unit = True
    """Per-example gradients (DP-SGD, :class:`~lightning_fl.defences.PerExampleDP`) treat the layer as one function
    of the example: its scale and shift come from the batch-free key, which Opacus' per-layer hooks cannot split.
    The normalisation must then be per example: ``opacus.validators.ModuleValidator.fix`` makes it a GroupNorm."""

    def __init__(
        self,
        num_features: int,
        *,
        key_length: int = 1024,
        lock_act: LockActivation = "none",
        lock_init_range: float | None = 0.5,
        norm: KeyLockNorm = "batch",
        eps: float = 1e-5,
        momentum: float = 0.1,
    ) -> None:
        super().__init__()
        if norm not in ("batch", "group"):
            raise ValueError(f"KeyLockNorm2d(norm={norm!r}) is unknown; use 'batch' or 'group' (per example, for DP).")
        self.norm = _normalisation(norm, num_features, eps, momentum)
        self.lock = KeyLock(num_features, key_length=key_length, lock_act=lock_act, init_range=lock_init_range)

    def forward(self, x: Tensor) -> Tensor:
        gamma, beta = self.lock()
        return gamma.view(1, -1, 1, 1) * self.norm(x) + beta.view(1, -1, 1, 1)


def _first_conv_name(model: nn.Module) -> str:
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d):
            return name
    raise ValueError(f"{type(model).__name__} has no nn.Conv2d to key-lock.")


def add_keylock(
    model: nn.Module,
    *,
    conv: str | None = None,
    key_length: int = 1024,
    lock_act: LockActivation = "none",
    lock_init_range: float | None = 0.5,
    norm: KeyLockNorm = "batch",
) -> nn.Module:
    """Retrofit FedKL: key-lock the conv-norm block of ``conv`` (the first convolution by default).

    When the module registered right after ``conv`` in the same parent is a ``BatchNorm2d`` (ResNets), it is
    replaced by a :class:`KeyLockNorm2d`; otherwise (the sigmoid LeNet, torchvision's VGG-16) ``conv`` is
    replaced by ``nn.Sequential(conv, KeyLockNorm2d)``, which adds the normalisation the block lacked, as the
    thesis' key-locked LeNet does. The thesis locks only the first block (Sec. 5.3.1). The
    model is changed in place and returned.

    Args:
        model: any module, e.g. an :class:`~lightning_fl.models.ImageClassifier`.
        conv: dotted name of the convolution whose block is locked; ``None`` for the first ``nn.Conv2d``.
        key_length: key length S (1024 in the thesis).
        lock_act: activation on :math:`\\gamma, \\beta` (see :data:`LockActivation`).
        lock_init_range: initialise the locks from U(-r, r) (see :class:`KeyLock`); ``None``: PyTorch's default.
            Default 0.5, the reference code's init: with PyTorch's U(+-1/32) a wrong key barely moves gamma, beta.
        norm: normalisation under the lock, ``batch`` (thesis) or ``group`` (per example: needed by DP-SGD);
            see :data:`KeyLockNorm`.

    Raises:
        ValueError: if ``conv`` is not the name of an ``nn.Conv2d`` of ``model``.

    Example:
        >>> from lightning_fl.models import resnet20
        >>> net = add_keylock(resnet20(num_classes=100))
        >>> type(net.bn1).__name__, round(100 * lock_parameter_share(net), 2)
        ('KeyLockNorm2d', 10.49)
    """
    name = _first_conv_name(model) if conv is None else conv
    target = dict(model.named_modules()).get(name)
    if not isinstance(target, nn.Conv2d):
        raise ValueError(f"add_keylock(conv={name!r}) is not an nn.Conv2d of {type(model).__name__}.")
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    siblings = list(parent.named_children())
    position = [n for n, _ in siblings].index(child)
    follower = siblings[position + 1] if position + 1 < len(siblings) else None
    options: dict = {"key_length": key_length, "lock_act": lock_act, "lock_init_range": lock_init_range, "norm": norm}
    if follower is not None and isinstance(follower[1], nn.BatchNorm2d):
        bn = follower[1]
        options["eps"], options["momentum"] = bn.eps, bn.momentum or 0.1
        lock = KeyLockNorm2d(bn.num_features, **options)
        setattr(parent, follower[0], lock.to(target.weight.device))
    else:
        lock = KeyLockNorm2d(target.out_channels, **options)
        setattr(parent, child, nn.Sequential(target, lock.to(target.weight.device)))
    return model


def lock_parameter_share(model: nn.Module) -> float:
    """Share of ``model``'s state held by its lock layers, as in the thesis' Table 5.3.

    The thesis' definition (reference code): elements of all ``scale_fc`` and ``shift_fc``
    tensors (weights and biases) divided by the elements of the whole ``state_dict``, batch-norm buffers
    included and keys excluded (the reference code passes the key to ``forward`` instead of storing it).

    Raises:
        ValueError: if ``model`` has no :class:`KeyLock`.

    Example:
        >>> round(lock_parameter_share(nn.Sequential(nn.Conv2d(1, 2, 1), KeyLockNorm2d(2, key_length=4))), 3)
        0.69
    """
    locks = [m for m in model.modules() if isinstance(m, KeyLock)]
    if not locks:
        raise ValueError(f"{type(model).__name__} has no KeyLock; retrofit one with add_keylock(model).")
    locked = sum(p.numel() for lock in locks for fc in (lock.scale_fc, lock.shift_fc) for p in fc.parameters())
    keys = sum(lock.key.numel() for lock in locks)
    return locked / (sum(t.numel() for t in model.state_dict().values()) - keys)


class KeyLocks(Defence):
    """FedKL as a model defence: ``KeyLocks().apply_to_model(model)`` calls :func:`add_keylock`.

    Put it in ``loop.defences`` (or the top-level ``defences:`` of a YAML config) to retrofit any model.

    Args:
        conv: dotted name of the convolution whose conv-norm block is locked; ``None`` for the first one.
        key_length: key length S (1024 in the thesis).
        lock_act: activation on the lock outputs: ``none`` (the thesis formula), ``relu`` (reference training
            networks) or ``sigmoid`` (reference attack networks).
        lock_init_range: initialise the locks from U(-r, r); ``None`` keeps PyTorch's default (see
            :class:`KeyLock`: 0.5 is the reference attack networks' init and what defeats DLG/IG here).
        norm: normalisation under the lock, ``batch`` (thesis) or ``group`` (per example, for DP-SGD).
    """

    def __init__(
        self,
        conv: str | None = None,
        *,
        key_length: int = 1024,
        lock_act: LockActivation = "none",
        lock_init_range: float | None = 0.5,
        norm: KeyLockNorm = "batch",
    ) -> None:
        self.conv, self.key_length, self.lock_act, self.lock_init_range = conv, key_length, lock_act, lock_init_range
        self.norm = norm

    def apply_to_model(self, model: nn.Module) -> nn.Module:
        return apply_layers(add_keylock, model, self)

    def __repr__(self) -> str:
        return (
            f"KeyLocks(conv={self.conv!r}, key_length={self.key_length}, lock_act={self.lock_act!r}, "
            f"norm={self.norm!r})"
        )
