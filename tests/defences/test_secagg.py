"""SecAgg by pairwise masking (Bonawitz et al., CCS 2017): masks cancel, dropouts are recovered, inputs stay hidden."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_fl import ClientUpdate, FedAvg
from lightning_fl.defences import SecAggMasking, SecAggSum
from lightning_fl.defences.secure_aggregation.masking import decode, shamir_reconstruct, shamir_share
from lightning_fl.defences.secure_aggregation.secagg import MaskedInput
from lightning_fl.private import public_state
from tests.conftest import load_benchmark, plugin_context

CLIENTS = [0, 1, 2, 3, 4]


def _updates() -> list[ClientUpdate]:
    generator = torch.Generator().manual_seed(0)
    return [
        ClientUpdate(
            k, 0, {"b": torch.randn(3, generator=generator), "w": torch.randn(4, 2, generator=generator)}, n, 0.0
        )
        for k, n in zip(CLIENTS, (7, 12, 30, 5, 18), strict=True)
    ]


def _masked(protocol: SecAggMasking, updates: list[ClientUpdate]) -> list[ClientUpdate]:
    protocol.setup_round(0, CLIENTS)
    return [protocol(u, ctx=plugin_context(client_id=u.client_id, num_clients=5, clients_per_round=5)) for u in updates]


@pytest.mark.parametrize("holders", [(0, 1, 2), (1, 3, 4), (0, 1, 2, 3, 4)])
def test_shamir_rebuilds_the_secret_from_any_threshold_shares(holders: tuple[int, ...]) -> None:
    secret = 2**255 + 12345
    shares = shamir_share(secret, holders=CLIENTS, threshold=3)
    assert shamir_reconstruct({h: shares[h] for h in holders}) == secret
    assert shamir_reconstruct({h: shares[h] for h in holders[:2]}) != secret  # t - 1 shares: a random value


@pytest.mark.parametrize("dropped", [(), (3,), (1, 4)])
def test_secagg_sum_equals_fedavg_over_the_survivors(dropped: tuple[int, ...]) -> None:
    protocol = SecAggMasking()
    updates = _updates()
    received = [u for u in _masked(protocol, updates) if u.client_id not in dropped]
    aggregate, metrics = SecAggSum(protocol).aggregate(received, ctx=None)
    expected = FedAvg().aggregate([u for u in updates if u.client_id not in dropped], ctx=None)[0]
    torch.testing.assert_close(aggregate, expected, rtol=0, atol=1e-6)
    assert metrics["secagg_dropped"] == len(dropped)


def test_a_single_masked_update_reveals_nothing_of_its_values() -> None:
    protocol = SecAggMasking()
    updates = _updates()
    sent = _masked(protocol, updates)
    assert all(u.delta == {} and isinstance(u.payload, MaskedInput) for u in sent)
    values = torch.cat([updates[2].delta[k].flatten() for k in sorted(updates[2].delta)]).double()
    read = decode(sent[2].payload.masked, precision_bits=protocol.precision_bits, bits=protocol.bits) / 30
    assert (read - values).abs().min() > 1e3  # uniform in the ring: every value is off by ~2^37 on average
    unmasked_pair = sum(u.payload.masked for u in sent[:2])  # two clients' masks do not cancel either
    assert decode(unmasked_pair % 2**protocol.bits, precision_bits=24, bits=62).abs().min() > 1e3


def test_secagg_aborts_below_the_threshold() -> None:
    protocol = SecAggMasking(threshold=0.5)  # t = 3 of 5
    received = _masked(protocol, _updates())[:2]
    with pytest.raises(ValueError, match="2 clients survived, fewer than the threshold t=3"):
        SecAggSum(protocol).aggregate(received, ctx=None)


def test_a_client_never_reveals_both_secrets_of_one_client() -> None:
    protocol = SecAggMasking()
    _masked(protocol, _updates())
    with pytest.raises(ValueError, match=r"refuses to unmask: \[2\]"):
        protocol.unmasking_response(0, dropped=[2], survivors=[0, 1, 2])


@pytest.mark.parametrize(("kwargs", "match"), [({"threshold": 0.4}, "threshold=0.4"), ({"bits": 30}, "bits=30")])
def test_secagg_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SecAggMasking(**kwargs)


def test_quickstart_with_a_dropout_ends_with_the_fedavg_model_of_the_survivors(tmp_path: Path) -> None:
    """The quickstart's federation at 16x16 for 2 rounds of 3 steps; round 0's last selected client fails."""
    bench = load_benchmark("secagg_dropout")
    loops = []
    for name, defences in (("secagg", [SecAggMasking()]), ("plain", [])):
        with pytest.warns(UserWarning, match="failed and is dropped"):
            loops.append(bench.fit(defences, 2, 0, tmp_path / name, image_size=16, local_steps=3))
    secure, plain = loops
    assert secure.history[0]["secagg_dropped"] == 1 and len(secure.history[0]["clients"]) == 4
    for key, value in public_state(plain.global_model).items():
        torch.testing.assert_close(public_state(secure.global_model)[key], value, rtol=0, atol=1e-5)
