import numpy as np
import pytest
from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

from lightning_fl.privacy import PrivacyAccountant, PureDPAccountant, calibrate_noise_multiplier, classic_rdp_epsilon
from tests.privacy.paper_tables import FED_CDP_TABLE_VI as TABLE_VI


@pytest.mark.parametrize(("row", "steps", "q", "paper"), TABLE_VI, ids=[r[0] for r in TABLE_VI])
def test_classic_accountant_reproduces_fed_cdp_table_vi(row: str, steps: int, q: float, paper: float) -> None:
    accountant = PrivacyAccountant("rdp", conversion="classic")
    accountant.step(noise_multiplier=6.0, sample_rate=q, steps=steps)
    assert accountant.get_epsilon(1e-5) == pytest.approx(paper, abs=2e-4)


def test_steps_recorded_one_by_one_equal_steps_recorded_at_once() -> None:
    one_by_one, at_once = PrivacyAccountant(), PrivacyAccountant()
    for _ in range(50):
        one_by_one.step(noise_multiplier=1.1, sample_rate=0.02)
    at_once.step(noise_multiplier=1.1, sample_rate=0.02, steps=50)
    assert one_by_one.history == at_once.history == [(1.1, 0.02, 50)]


@pytest.mark.parametrize(("name", "opacus_cls"), [("rdp", RDPAccountant), ("prv", PRVAccountant)])
def test_accountant_matches_opacus_directly(name: str, opacus_cls) -> None:
    ours, theirs = PrivacyAccountant(name), opacus_cls()
    for sigma, q, steps in [(1.0, 0.01, 300), (2.0, 0.05, 40)]:
        ours.step(noise_multiplier=sigma, sample_rate=q, steps=steps)
        for _ in range(steps):
            theirs.step(noise_multiplier=sigma, sample_rate=q)
    assert ours.get_epsilon(1e-5) == pytest.approx(theirs.get_epsilon(delta=1e-5), rel=1e-6)


def test_classic_conversion_is_looser_than_opacus_improved_one() -> None:
    classic = classic_rdp_epsilon(history=[(6.0, 0.01, 10000)], delta=1e-5)
    improved = PrivacyAccountant("rdp")
    improved.step(noise_multiplier=6.0, sample_rate=0.01, steps=10000)
    assert classic == pytest.approx(0.82273, abs=1e-4)
    assert improved.get_epsilon(1e-5) < classic


def test_heterogeneous_history_adds_rdp() -> None:
    history = [(6.0, 0.01, 500), (3.0, 0.01, 500)]
    both = classic_rdp_epsilon(history=history, delta=1e-5)
    assert classic_rdp_epsilon(history=history[:1], delta=1e-5) < both
    assert both < classic_rdp_epsilon(history=[(3.0, 0.01, 1000)], delta=1e-5)


def test_epsilon_after_projects_without_recording_and_state_round_trips() -> None:
    accountant = PrivacyAccountant()
    accountant.step(noise_multiplier=1.0, sample_rate=0.1, steps=10)
    projected = accountant.epsilon_after(delta=1e-5, noise_multiplier=1.0, sample_rate=0.1, steps=10)
    assert len(accountant.history) == 1 and accountant.history[0][2] == 10
    restored = PrivacyAccountant()
    restored.load_state_dict(accountant.state_dict())
    restored.step(noise_multiplier=1.0, sample_rate=0.1, steps=10)
    assert restored.get_epsilon(1e-5) == pytest.approx(projected)


def test_calibrated_noise_meets_the_target_like_opacus() -> None:
    sigma = calibrate_noise_multiplier(target_epsilon=2.0, delta=1e-5, sample_rate=0.05, steps=200)
    assert sigma == get_noise_multiplier(target_epsilon=2.0, target_delta=1e-5, sample_rate=0.05, steps=200)
    accountant = PrivacyAccountant()
    accountant.step(noise_multiplier=sigma, sample_rate=0.05, steps=200)
    assert 1.95 <= accountant.get_epsilon(1e-5) <= 2.0


def test_pure_dp_composes_sequentially() -> None:
    accountant = PureDPAccountant()
    for epsilon in np.full(4, 0.5):
        accountant.step(epsilon=float(epsilon))
    assert accountant.get_epsilon() == 2.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"accountant": "gdp"}, "unknown"),
        ({"conversion": "tight"}, "unknown"),
        ({"accountant": "prv", "conversion": "classic"}, "RDP"),
    ],
)
def test_accountant_rejects_bad_options(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PrivacyAccountant(**kwargs)


def test_load_state_dict_names_missing_key() -> None:
    with pytest.raises(KeyError, match="history"):
        PrivacyAccountant().load_state_dict({})
