"""Per-example DP (Fed-CDP, DP-SGD) on the vectorised clients: the sequential path's clipping, noise and epsilon."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch

from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import ClientDPSGD, FedCDP, PerExampleDP
from lightning_fl.federation.vectorised_contract import vectorised_refusal
from lightning_fl.federation.vectorised_dp import DPClient, DPClientFit, StackedDPSGD, dp_callbacks_refusal
from lightning_fl.federation.vectorised_fit import fit_stacked, stacked_copy
from lightning_fl.federation.vectorised_optim import StackedOptimizer
from lightning_fl.privacy import Schedule
from lightning_fl.privacy.accounting import PrivacyAccountant
from lightning_fl.privacy.sampling import PoissonBatchSampler
from tests.conftest import make_classifier
from tests.federation.test_vectorised import _run as run_federation
from tests.federation.test_vectorised import random_client_batches

DELTA_TOLERANCE = 1e-5
"""How close a vectorised DP update is to the sequential one, relative to its L2 norm (float32 sums in another
order: 1e-6 measured with noise 0, 1.5e-7 with the noise, which draws the same values on both paths)."""
CLIP = 0.05
"""A clip bound far below this model's per-example gradient norms, so that clipping binds on every example."""
DECAY = {
    "noise_multiplier": 1.0,
    "max_grad_norm": Schedule(0.1, end=0.02, kind="linear", num_rounds=2),
    "accounting": "federation",
    "steps_offset": 1,
}
"""Fed-CDP(decay) with Fed-CDP's federation-level accounting (Table VI): a clip bound per round, one accountant."""


def _run(tmp_path: Path, vectorize, defence, *, batch_size: int = 24, loop_options=None, client_callbacks=()):
    """Two rounds of 3 of 6 digit clients (SGD 0.5), as tests/federation/test_vectorised.py runs them."""
    options = {"batch_size": batch_size, "client_callbacks": client_callbacks, "loop_options": loop_options}
    defences = [defence] if defence is not None else []
    return run_federation(
        tmp_path, vectorize, model_options={"optimizer": "sgd", "lr": 0.5}, defences=defences, **options
    )


def _relative_difference(a, b) -> float:
    difference = torch.cat([(b.delta[k] - a.delta[k]).flatten() for k in a.delta])
    return float(difference.norm() / torch.cat([a.delta[k].flatten() for k in a.delta]).norm())


@pytest.fixture
def poisson_sizes(monkeypatch):
    """The size of every Poisson batch drawn (both paths draw them through ``PoissonBatchSampler``)."""
    sizes = []
    draw = PoissonBatchSampler.__iter__

    def recording(self):
        for batch in draw(self):
            sizes.append(len(batch))
            yield batch

    monkeypatch.setattr(PoissonBatchSampler, "__iter__", recording)
    return sizes


@pytest.mark.parametrize(
    ("options", "batch_size"),
    [
        ({"noise_multiplier": 0.0, "clipping": "per_layer", "noise_scaling": "per_example"}, 24),
        ({"noise_multiplier": 0.0, "clipping": "flat", "noise_scaling": "per_batch"}, 24),
        ({"noise_multiplier": 1.0, "clipping": "per_layer", "noise_scaling": "per_example"}, 24),
        ({"noise_multiplier": 1.0, "clipping": "flat", "noise_scaling": "per_batch"}, 2),  # empty batches: 13 % a step
        ({"noise_multiplier": 1.0, "clipping": "flat", "sampling": "shuffled_batches"}, 24),
        (DECAY, 24),
    ],
    ids=["no_noise_per_layer", "no_noise_flat", "fed_cdp", "dp_sgd_empty_batches", "shuffled_batches", "decay"],
)
def test_vectorised_dp_matches_the_sequential_updates_and_epsilon(
    tmp_path: Path, options: dict, batch_size: int, poisson_sizes: list[int]
) -> None:
    runs = {}
    for vectorize in (False, True):
        defence = ClientDPSGD(**{"max_grad_norm": CLIP, **options})
        steps = {"local_steps": 12} if batch_size == 2 else None
        runs[vectorize] = _run(tmp_path, vectorize, defence, batch_size=batch_size, loop_options=steps)
    (loop_s, updates_s), (loop_v, updates_v) = runs[False], runs[True]
    assert loop_v.vectorised._stacked is not None  # the DP clients trained stacked
    assert [u.client_id for u in updates_s] == [u.client_id for u in updates_v]
    for a, b in zip(updates_s, updates_v, strict=True):
        assert _relative_difference(a, b) < DELTA_TOLERANCE
        assert b.loss == pytest.approx(a.loss, rel=1e-5)
        assert (b.num_samples, b.metadata) == (a.num_samples, a.metadata)
    for a, b in zip(loop_s.history, loop_v.history, strict=True):
        assert b["epsilon"] == a["epsilon"]  # the same accountant steps, to the bit
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)
    assert loop_v.clients[updates_v[0].client_id].extra == loop_s.clients[updates_s[0].client_id].extra
    assert math.isfinite(loop_v.history[-1]["epsilon"]) == (options["noise_multiplier"] > 0)
    if batch_size == 2:
        assert poisson_sizes.count(0) >= 4  # empty Poisson batches were trained on both paths (noise only)


def test_vectorised_dp_clipping_binds(tmp_path: Path) -> None:
    """With noise 0 the updates compared above depend on the clip bound: clipped and unclipped training differ."""
    updates = {}
    for bound in (CLIP, 1e6):
        defence = ClientDPSGD(noise_multiplier=0.0, max_grad_norm=bound, clipping="per_layer")
        updates[bound] = _run(tmp_path / str(bound), True, defence, loop_options={"num_rounds": 1})[1]
    assert min(_relative_difference(a, b) for a, b in zip(updates[1e6], updates[CLIP], strict=True)) > 0.3


@pytest.mark.parametrize("noise_scaling", ["per_example", "per_batch"])
def test_vectorised_dp_noise_std_is_the_sequential_one(tmp_path: Path, noise_scaling: str) -> None:
    r"""One SGD step (lr 0.5) with and without noise from the same start and batch: the difference of the updates is
    the noise alone, of std :math:`0.5\,\sigma C\sqrt B/B` per coordinate with ``per_example`` (Fed-CDP Alg. 2 line
    14: :math:`\mathcal N(0, \sigma^2C^2)` on each example's clipped gradient, per layer) and :math:`0.5\,\sigma C/B`
    with ``per_batch`` (one draw per batch)."""
    sigma, batch_size, steps = 2.0, 24, {"local_steps": 1, "num_rounds": 1}
    updates = {}
    for noise in (0.0, sigma):
        defence = FedCDP(noise_multiplier=noise, max_grad_norm=CLIP, noise_scaling=noise_scaling)
        updates[noise] = _run(tmp_path / str(noise), True, defence, batch_size=batch_size, loop_options=steps)[1]
    per_example = math.sqrt(batch_size) if noise_scaling == "per_example" else 1.0
    expected = 0.5 * sigma * CLIP * per_example / batch_size
    noise = torch.cat(
        [
            (b.delta[k] - a.delta[k]).flatten()
            for a, b in zip(updates[0.0], updates[sigma], strict=True)
            for k in a.delta
        ]
    )
    assert len(noise) > 25_000  # 3 clients' parameters: the std is known to within ~1 %
    assert float(noise.std()) == pytest.approx(expected, rel=0.03)
    assert abs(float(noise.mean())) < 0.03 * expected


def _tapped() -> PerExampleDP:
    dp = PerExampleDP(seed=0)
    dp.release = lambda *args: None  # what LeakPoints.with_tap sets when an attack listens at the type-2 leak point
    return dp


@pytest.mark.parametrize(
    ("callbacks", "reason"),
    [
        (lambda: [PerExampleDP()], "PerExampleDP(seed=None)"),
        (lambda: [PerExampleDP(seed=0), PerExampleDP(seed=1)], "client callbacks ['PerExampleDP']"),
        (lambda: [_tapped()], "taps the DP-noised local gradient"),
    ],
    ids=["unseeded", "two_dp_callbacks", "type2_tap"],
)
def test_dp_callbacks_refusal_says_why(callbacks, reason: str) -> None:
    assert reason in dp_callbacks_refusal(callbacks())


def test_vectorised_refusal_of_dp_models() -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=32)
    dp = [PerExampleDP(seed=0)]
    assert vectorised_refusal(make_classifier(dm), options={"accelerator": "cpu"}, callbacks=dp) is None
    alexnet = make_classifier(dm, backbone="alexnet")  # ReLU(inplace=True) changes the convolutions' outputs
    assert "works in place" in vectorised_refusal(alexnet, options={"accelerator": "cpu"}, callbacks=dp)
    assert vectorised_refusal(alexnet, options={"accelerator": "cpu"}) is None  # without DP it qualifies


def test_vectorize_true_with_unseeded_per_example_dp_warns_and_trains_one_by_one(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loop, _ = _run(tmp_path, True, None, loop_options={"num_rounds": 1}, client_callbacks=[PerExampleDP()])
    said = [str(w.message) for w in caught if "loop.vectorize" in str(w.message)]
    assert len(said) == 1 and "PerExampleDP(seed=None)" in said[0]
    assert loop.vectorised._stacked is None  # trained one by one


def test_padded_grouped_dp_fit_matches_the_per_client_fit() -> None:
    """The GPU form with per-example DP: padded rows and empty batches (Poisson) add nothing but each client's noise."""
    data = random_client_batches([[8, 0, 3], [5, 6], [0]])
    torch.manual_seed(0)
    model = make_classifier(FederatedDataModule("digits", num_clients=2, image_size=16), optimizer="sgd", lr=0.1)
    starts = [{name: value.detach().clone() for name, value in model.named_parameters()}] * 3
    names = {id(v): n for n, v in model.named_parameters()}
    dp = PerExampleDP(noise_multiplier=1.0, max_grad_norm=CLIP, clipping="per_layer")
    outcomes = {}
    for grouped in (False, True):
        optimizer = StackedOptimizer.like(model.configure_optimizers(), names)
        clients = []
        for k in range(3):
            dp.seed = k
            fit = DPClientFit.of(dp)
            loader = torch.utils.data.DataLoader(range(8), batch_size=4)
            clients.append(DPClient.start(dp, fit, loader, num_tensors=8, device=torch.device("cpu"))[0])
        stacked = StackedDPSGD(clients, optimizer.names, clipping="per_layer")
        outcomes[grouped] = fit_stacked(
            stacked_copy(model), starts, data, optimizer, device=torch.device("cpu"), grouped=grouped, dp=stacked
        )
    for a, b in zip(outcomes[False], outcomes[True], strict=True):
        assert a.steps == b.steps
        for key, value in a.state.items():
            torch.testing.assert_close(b.state[key], value, rtol=1e-4, atol=1e-6)
    moved = max(float((outcomes[True][2].state[k] - starts[2][k]).abs().max()) for k in starts[2])
    assert moved > 1e-4  # the client whose one batch is empty moved by its noise alone


def test_dp_client_accounts_every_step_like_the_dp_optimiser() -> None:
    accountant = PrivacyAccountant("rdp")
    dp = PerExampleDP(noise_multiplier=1.0, max_grad_norm=1.0, seed=0)
    dp.privacy_accountant = accountant
    loader = torch.utils.data.DataLoader(range(40), batch_size=4)
    client, poisson = DPClient.start(dp, DPClientFit.of(dp), loader, num_tensors=2, device=torch.device("cpu"))
    assert isinstance(poisson.batch_sampler, PoissonBatchSampler) and len(poisson) == len(loader)
    client.account(10)
    expected = PrivacyAccountant("rdp")
    for _ in range(10):
        expected.step(noise_multiplier=1.0, sample_rate=0.1)
    assert accountant.state_dict() == expected.state_dict()
