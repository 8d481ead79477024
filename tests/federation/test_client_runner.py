"""The client runner: private state is born client-side and kept only once the client's first fit succeeded."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from lightning_fl import FederatedCallback, FederatedLoop
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import KeyLocks
from lightning_fl.private import private_state
from tests.conftest import make_classifier


class _CurrentClient(FederatedCallback):
    def __init__(self) -> None:
        self.client: int | None = None

    def on_client_fit_start(self, loop, client_id: int) -> None:
        self.client = client_id


class _CrashFirstFitOfClient0(L.Callback):
    """Records each fit's starting private state; client 0's first fit crashes."""

    def __init__(self, current: _CurrentClient) -> None:
        self.current, self.starts, self.crashed = current, [], False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        start = {k: v.clone() for k, v in private_state(pl_module).items() if k.endswith("key")}
        self.starts.append((self.current.client, start))
        if self.current.client == 0 and not self.crashed:
            self.crashed = True
            raise RuntimeError("client 0 lost power")


def test_a_client_whose_first_fit_crashes_later_trains_with_its_own_secrets(tmp_path: Path) -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16, batch_size=32, seed=0)
    torch.manual_seed(0)
    current = _CurrentClient()
    crash = _CrashFirstFitOfClient0(current)
    loop = FederatedLoop(
        make_classifier(dm),
        dm,
        num_rounds=2,
        clients_per_round=2,
        local_steps=1,
        eval_every=0,
        defences=[KeyLocks(key_length=16)],
        callbacks=[current],
        client_callbacks=[crash],
        output_dir=tmp_path,
        checkpoint=False,
        progress_bar=False,
    )
    loop.fit()
    starts = {}
    for client, start in crash.starts:
        starts.setdefault(client, []).append(start)
    (crashed, retried), (other, _) = starts[0], starts[1]
    assert loop.history[0]["clients"] == [1] and loop.history[1]["clients"] == [0, 1]
    assert all(torch.equal(crashed[k], retried[k]) for k in crashed)  # the same secrets, drawn again
    assert not any(torch.equal(retried[k], other[k]) for k in retried)  # never client 1's
    assert loop.clients[0].initialised


def test_a_local_fit_returns_what_it_produced_and_writes_no_client_state(tmp_path: Path) -> None:
    from lightning_fl.contexts import RoundContext
    from tests.conftest import three_keylock_clients

    loop = three_keylock_clients(tmp_path)
    runner = loop.runner
    ctx = runner.context(RoundContext(loop.spec, 0, loop.round_context().global_state), 1)
    fit = runner.fit(ctx, dict(ctx.global_state))
    assert fit.update.client_id == 1 and fit.private and fit.trained_on is None
    assert not runner.store[1].initialised and not runner.store[1].private  # the client step keeps it, not the fit
    runner.store.keep_fit(1, fit.private)
    assert runner.store[1].initialised and ctx.state is runner.store[1]  # the context holds the kept state
