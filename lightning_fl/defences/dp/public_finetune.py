"""Server-side fine-tuning of the aggregate on a public split (DPFL Alg. 3, last line)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from typing_extensions import override

from lightning_fl.defences.base import Defence, DefenceParts
from lightning_fl.private import load_state_into
from lightning_fl.trainers import build_trainer, quiet_lightning
from lightning_fl.transforms import ServerTransform

if TYPE_CHECKING:
    from lightning_fl.contexts import ClientSetupContext, RoundContext, SetupContext

__all__ = ["PublicFineTune"]


class PublicFineTune(ServerTransform, Defence):
    r"""Train the aggregated global model on public data for a few epochs; the change joins the aggregate.

    DPFL (Zhu et al., IEEE IoT-J 2021, Alg. 3 and Sec. V-A) fine-tunes for one epoch per round on 1,000
    images drawn from the MNIST/FMNIST *test* set (3,000 for CIFAR-10). The model's own optimiser
    (``configure_optimizers``) is used, fresh every round (Inferred), with the data module's
    batch size. Deviation: the loop evaluates on the whole test set, public samples included (the paper does
    not say; with ``source="test"`` report that, or use a smaller ``num_samples``).

    Args:
        num_samples: public samples, drawn once (seeded) from ``source``.
        source: ``test`` (the paper) or ``validation`` (the union of the clients' validation splits, which the
            server would have to be given).
        epochs: fine-tuning epochs per round (paper: 1).
        seed: seed of the public draw.

    Raises:
        ValueError: if ``num_samples`` or ``epochs`` is not positive, or on an unknown source.
    """

    def __init__(
        self, *, num_samples: int = 1000, source: Literal["test", "validation"] = "test", epochs: int = 1, seed: int = 0
    ) -> None:
        if num_samples < 1 or epochs < 1:
            raise ValueError(f"PublicFineTune(num_samples={num_samples}, epochs={epochs}) must both be >= 1.")
        if source not in ("test", "validation"):
            raise ValueError(f"PublicFineTune(source={source!r}) is unknown; use 'test' or 'validation'.")
        self.num_samples, self.source, self.epochs, self.seed = num_samples, source, epochs, seed
        self._public: Any = None
        self._model: Any = None
        self._options: dict[str, Any] = {}

    @override
    def setup(self, ctx: SetupContext) -> None:
        if self.source == "test":
            self._draw(ctx.test_set)
        self._model, self._options = copy.deepcopy(ctx.global_model), ctx.trainer_options

    def setup_clients(self, ctx: ClientSetupContext) -> None:
        """Client side, before the first round: with ``source="validation"``, the clients give the server their
        validation splits (the deviation this source stands for)."""
        if self.source == "validation":
            self._draw(torch.utils.data.ConcatDataset(ctx.val_sets))

    def _draw(self, pool: Dataset | None) -> None:
        if pool is None or len(pool) == 0:
            raise ValueError(f"PublicFineTune(source={self.source!r}) found no samples; use the other source.")
        idx = torch.randperm(len(pool), generator=torch.Generator().manual_seed(self.seed))[: self.num_samples]
        self._public = torch.utils.data.Subset(pool, idx.tolist())

    @override
    def parts(self) -> DefenceParts:
        return DefenceParts(server_transforms=[self])

    @override
    def __call__(self, delta: dict[str, Tensor], *, ctx: RoundContext) -> dict[str, Tensor]:
        if self._public is None:
            raise RuntimeError(
                f"PublicFineTune(source={self.source!r}) has no public data: the clients' validation splits come "
                "through setup_clients, which clients in another process (Flower) do not run; use source='test'."
            )
        global_state = ctx.global_state
        model = copy.deepcopy(self._model)  # the server's copy: public state loaded, private layers its own init
        load_state_into(model, {**global_state, **{k: global_state[k] + v for k, v in delta.items()}})
        model.train()
        torch.manual_seed(ctx.seed("public-finetune"))
        loader = DataLoader(
            self._public,
            batch_size=ctx.spec.batch_size,
            shuffle=True,
            generator=ctx.rng("public-finetune-order"),
        )
        with quiet_lightning():
            build_trainer(self._options, max_epochs=self.epochs).fit(model, train_dataloaders=loader)
        tuned = model.state_dict()
        return {k: (tuned[k] - global_state[k]).detach().clone() for k in delta}
