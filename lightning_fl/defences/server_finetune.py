"""Server-side fine-tuning of the aggregate on a public split (DPFL Alg. 3, last line)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Literal

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_fl.transforms import ServerTransform

if TYPE_CHECKING:
    from lightning_fl.loop import FederatedLoop

__all__ = ["PublicFineTune"]


class PublicFineTune(ServerTransform):
    r"""Train the aggregated global model on public data for a few epochs; the change joins the aggregate.

    DPFL (Zhu et al., IEEE IoT-J 2021, Alg. 3 and Sec. V-A) fine-tunes for one epoch per round on 1,000
    images drawn from the MNIST/FMNIST *test* set (3,000 for CIFAR-10). The model's own optimiser
    (``configure_optimizers``) is used, fresh every round (Inferred, spec A.2.6), with the data module's
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

    @override
    def setup(self, loop: FederatedLoop) -> None:
        dm = loop.datamodule
        if self.source == "test":
            pool = dm.test_set
        else:
            parts = [dm.client_val_set(k) for k in range(loop.num_clients)]
            pool = torch.utils.data.ConcatDataset(parts)
        if len(pool) == 0:
            raise ValueError(f"PublicFineTune(source={self.source!r}) found no samples; use the other source.")
        idx = torch.randperm(len(pool), generator=torch.Generator().manual_seed(self.seed))[: self.num_samples]
        self._public = torch.utils.data.Subset(pool, idx.tolist())

    @override
    def __call__(self, delta: dict[str, Tensor], *, loop: FederatedLoop) -> dict[str, Tensor]:
        global_state = loop.global_public_state()
        start = {k: global_state[k] + v for k, v in delta.items()}
        model = loop.attacker_model(start)
        torch.manual_seed(loop.round_seed("public-finetune"))
        loader = DataLoader(
            self._public,
            batch_size=loop.datamodule.batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(loop.round_seed("public-finetune-order")),
        )
        trainer = L.Trainer(**loop.trainer_options, max_epochs=self.epochs)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have many workers.*")
            warnings.filterwarnings("ignore", message=".*number of training batches.*")
            trainer.fit(model, train_dataloaders=loader)
        tuned = model.state_dict()
        return {k: (tuned[k] - global_state[k]).detach().clone() for k in delta}
