"""Paillier encoding, packing and homomorphic arithmetic (lightning_fl.defences.secure_aggregation.paillier)."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch

from lightning_fl.defences.secure_aggregation.paillier import (
    PackingSpec,
    decode_values,
    decrypt_tensors,
    encode_values,
    encrypt_tensors,
    generate_keypair,
    private_key_from_state,
    private_key_state,
    weighted_sum,
)

KEY_SIZE = 512  # tests only: small keys are fast and insecure (PackingSpec warns)


def small_spec(**overrides: object) -> PackingSpec:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PackingSpec(**{"key_size": KEY_SIZE, "max_weight_sum": 8, **overrides})


@pytest.fixture(scope="module")
def keys() -> tuple:
    return generate_keypair(spec=small_spec())


def client_tensors(seed: int) -> dict[str, torch.Tensor]:
    """Update-like tensors with both signs, one entry at each end of the bound."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(7, 5, generator=generator)
    weight[0, 0], weight[0, 1] = 4.0, -4.0
    return {"weight": weight, "bias": -0.01 * torch.rand(3, generator=generator)}


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"precision_bits": 40, "max_weight_sum": 2**500}, r"needs \d+-bit slots .* lower precision_bits"),
        ({"key_size": 128, "precision_bits": 30, "max_weight_sum": 2**100}, r"at most 127 bits"),
        ({"precision_bits": 60}, r"float64 mantissa"),
        ({"key_size": 64}, r"key_size=64\) must be >= 128"),
        ({"precision_bits": 0}, r"precision_bits=0\) must be >= 1"),
        ({"value_bound": 0.0}, r"value_bound=0.0\) must be a finite number > 0"),
        ({"max_weight_sum": 0}, r"max_weight_sum=0\) must be >= 1"),
    ],
)
def test_packing_spec_rejects_budget_that_cannot_be_met(overrides: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        small_spec(**overrides)


def test_packing_spec_warns_on_small_key() -> None:
    with pytest.warns(UserWarning, match=r"key_size=512\) is below 2048 bits"):
        PackingSpec(key_size=512, max_weight_sum=1)


def test_packing_spec_default_layout_packs_51_values_per_2048_bit_plaintext() -> None:
    spec = PackingSpec()  # 1 + 2 + 20 value bits (+-4 at 2^-20) and 16 headroom bits
    assert (spec.slot_bits, spec.slots) == (40, 51)
    assert dataclasses.replace(spec, packing=False).slots == 1


@pytest.mark.parametrize("packing", [True, False])
def test_encode_decode_round_trip_within_half_step(packing: bool) -> None:
    spec = small_spec(packing=packing)
    values = 7.8 * torch.rand(1001, generator=torch.Generator().manual_seed(0), dtype=torch.float64) - 3.9
    plaintexts = encode_values(values, spec=spec)
    assert len(plaintexts) == -(-1001 // spec.slots)
    decoded = decode_values(plaintexts, spec=spec, count=1001)
    assert (decoded - values).abs().max() <= spec.step / 2


def test_encode_clips_to_value_bound() -> None:
    spec = small_spec(value_bound=1.0)
    decoded = decode_values(encode_values(torch.tensor([-3.0, 0.5, 2.0]), spec=spec), spec=spec, count=3)
    assert decoded.tolist() == [-1.0, 0.5, 1.0]


def test_encode_rejects_non_finite_values() -> None:
    with pytest.raises(ValueError, match="non-finite"):
        encode_values(torch.tensor([0.0, math.nan]), spec=small_spec())


@pytest.mark.parametrize("packing", [True, False])
def test_encrypt_decrypt_round_trip_keeps_names_shapes_and_signs(keys: tuple, packing: bool) -> None:
    public_key, private_key = keys
    spec = small_spec(packing=packing)
    tensors = client_tensors(0)
    encrypted = encrypt_tensors(tensors, public_key=public_key, spec=spec)
    assert len(encrypted.ciphertexts) == -(-38 // spec.slots)
    decrypted = decrypt_tensors(encrypted, private_key=private_key)
    assert list(decrypted) == ["weight", "bias"]
    for name, value in tensors.items():
        assert decrypted[name].shape == value.shape
        assert (decrypted[name] - value).abs().max() <= spec.step / 2 + 1e-7


@pytest.mark.parametrize("packing", [True, False])
@pytest.mark.parametrize(("weights", "normaliser"), [([3, 1, 2], 6), ([1, 1, 1], 1), ([8, 0, 0], 8)])
def test_weighted_sum_equals_plaintext_within_precision(
    keys: tuple, packing: bool, weights: list[int], normaliser: int
) -> None:
    public_key, private_key = keys
    spec = small_spec(packing=packing)
    updates = [client_tensors(seed) for seed in range(3)]
    encrypted = [encrypt_tensors(u, public_key=public_key, spec=spec) for u in updates]
    result = decrypt_tensors(weighted_sum(encrypted, weights=weights, normaliser=normaliser), private_key=private_key)
    bound = spec.step / 2 * sum(weights) / normaliser + 1e-6
    for name in updates[0]:
        expected = sum(w * u[name].double() for w, u in zip(weights, updates, strict=True)) / normaliser
        assert (result[name].double() - expected).abs().max() <= bound


def test_weighted_sum_of_extremes_at_full_headroom_does_not_overflow(keys: tuple) -> None:
    public_key, private_key = keys
    spec = small_spec(value_bound=1.0, max_weight_sum=8)
    highs = encrypt_tensors({"w": torch.ones(40)}, public_key=public_key, spec=spec)
    lows = encrypt_tensors({"w": -torch.ones(40)}, public_key=public_key, spec=spec)
    summed = weighted_sum([highs, highs], weights=[5, 3], normaliser=1)  # every slot at its maximum 2*o*8
    assert decrypt_tensors(summed, private_key=private_key)["w"].tolist() == [8.0] * 40
    summed = weighted_sum([lows, highs], weights=[7, 1], normaliser=1)
    assert decrypt_tensors(summed, private_key=private_key)["w"].tolist() == [-6.0] * 40


def test_weighted_sum_rejects_weights_beyond_headroom(keys: tuple) -> None:
    public_key, _ = keys
    encrypted = encrypt_tensors({"w": torch.zeros(3)}, public_key=public_key, spec=small_spec(max_weight_sum=8))
    with pytest.raises(ValueError, match=r"sum to 9, beyond the packing headroom max_weight_sum=8"):
        weighted_sum([encrypted, encrypted], weights=[4, 5], normaliser=9)


@pytest.mark.parametrize(
    ("weights", "match"),
    [([1, -1], "non-negative integers"), ([0, 0], "not all zero"), ([0.5, 1], "integers"), ([1], "2 encrypted")],
)
def test_weighted_sum_rejects_invalid_weights(keys: tuple, weights: list, match: str) -> None:
    public_key, _ = keys
    encrypted = encrypt_tensors({"w": torch.zeros(3)}, public_key=public_key, spec=small_spec())
    with pytest.raises(ValueError, match=match):
        weighted_sum([encrypted, encrypted], weights=weights, normaliser=1)


def test_weighted_sum_rejects_different_keys_and_layouts(keys: tuple) -> None:
    public_key, _ = keys
    other_key, _ = generate_keypair(spec=small_spec())
    spec = small_spec()
    a = encrypt_tensors({"w": torch.zeros(3)}, public_key=public_key, spec=spec)
    with pytest.raises(ValueError, match="different public keys"):
        weighted_sum(
            [a, encrypt_tensors({"w": torch.zeros(3)}, public_key=other_key, spec=spec)], weights=[1, 1], normaliser=2
        )
    with pytest.raises(ValueError, match="different layouts"):
        weighted_sum(
            [a, encrypt_tensors({"v": torch.zeros(3)}, public_key=public_key, spec=spec)], weights=[1, 1], normaliser=2
        )


def test_decrypt_rejects_foreign_private_key(keys: tuple) -> None:
    public_key, _ = keys
    _, other_private = generate_keypair(spec=small_spec())
    encrypted = encrypt_tensors({"w": torch.zeros(3)}, public_key=public_key, spec=small_spec())
    with pytest.raises(ValueError, match="does not match"):
        decrypt_tensors(encrypted, private_key=other_private)


def test_private_key_state_is_strings_that_torch_loads_safely(keys: tuple, tmp_path) -> None:
    _, private_key = keys
    torch.save(private_key_state(private_key), tmp_path / "key.pt")
    restored = private_key_from_state(torch.load(tmp_path / "key.pt", weights_only=True))
    assert restored == private_key
