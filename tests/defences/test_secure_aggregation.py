"""Paillier secure aggregation inside a real FederatedLoop (lightning_fl.defences.secure_aggregation.protocol)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
import torch

from lightning_fl import FedAvg, FederatedCallback, FederatedLoop, RoundContext
from lightning_fl.defences.secure_aggregation.paillier import encrypt_tensors, generate_keypair
from lightning_fl.defences.secure_aggregation.protocol import KEY_FIELD, SecureFedAvg
from lightning_fl.messages import ClientUpdate, GroundTruth, ServerView
from tests.conftest import make_classifier, plugin_context
from tests.defences.he_helpers import KEY_SIZE, assert_holds_no_private_key, digits, he_transform, run_loop

PARTIAL = ["backbone.fc.bias"]  # encrypt one small layer only, per value


class RecordingSecureFedAvg(SecureFedAvg):
    """Keeps every update the server received, to inspect what the server holds."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[ClientUpdate] = []

    def aggregate(self, updates: Sequence[ClientUpdate], *, ctx: RoundContext) -> tuple:
        self.received.extend(updates)
        return super().aggregate(updates, ctx=ctx)


class ViewRecorder(FederatedCallback):
    """Records which tensors the server-side attacker gets at the two server leak points."""

    def __init__(self) -> None:
        self.update_keys: list[set[str]] = []
        self.aggregate_keys: list[set[str]] = []

    def on_client_update(self, loop: FederatedLoop, view: ServerView, ground_truth: GroundTruth) -> None:
        self.update_keys.append(set(view.tensors))

    def on_aggregate_end(self, loop: FederatedLoop, view: ServerView, ground_truth: GroundTruth) -> None:
        self.aggregate_keys.append(set(view.tensors))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[FederatedLoop, ViewRecorder]]:
    """The same round three times: plaintext FedAvg, packed Paillier on all layers, per-value on one layer."""
    out = {}
    for name, kwargs in {
        "plain": {"aggregator": FedAvg()},
        "packed": {"aggregator": RecordingSecureFedAvg(), "client_transforms": [he_transform()]},
        "partial": {"aggregator": SecureFedAvg(), "client_transforms": [he_transform(packing=False, layers=PARTIAL)]},
    }.items():
        recorder = ViewRecorder()
        out[name] = (run_loop(tmp_path_factory.mktemp(name), callbacks=[recorder], **kwargs), recorder)
    return out


def public_float_keys(loop: FederatedLoop) -> set[str]:
    return {k for k, v in loop.global_public_state().items() if v.is_floating_point()}


@pytest.mark.parametrize("variant", ["packed", "partial"])
def test_encrypted_fedavg_round_equals_plaintext_fedavg_within_precision(runs: dict, variant: str) -> None:
    plain, encrypted = runs["plain"][0], runs[variant][0]
    step = encrypted.client_transforms[0].spec.step
    assert encrypted.history[0]["he_ciphertexts"] > 0
    for key, value in plain.global_public_state().items():
        error = (value - encrypted.global_public_state()[key]).abs().max().item()
        assert error <= step / 2 + 1e-6, key
    torch.manual_seed(0)
    initial = make_classifier(digits()).state_dict()["backbone.fc.weight"]
    assert (plain.global_public_state()["backbone.fc.weight"] - initial).abs().max() > 1e3 * step  # the round trained


@pytest.mark.parametrize(("variant", "encrypted"), [("plain", set()), ("packed", None), ("partial", set(PARTIAL))])
def test_server_leak_points_see_only_plaintext_layers(runs: dict, variant: str, encrypted: set[str] | None) -> None:
    loop, recorder = runs[variant]
    readable = set() if encrypted is None else public_float_keys(loop) - encrypted
    assert recorder.update_keys == [readable] * 3
    assert recorder.aggregate_keys == [readable]


def prime_bytes(secret: dict[str, str]) -> bytes:
    return secret["p"].encode()  # the client stores the prime as a hex string (pickle keeps it as UTF-8)


def test_server_side_never_holds_or_receives_the_private_key(runs: dict) -> None:
    loop, _ = runs["packed"]
    secret = loop.clients[0].extra[KEY_FIELD]
    assert all(c.extra[KEY_FIELD] == secret for c in loop.clients)  # shared by the key holder with every client
    assert len(loop.aggregator.received) == 3 and all(u.delta == {} for u in loop.aggregator.received)
    for server_object in (loop.aggregator, loop.selector, loop.global_model, loop.server_transforms, loop.history):
        assert_holds_no_private_key(server_object, secret)
    assert_holds_no_private_key(loop.client_transforms[0], secret)  # the transform itself keeps only the public key
    server_checkpoint = torch.load(loop.checkpoint.server_path, weights_only=True)
    assert_holds_no_private_key(server_checkpoint, secret)
    assert prime_bytes(secret) not in loop.checkpoint.server_path.read_bytes()
    assert prime_bytes(secret) not in (loop.output_dir / "summary.json").read_bytes()
    assert prime_bytes(secret) in loop.checkpoint.client_path(0).read_bytes()  # the search does find it client-side


def test_cost_metrics_reach_history_and_loggers(runs: dict) -> None:
    loop, _ = runs["packed"]
    entry = json.loads((loop.output_dir / "summary.json").read_text())["history"][0]
    ciphertext_bytes = 2 * KEY_SIZE // 8
    assert entry["he_upload_bytes"] == entry["he_ciphertexts"] * ciphertext_bytes
    assert entry["he_download_bytes"] == entry["he_ciphertexts"] / 3 * ciphertext_bytes
    assert all(entry[k] > 0 for k in ("he_encrypt_s", "he_aggregate_s", "he_decrypt_s"))
    assert entry["he_clipped_values"] == 0
    header = (loop.output_dir / "logs" / "metrics.csv").read_text().splitlines()[0]
    assert {"he_encrypt_s", "he_aggregate_s", "he_decrypt_s", "he_upload_bytes"} <= set(header.split(","))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"aggregator": FedAvg(), "client_transforms": [he_transform()]}, "FedAvg cannot read Paillier ciphertexts"),
        (
            {"aggregator": SecureFedAvg(), "client_transforms": [he_transform(max_weight_sum=100)]},
            r"max_weight_sum=100\) is below the \d+ that SecureFedAvg may apply",
        ),
        (
            {"aggregator": SecureFedAvg(), "client_transforms": [he_transform(layers=["head.*"])]},
            r"layers=\[..., 'head.\*', ...\]\) matches no public layer",
        ),
        ({"aggregator": SecureFedAvg(), "client_transforms": [he_transform(key_holder=3)]}, "key_holder=3"),
    ],
)
def test_paillier_encryption_rejects_bad_configuration_before_training(tmp_path, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        run_loop(tmp_path, **kwargs)
    assert not (tmp_path / "summary.json").exists()


def test_paillier_encryption_rejects_packing_that_cannot_fit_the_key() -> None:
    with pytest.raises(ValueError, match=r"needs \d+-bit slots"):
        he_transform(precision_bits=40, value_bound=1.0, max_weight_sum=2**500)


def test_secure_fedavg_rejects_ciphertexts_of_foreign_layers() -> None:
    spec = he_transform().spec
    payload = encrypt_tensors({"w": torch.zeros(4)}, public_key=generate_keypair(spec=spec)[0], spec=spec)
    update = ClientUpdate(0, 0, {}, 10, 1.0, payload=payload)
    with pytest.raises(ValueError, match=r"client 0 sent ciphertexts for \['w'\] that do not match"):
        SecureFedAvg().aggregate([update], ctx=plugin_context({"w": torch.zeros(5)}))
