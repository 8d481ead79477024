"""The ReRo bounds on reconstruction success (Hayes et al., NeurIPS 2023; Balle et al., S&P 2022)."""

from __future__ import annotations

import math

import pytest
from scipy.stats import norm

from lightning_fl.privacy.reconstruction import rero_dp_sgd, rero_gaussian, rero_rdp


def test_the_gaussian_bound_is_the_blow_up_closed_form() -> None:
    """Hayes et al. (2023, Sec. 3) / Kaissis et al. (2023): gamma = Phi(Phi^-1(kappa) + mu). Derived by hand:
    at kappa = 1/2, Phi^-1(kappa) = 0, so gamma = Phi(mu); at mu = 1.6449, kappa = 0.05: Phi(0) = 1/2."""
    assert rero_gaussian(0.5, 1.0) == pytest.approx(0.841344746, abs=1e-9)
    assert rero_gaussian(0.05, norm.ppf(0.95)) == pytest.approx(0.5, abs=1e-12)
    assert rero_gaussian(0.01, 0.0) == pytest.approx(0.01)


@pytest.mark.parametrize(("kappa", "sigma", "steps"), [(0.5, 1.0, 1), (0.01, 2.0, 4), (0.1, 4.0, 25)])
def test_monte_carlo_without_subsampling_matches_the_closed_form(kappa: float, sigma: float, steps: int) -> None:
    """An independent check: the Monte-Carlo estimate of the blow-up at q = 1 against Phi(Phi^-1(kappa) +
    sqrt(T)/sigma), within 4 standard errors of 50k draws."""
    estimate = rero_dp_sgd(kappa, [(sigma, 1.0, steps)], samples=50_000)
    exact = rero_gaussian(kappa, math.sqrt(steps) / sigma)
    assert estimate == pytest.approx(exact, abs=4 * math.sqrt(exact * (1 - exact) / 50_000) + 2e-3)


def test_subsampling_lowers_the_bound_and_rdp_bounds_it_from_above() -> None:
    full = rero_dp_sgd(0.01, [(2.0, 1.0, 100)], samples=20_000)
    sampled = rero_dp_sgd(0.01, [(2.0, 0.1, 100)], samples=20_000)
    assert 0.01 <= sampled < full  # the target is in a tenth of the batches: less signal
    for history in ([(2.0, 0.1, 100)], [(6.0, 0.2, 300)], [(1.0, 1.0, 1)]):
        tight = rero_dp_sgd(0.01, history, samples=20_000)
        assert tight <= rero_rdp(0.01, history) + 5e-3  # the RDP route (Balle et al., 2022) is looser
    assert rero_dp_sgd(0.01, [(1e3, 1.0, 1)], samples=20_000) == pytest.approx(0.01, abs=3e-3)  # noise: a guess


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="kappa"):
        rero_gaussian(1.5, 1.0)
    with pytest.raises(ValueError, match="sample_rate"):
        rero_dp_sgd(0.1, [(1.0, 0.0, 3)])
