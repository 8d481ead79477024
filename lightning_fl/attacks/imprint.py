r"""The imprint (binning) block of Robbing the Fed, and the malicious server that plants it in front of a model.

Implements the imprint module of Robbing the Fed (Fowl et al., ICLR 2022, Sec. 3): a linear layer of :math:`k`
bins whose rows all measure one scalar feature :math:`h(x) = \langle w, x\rangle` of the flattened input (the
average brightness, or a random direction), with biases at the quantiles of that feature's distribution, a ReLU,
then a linear layer back to the input's shape:

.. math::

    \mathrm{imprint}(x) = x + W_2\, \mathrm{ReLU}(W_1 x + b), \qquad W_{1,i} = w, \quad
    b_i = -c_i, \quad c_i = \mu + \sigma\, \Phi^{-1}(i / k),\ i = 1, \dots, k - 1,

with :math:`c_0 = \mu - 10\sigma` standing for :math:`-\infty` (every input activates bin 0), :math:`\mu, \sigma`
the mean and standard deviation the server assumes for :math:`h` (public statistics; the paper's Gaussian
assumption), and :math:`W_2` a constant :math:`s / k` in every entry, so that every bin reaches the rest of the
model through the same path and the gradients of two consecutive bins differ by exactly the inputs that fall
between their thresholds. :class:`~lightning_fl.attacks.robbing_the_fed.RobbingTheFedAttack` reads them out.

Deviation: the block adds its output to its input (a skip connection), so the model behind it computes what it
computed before, up to a brightness shift of :math:`s` times the mean bin activation (about :math:`0.4\,s\sigma`);
the paper's block (and breaching's ``connection="linear"``) feeds the rest of the model the bin activations alone.
The recovery identity does not depend on this choice; it keeps the model's accuracy, so a client cannot notice
the attack by its utility.
Inferred: :math:`W_2` is fixed (not a trainable parameter). The identity needs every bin's path to the rest of the
model to be the same; a trainable :math:`W_2` keeps that for one gradient, but local SGD steps move its columns
apart and the differences of consecutive bins stop cancelling (docs/attacks.md, "Deviations").

:class:`MaliciousImprint` is the malicious server itself, a server-side plug-in
(:class:`~lightning_fl.transforms.ServerPlugin`: a model change plus a broadcast transform): it ships the block in
front of the model and re-imposes the block's weights in every model it sends, so each round's clients train
through the planted bins.

References:
    Fowl, Geiping, Czaja, Goldblum, Goldstein. "Robbing the Fed: Directly Obtaining Private Data in Federated
    Learning with Modified Models", ICLR 2022. https://arxiv.org/abs/2110.13057
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn

from lightning_fl.transforms import BroadcastTransform, ServerPlugin

if TYPE_CHECKING:
    from lightning_fl.contexts import RoundContext

__all__ = ["IMPRINT_NAME", "ImprintBlock", "ImprintFeature", "MaliciousImprint", "gaussian_bin_thresholds"]

ImprintFeature = Literal["brightness", "random"]
"""The measured feature :math:`h(x)`: ``brightness`` is the mean of all input values (the paper's default);
``random`` is the projection on a seeded random unit direction with zero mean."""

IMPRINT_NAME = "imprint"
"""The attribute under which :func:`MaliciousImprint.apply_to_model` registers the block (its state keys start
with ``imprint.``)."""


def gaussian_bin_thresholds(num_bins: int, *, mean: float, std: float) -> Tensor:
    r"""The bin thresholds :math:`c_i = \mu + \sigma\,\Phi^{-1}(i/k)`: each bin holds a :math:`1/k` share of a
    Gaussian feature (Fowl et al., 2022, Sec. 3); :math:`c_0 = \mu - 10\sigma` stands for :math:`-\infty`.

    Args:
        num_bins: :math:`k`, at least 2.
        mean: :math:`\mu`, the feature's assumed mean.
        std: :math:`\sigma`, its assumed standard deviation (> 0).

    Raises:
        ValueError: if ``num_bins < 2`` or ``std <= 0``.

    Example:
        >>> gaussian_bin_thresholds(4, mean=0.0, std=1.0)
        tensor([-10.0000,  -0.6745,   0.0000,   0.6745])
    """
    if num_bins < 2:
        raise ValueError(f"num_bins={num_bins} must be >= 2: the attack reads differences of consecutive bins.")
    if not std > 0:
        raise ValueError(f"feature_std={std} must be > 0; it is the spread the bins are placed over.")
    normal = NormalDist(mu=mean, sigma=std)
    return torch.tensor([mean - 10 * std] + [normal.inv_cdf(i / num_bins) for i in range(1, num_bins)])


def _direction(feature: ImprintFeature, size: int, seed: int) -> Tensor:
    if feature == "brightness":
        return torch.full((size,), 1.0 / size)
    if feature == "random":
        direction = torch.randn(size, generator=torch.Generator().manual_seed(seed))
        direction -= direction.mean()
        return direction / direction.norm()
    raise ValueError(f"feature={feature!r} is unknown; use 'brightness' or 'random'.")


class ImprintBlock(nn.Module):
    r"""The imprint (binning) block :math:`x + W_2\,\mathrm{ReLU}(W_1 x + b)` (Fowl et al., 2022, Sec. 3).

    Args:
        input_shape: shape of one input ``(C, H, W)``; the block works on it flattened (:math:`N` values).
        num_bins: :math:`k`, the rows of :math:`W_1`; at most one input per bin is recovered exactly.
        feature: what every row measures (see :data:`ImprintFeature`).
        feature_mean: :math:`\mu`, the mean of :math:`h(x)` over the data the server expects (public statistics).
        feature_std: :math:`\sigma`, its standard deviation.
        output_scale: :math:`s`; every entry of the fixed :math:`W_2` is :math:`s / (g k)`.
        gain: :math:`g`; the stored layer is :math:`g W_1, g b`, so the block computes the same function for every
            :math:`g` while its gradients grow as :math:`1/g` (breaching's ``gain``): a server that expects noise on
            the updates lowers it.
        seed: seed of the ``random`` direction.

    Example:
        >>> block = ImprintBlock((1, 2, 2), num_bins=4, feature_mean=0.5, feature_std=0.1)
        >>> block(torch.full((1, 1, 2, 2), 0.5)).shape, block.feature(torch.full((1, 1, 2, 2), 0.5))
        (torch.Size([1, 1, 2, 2]), tensor([0.5000]))
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        *,
        num_bins: int,
        feature: ImprintFeature = "brightness",
        feature_mean: float,
        feature_std: float,
        output_scale: float = 1.0,
        gain: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if not gain > 0:
            raise ValueError(f"gain={gain} must be > 0.")
        self.input_shape = tuple(int(s) for s in input_shape)
        size = math.prod(self.input_shape)
        thresholds = gaussian_bin_thresholds(num_bins, mean=feature_mean, std=feature_std).float()
        self.bins = nn.Linear(size, num_bins)
        with torch.no_grad():
            self.bins.weight.copy_(gain * _direction(feature, size, seed).expand(num_bins, size))
            self.bins.bias.copy_(-gain * thresholds)
        self.malicious = {k: v.detach().clone() for k, v in self.state_dict().items()}
        self.num_bins, self.output_scale, self.gain = num_bins, output_scale, gain

    def feature(self, x: Tensor) -> Tensor:
        """:math:`h(x)` of each input in ``x`` ``(B, *input_shape)``: what the bins measure, shape ``(B,)``."""
        return x.flatten(1) @ self.malicious["bins.weight"][0].to(x) / self.gain

    def forward(self, x: Tensor) -> Tensor:
        # W_2 ReLU(.) with every entry of W_2 equal to s/(gk): the same value, s/g times the mean activation, per pixel
        back = self.output_scale / self.gain * torch.relu(self.bins(x.flatten(1))).mean(1)
        return x + back.view(-1, *[1] * (x.dim() - 1))


def _held_out_batches(data: Any) -> Iterator[tuple[Tensor, Any]]:
    """The batches of ``data``'s test split, or of every client's training data when it has none."""
    if len(data.test_dataloader()) > 0:
        yield from data.test_dataloader()
        return
    for client in range(data.num_clients):
        yield from data.train_dataloader(client)


def _imprint_inputs(model: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Forward pre-hook: the model's first argument goes through its imprint block first."""
    return (getattr(model, IMPRINT_NAME)(args[0]), *args[1:])


class ReimposeImprint(BroadcastTransform):
    """Write the imprint block's malicious weights into the state sent to each client (every round).

    FedAvg moves the block's weights with the clients' updates; the server undoes that in what it sends, so
    every round's clients train through the planted bins. Not persistent: updates are measured against what each
    client received (see :class:`~lightning_fl.transforms.BroadcastTransform`).
    """

    persistent = False

    def __init__(self, block: ImprintBlock, *, prefix: str = IMPRINT_NAME) -> None:
        self.block, self.prefix = block, prefix

    def __call__(self, state: dict[str, Tensor], *, ctx: RoundContext) -> dict[str, Tensor]:
        planted = {f"{self.prefix}.{k}": v for k, v in self.block.malicious.items()}
        return {k: planted[k].to(v) if k in planted else v for k, v in state.items()}


class MaliciousImprint(ServerPlugin):
    r"""The malicious server of Robbing the Fed (Fowl et al., ICLR 2022): plants an :class:`ImprintBlock` in front
    of the model it ships and re-imposes its weights in every broadcast.

    Threat model: a *malicious* server that changes the architecture and weights the clients receive (the
    paper's setting), not the honest-but-curious server of DLG or Inverting Gradients. It is a server-side
    plug-in (:class:`~lightning_fl.transforms.ServerPlugin`: ``server_plugins:`` in a config,
    ``FederatedLoop(server_plugins=[...])``, ``apply_server_plugins``), applied before the defences, so that
    client-side defences act on the model the server ships.

    ``apply_to_model`` registers the block as ``model.imprint`` and a forward pre-hook that passes the model's
    first argument through it, so the model's own ``forward`` and ``training_step`` stay as they are (they must
    call the model, ``self(x)``, as Lightning modules do). In an ``nn.Sequential``, whose forward runs every child,
    the block becomes the first child instead (``model[0]``).

    Args:
        num_bins: :math:`k`; choose it well above the number of inputs behind one update (the paper uses
            :math:`k \ge B`): an input is recovered exactly when it is alone in its bin.
        feature: what the bins measure (see :data:`ImprintFeature`).
        feature_mean: :math:`\mu` of :math:`h(x)` the server assumes (public statistics); ``None`` (with
            ``feature_std``): measured on the run's held-out data by :meth:`use_data`, which the loop and the command
            call before :meth:`apply_to_model` (the test split; the training data when there is none).
        feature_std: :math:`\sigma` of :math:`h(x)`; ``None``: measured with ``feature_mean``.
        output_scale: :math:`s`, the block's effect on the model's input (see :class:`ImprintBlock`).
        gain: :math:`g`; the gradients the block leaks grow as :math:`1/g` (see :class:`ImprintBlock`).
        input_shape: shape of one model input ``(C, H, W)``; ``None``: the shape of the run's images
            (:meth:`use_data`), else ``model.hparams`` (``in_channels``, ``image_size``), as the toolkit's image
            models have them.
        seed: seed of the ``random`` direction.

    Raises:
        ValueError: on ``num_bins < 2``, ``feature_std <= 0``, only one of ``feature_mean``/``feature_std``, an
            unknown feature, or (in ``apply_to_model``) a model whose input shape cannot be read and no
            ``input_shape``, or statistics neither given nor measured.
    """

    def __init__(
        self,
        *,
        num_bins: int = 256,
        feature: ImprintFeature = "brightness",
        feature_mean: float | None = None,
        feature_std: float | None = None,
        output_scale: float = 1.0,
        gain: float = 1.0,
        input_shape: Sequence[int] | None = None,
        seed: int = 0,
    ) -> None:
        if (feature_mean is None) != (feature_std is None):
            raise ValueError(
                f"MaliciousImprint(feature_mean={feature_mean}, feature_std={feature_std}): give both, or neither "
                "to measure them on the run's data."
            )
        gaussian_bin_thresholds(num_bins, mean=feature_mean or 0.0, std=1.0 if feature_std is None else feature_std)
        _direction(feature, 1, seed)
        if not gain > 0:
            raise ValueError(f"MaliciousImprint(gain={gain}) must be > 0.")
        self.num_bins, self.feature, self.feature_mean, self.feature_std = num_bins, feature, feature_mean, feature_std
        self.output_scale, self.gain, self.seed = output_scale, gain, seed
        self.input_shape = tuple(input_shape) if input_shape is not None else None
        self._data_shape: tuple[int, ...] | None = None
        self.block: ImprintBlock | None = None

    def _input_shape(self, model: nn.Module) -> tuple[int, ...]:
        if self.input_shape is not None:
            return self.input_shape
        if self._data_shape is not None:
            return self._data_shape
        hparams = getattr(model, "hparams", {})
        if "in_channels" in hparams and "image_size" in hparams:
            return (int(hparams["in_channels"]), int(hparams["image_size"]), int(hparams["image_size"]))
        raise ValueError(
            f"MaliciousImprint cannot read the input shape of {type(model).__name__} (no hparams in_channels and "
            "image_size); pass input_shape: [C, H, W]."
        )

    def use_data(self, data: Any) -> None:
        """Read the shape of ``data``'s images (the block's input shape unless ``input_shape`` is given) and
        measure ``feature_mean``/``feature_std`` of :math:`h(x)` on its test split (its training data when the test
        split is empty) if they were not given; given ones are kept."""
        batches = _held_out_batches(data)
        first = next(batches, None)
        if first is None:
            raise ValueError("MaliciousImprint: the data has no images to read their shape and statistics from.")
        self._data_shape = tuple(first[0].shape[1:])
        if self.feature_mean is not None:
            return
        images = [first[0], *(x for x, _ in batches)]
        flat = torch.cat(images).flatten(1).float()
        values = flat @ _direction(self.feature, flat.shape[1], self.seed)
        self.feature_mean, self.feature_std = float(values.mean()), float(values.std().clamp_min(1e-6))

    def apply_to_model(self, model: nn.Module) -> nn.Module:
        if self.feature_mean is None or self.feature_std is None:
            raise ValueError(
                "MaliciousImprint has no feature_mean/feature_std: give both, or call use_data(data) first (the loop "
                "and the lightning-fl command do)."
            )
        if hasattr(model, IMPRINT_NAME):
            raise ValueError(f"{type(model).__name__} already has an attribute {IMPRINT_NAME!r}.")
        self.block = ImprintBlock(
            self._input_shape(model),
            num_bins=self.num_bins,
            feature=self.feature,
            feature_mean=self.feature_mean,
            feature_std=self.feature_std,
            output_scale=self.output_scale,
            gain=self.gain,
            seed=self.seed,
        )
        if isinstance(model, nn.Sequential):  # its forward runs every child in order: the block goes first
            model._modules = {IMPRINT_NAME: self.block, **model._modules}
        else:
            model.add_module(IMPRINT_NAME, self.block)
            model.register_forward_pre_hook(_imprint_inputs)
        return model

    def broadcast_transforms(self) -> list[BroadcastTransform]:
        if self.block is None:
            raise RuntimeError(
                "MaliciousImprint.broadcast_transforms() needs apply_to_model() first (the loop calls both)."
            )
        return [ReimposeImprint(self.block)]

    def __repr__(self) -> str:
        return (
            f"MaliciousImprint(num_bins={self.num_bins}, feature={self.feature!r}, feature_mean={self.feature_mean}, "
            f"feature_std={self.feature_std}, output_scale={self.output_scale}, gain={self.gain})"
        )
