"""A malformed encrypted or masked payload is its client's failure, and client metadata sets no server step.

On main before this suite: a Paillier payload with its last ciphertext cut off stopped the run with ``IndexError
... item.ciphertexts[index]`` inside the homomorphic sum, a truncated SecAgg masked input stopped it inside the
unmasking sum, and under DPFL a client that reported ``lr: 1e4`` in its metadata set the server's step (a weight of
891 after one round).
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from lightning_fl import ClientUpdate, FederatedLoop
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import PaillierEncryption, SecAggMasking, SecureFedAvg
from lightning_fl.federation.updates import payload_error
from lightning_fl.server import ClientSelector, DPFLAggregator
from lightning_fl.transforms import ClientTransform
from tests.conftest import make_classifier


def _loop(tmp_path, num_clients: int = 2, **kwargs) -> FederatedLoop:
    dm = FederatedDataModule("digits", num_clients=num_clients, partition="iid", image_size=16, batch_size=32, seed=0)
    torch.manual_seed(0)
    options = dict(num_rounds=1, clients_per_round=num_clients, local_steps=2, eval_every=0, checkpoint=False)
    options.update(output_dir=tmp_path, progress_bar=False, **kwargs)
    return FederatedLoop(make_classifier(dm), dm, **options)


class _Only(ClientSelector):
    def __init__(self, clients: list[int]) -> None:
        self.clients = clients

    def select(self, ctx) -> list[int]:
        return list(self.clients)


def _same_models(a: FederatedLoop, b: FederatedLoop) -> bool:
    expected = b.global_model.state_dict()
    return all(torch.equal(v, expected[k]) for k, v in a.global_model.state_dict().items())


class _TruncatingPaillier(PaillierEncryption):
    """Client 1 sends its ciphertexts with the last one cut off (a torn or malicious upload)."""

    def __call__(self, update: ClientUpdate, *, ctx) -> ClientUpdate:
        sent = super().__call__(update, ctx=ctx)
        if update.client_id != 1:
            return sent
        return dataclasses.replace(
            sent, payload=dataclasses.replace(sent.payload, ciphertexts=sent.payload.ciphertexts[:-1])
        )


def _paillier(tmp_path, cls, **kwargs) -> FederatedLoop:
    encryption = cls(key_size=512, max_weight_sum=2**11)
    return _loop(tmp_path, defences=[encryption], aggregator=SecureFedAvg(), **kwargs)


def test_a_truncated_paillier_payload_is_its_clients_failure(tmp_path) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*below 2048 bits.*")
        loop = _paillier(tmp_path / "torn", _TruncatingPaillier)
        with pytest.warns(
            UserWarning, match=r"update of client 1 is dropped: its payload is malformed: it holds \d+ ciph"
        ):
            loop.fit()
        assert loop.history[0]["clients"] == [0]
        alone = _paillier(tmp_path / "alone", PaillierEncryption, selector=_Only([0]))
        alone.fit()
    assert _same_models(loop, alone)


class _TruncatingSecAgg(SecAggMasking):
    """Client 1 uploads only half of its masked values."""

    def __call__(self, update: ClientUpdate, *, ctx) -> ClientUpdate:
        sent = super().__call__(update, ctx=ctx)
        if update.client_id != 1:
            return sent
        masked = sent.payload.masked
        return dataclasses.replace(
            sent, payload=dataclasses.replace(sent.payload, masked=masked[: masked.numel() // 2])
        )


def test_a_truncated_secagg_masked_input_is_its_clients_failure(tmp_path) -> None:
    loop = _loop(tmp_path, num_clients=3, defences=[_TruncatingSecAgg(threshold=0.5)])
    with pytest.warns(UserWarning, match=r"update of client 1 is dropped: its payload is malformed: its masked values"):
        loop.fit()
    assert loop.history[0]["clients"] == [0, 2]
    assert all(torch.isfinite(v).all() for v in loop.global_model.state_dict().values())


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (object(), "declares no layer shapes"),
        (type("Raises", (), {"shapes": {}, "structure_error": lambda self, round_idx: 1 / 0})(), "ZeroDivisionError"),
    ],
)
def test_a_payload_that_cannot_be_read_is_named(payload, reason) -> None:
    assert reason in payload_error(payload, round_idx=0)


class _ReportsLr(ClientTransform):
    """Every client reports a learning rate of its choosing in its metadata."""

    def __init__(self, lr: float) -> None:
        self.lr = lr

    def __call__(self, update: ClientUpdate, *, ctx) -> ClientUpdate:
        return dataclasses.replace(update, metadata={**update.metadata, "lr": self.lr})


def test_dpfl_takes_its_step_from_the_servers_configuration_not_from_client_metadata(tmp_path) -> None:
    honest = _loop(tmp_path / "honest", aggregator=DPFLAggregator())
    honest.fit()
    lying = _loop(tmp_path / "lying", aggregator=DPFLAggregator(), client_transforms=[_ReportsLr(1e4)])
    lying.fit()
    assert _same_models(lying, honest)
    assert max(v.abs().max().item() for v in lying.global_model.state_dict().values()) < 10
