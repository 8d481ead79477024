"""A client's update is checked whole before the server uses it: a bad one is dropped with a warning, the run goes on.

Faults a malicious or broken client can send: plaintext layers of an encrypted (Paillier) update scaled by 1e20
(the server used to skip every norm check for an update with a payload), and a ``num_samples`` of ``inf`` (which
stopped the run) or ``1e12`` (which took over the FedAvg average).
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from types import SimpleNamespace

import pytest
import torch

from lightning_fl import ClientUpdate, FederatedLoop
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import PaillierEncryption, SecureFedAvg
from lightning_fl.federation.updates import check_update, drop_norm_outliers
from lightning_fl.server import ClientSelector
from lightning_fl.transforms import ClientTransform
from tests.conftest import make_classifier


def _loop(tmp_path, **kwargs) -> FederatedLoop:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16, batch_size=32, seed=0)
    torch.manual_seed(0)
    options = dict(num_rounds=1, clients_per_round=2, local_steps=2, eval_every=0, checkpoint=False)
    options.update(output_dir=tmp_path, progress_bar=False, **kwargs)
    return FederatedLoop(make_classifier(dm), dm, **options)


def _encrypted(client_id: int, plain: float) -> ClientUpdate:
    """An update whose ``w`` is encrypted (only its shape is public) and whose ``b`` is sent in the clear."""
    payload = SimpleNamespace(shapes={"w": (3,)})
    return ClientUpdate(client_id, 0, {"b": torch.full((2,), plain)}, 10, 0.0, payload=payload)


def test_plaintext_layers_of_an_encrypted_update_are_norm_checked() -> None:
    updates = [_encrypted(0, 0.01), _encrypted(1, 0.02), _encrypted(2, 1e20)]
    with pytest.warns(UserWarning, match=r"update of client 2 is dropped: its norm 1\.41e\+20 exceeds"):
        kept = drop_norm_outliers(updates, max_ratio=1e3, max_norm=1e6, round_idx=0)
    assert [u.client_id for u in kept] == [0, 1]


@pytest.mark.parametrize(
    ("delta", "reason"),
    [
        ({}, r"missing \['b'\]"),  # a plaintext layer left out: the aggregate would lack it
        ({"b": torch.zeros(2), "w": torch.zeros(3)}, r"sent both encrypted and in the clear \['w'\]"),
    ],
)
def test_an_encrypted_update_must_declare_every_layer_once(delta, reason) -> None:
    update = dataclasses.replace(_encrypted(0, 0.0), delta=delta)
    assert re.search(
        reason,
        check_update(
            update, {"w": torch.zeros(3), "b": torch.zeros(2)}, num_train_samples=10, client_id=0, round_idx=0
        ),
    )


@pytest.mark.parametrize("num_samples", [math.inf, math.nan, 1e12, 649, 0, -5, 2.5])
def test_check_update_refuses_a_num_samples_that_is_not_a_whole_number_within_the_clients_data(num_samples) -> None:
    update = ClientUpdate(0, 0, {"w": torch.zeros(2)}, num_samples, 0.0)
    reason = check_update(update, {"w": torch.Size([2])}, num_train_samples=648, client_id=0, round_idx=0)
    assert reason is not None and reason.startswith("num_samples=") and "1..648" in reason


class _ClaimsSamples(ClientTransform):
    """A client that reports ``num_samples`` of its choosing (client 1 only)."""

    def __init__(self, num_samples: float) -> None:
        self.num_samples = num_samples

    def __call__(self, update: ClientUpdate, *, ctx) -> ClientUpdate:
        if update.client_id != 1:
            return update
        return dataclasses.replace(update, num_samples=self.num_samples)


@pytest.mark.parametrize("num_samples", [math.inf, 1e12])
def test_a_client_that_misreports_num_samples_is_dropped_and_the_round_is_the_honest_clients_alone(
    tmp_path, num_samples
) -> None:
    lying = _loop(tmp_path / "lying", client_transforms=[_ClaimsSamples(num_samples)])
    with pytest.warns(UserWarning, match=r"round 0: update of client 1 is dropped: num_samples=.* not a whole number"):
        lying.fit()
    assert lying.history[0]["clients"] == [0]
    alone = _loop(tmp_path / "alone", selector=_Only([0]))  # the same round without client 1
    alone.fit()
    expected = alone.global_model.state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in lying.global_model.state_dict().items())


class _Only(ClientSelector):
    def __init__(self, clients: list[int]) -> None:
        self.clients = clients

    def select(self, ctx) -> list[int]:
        return list(self.clients)


class _ScalesItsPlainLayers(PaillierEncryption):
    """A malicious client's encryption: encrypts the layers asked for, then scales the clear ones by 1e20."""

    def __call__(self, update: ClientUpdate, *, ctx) -> ClientUpdate:
        sent = super().__call__(update, ctx=ctx)
        if update.client_id != 1:
            return sent
        return dataclasses.replace(sent, delta={k: v * 1e20 for k, v in sent.delta.items()})


def test_a_paillier_client_that_scales_its_plaintext_layers_is_dropped(tmp_path) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*below 2048 bits.*")
        encryption = _ScalesItsPlainLayers(key_size=512, layers=["backbone.fc.bias"], max_weight_sum=2**11)
        loop = _loop(tmp_path, defences=[encryption], aggregator=SecureFedAvg())
        with pytest.warns(UserWarning, match=r"update of client 1 is dropped: its norm .*e\+\d\d exceeds"):
            loop.fit()
    assert loop.history[0]["clients"] == [0]
    assert max(v.abs().max().item() for v in loop.global_model.state_dict().values()) < 1e3


class _Tampers(ClientTransform):
    """Client 1's message, changed by ``change`` after its honest encoding (a faulty or malicious client)."""

    def __init__(self, change) -> None:
        self.change = change

    def __call__(self, update: ClientUpdate, *, ctx) -> ClientUpdate:
        return self.change(update) if update.client_id == 1 else update


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda u: dataclasses.replace(u, num_samples=str(u.num_samples)), r"num_samples=nan is not a whole number"),
        (lambda u: dataclasses.replace(u, delta={k: v.to("meta") for k, v in u.delta.items()}), r"on meta"),
        (lambda u: dataclasses.replace(u, client_id=0), r"names client 0 and round 0, but the server sent .* client 1"),
    ],
    ids=["num_samples_string", "meta_device", "spoofed_client_id"],
)
def test_one_bad_message_is_its_clients_failure_never_the_runs(tmp_path, change, reason) -> None:
    tampered = _loop(tmp_path / "tampered", client_transforms=[_Tampers(change)])
    with pytest.warns(UserWarning, match=rf"round 0: update of client 1 is dropped: .*{reason}"):
        tampered.fit()
    assert tampered.history[0]["clients"] == [0]
    alone = _loop(tmp_path / "alone", selector=_Only([0]))
    alone.fit()
    expected = alone.global_model.state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in tampered.global_model.state_dict().items())
