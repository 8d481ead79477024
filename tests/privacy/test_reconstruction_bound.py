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


def test_dp_sgd_on_mnist_matches_the_published_gaussian_dp_of_its_setting() -> None:
    """A published value: DP-SGD on MNIST with sample rate 256/60000, noise multiplier 1.06 and 20 epochs is
    0.35-GDP by the central limit theorem of Bu et al. (HDSR 2020, Fig. 4; Dong et al., JRSS-B 2022). A mu-GDP
    mechanism's tight ReRo bound is Phi(Phi^-1(kappa) + mu) (Kaissis et al., 2023), so at kappa = 0.1 the bound
    is 0.176, against 0.1 for the guess. The Monte-Carlo estimate of the subsampled mechanism (4688 steps, the
    target in each batch with probability q) must agree within its error (4 standard errors of 10k draws) plus the
    CLT's own; a bound that ignored subsampling would be ~1."""
    steps = round(20 * 60000 / 256)
    estimate = rero_dp_sgd(0.1, [(1.06, 256 / 60000, steps)], samples=10_000)
    published = rero_gaussian(0.1, 0.35)
    assert published == pytest.approx(0.1758, abs=1e-4)
    assert estimate == pytest.approx(published, abs=0.02)


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
