r"""Upper bounds on the success of any reconstruction attack against DP-SGD: reconstruction robustness (ReRo).

A mechanism :math:`M` is :math:`(\eta, \gamma)`-ReRo for a prior :math:`\pi` over the target example when no
adversary, given the output and every other training example, outputs a reconstruction within :math:`\eta` of the
target with probability above :math:`\gamma` (Balle, Cherubin & Hayes, "Reconstructing Training Data with Informed
Adversaries", IEEE S&P 2022, Def. 2). :math:`\kappa = \kappa_{\pi}(\eta)` is the baseline: the success probability
of the best guess that never sees the output.

* :func:`rero_gaussian`: the tight bound for a Gaussian mechanism of sensitivity-to-noise ratio :math:`\mu`
  (DP-SGD without subsampling, :math:`\mu = \sqrt T/\sigma`): :math:`\gamma = \Phi(\Phi^{-1}(\kappa) + \mu)`, the
  blow-up function of the pair :math:`(\mathcal N(\mu, 1), \mathcal N(0, 1))` (Hayes, Mahloujifar & Balle,
  "Bounding Training Data Reconstruction in DP-SGD", NeurIPS 2023, Sec. 3, with Neyman–Pearson's likelihood-ratio
  sets; the closed form is Kaissis et al., 2023, for the Gaussian mechanism).
* :func:`rero_dp_sgd`: the same blow-up bound :math:`\gamma = \mathcal B_\kappa(\mu, \nu) = \sup\{\mu(E) :
  \nu(E) \le \kappa\}` for DP-SGD with Poisson sampling rate :math:`q` over :math:`T` steps, estimated by Monte
  Carlo as Hayes et al. (2023, Sec. 3.2) do: :math:`\nu = \mathcal N(0, \sigma^2)^{\otimes T}` (the target's
  clipped gradient absent), :math:`\mu = ((1-q)\mathcal N(0, \sigma^2) + q\,\mathcal N(1, \sigma^2))^{\otimes T}`
  (present in each batch with probability :math:`q`), the threshold of the log-likelihood ratio set at :math:`\nu`'s
  :math:`(1-\kappa)` quantile, its probability under :math:`\mu` counted.
* :func:`rero_rdp`: the looser bound from Rényi DP of Balle et al. (2022, their theorem that RDP implies ReRo): an
  :math:`(\alpha, \epsilon)`-RDP mechanism is :math:`(\eta, \gamma)`-ReRo with
  :math:`\gamma = (\kappa e^{\epsilon})^{(\alpha - 1)/\alpha}`, minimised over the orders of the subsampled
  Gaussian's RDP curve (Mironov et al., 2019).

A mechanism is given as a ``history`` of ``(noise_multiplier, sample_rate, steps)`` triples, as
:class:`~lightning_fl.privacy.accounting.PrivacyAccountant` keeps it: ``noise_multiplier`` is the noise std over the
clip norm of the whole gradient (Opacus' multiplier).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import norm

__all__ = ["rero_dp_sgd", "rero_gaussian", "rero_rdp"]

History = Sequence[tuple[float, float, int]]
_ORDERS = (1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 32.0, 64.0, 128.0, 256.0)


def _check(kappa: float, history: History) -> None:
    if not 0.0 <= kappa <= 1.0:
        raise ValueError(f"kappa={kappa}: the prior's baseline success probability lies in [0, 1].")
    for sigma, q, steps in history:
        if sigma <= 0 or not 0 < q <= 1 or steps < 0:
            raise ValueError(
                f"history entry (noise_multiplier={sigma}, sample_rate={q}, steps={steps}): need sigma > 0, "
                "0 < q <= 1 and steps >= 0."
            )


def rero_gaussian(kappa: float, mu: float) -> float:
    r"""The tight ReRo bound :math:`\Phi(\Phi^{-1}(\kappa) + \mu)` of a Gaussian mechanism with sensitivity over
    noise std :math:`\mu` (Hayes et al., NeurIPS 2023, Sec. 3; Kaissis et al., 2023).

    Example:
        >>> round(rero_gaussian(0.5, 1.0), 4)  # Phi(1)
        0.8413
        >>> rero_gaussian(0.01, 0.0)  # no signal: the guess's own success
        0.01
    """
    _check(kappa, [])
    if kappa in (0.0, 1.0):
        return kappa
    return float(norm.cdf(norm.ppf(kappa) + mu))


def rero_dp_sgd(kappa: float, history: History, *, samples: int = 50_000, seed: int = 0) -> float:
    r"""Monte-Carlo estimate of the tight ReRo bound of DP-SGD (Hayes et al., NeurIPS 2023, Sec. 3.2).

    The log-likelihood ratio of one step is :math:`\log(1 - q + q\,e^{(2x - 1)/(2\sigma^2)})`; steps add. The
    threshold is the :math:`(1-\kappa)` quantile of the ratio under :math:`\nu` (``samples`` draws), the bound the
    share of ``samples`` draws from :math:`\mu` above it. With :math:`q = 1` it is :func:`rero_gaussian` at
    :math:`\mu = \sqrt{\sum_t 1/\sigma_t^2}`, up to Monte-Carlo error (about :math:`1/\sqrt{\text{samples}}`).

    Args:
        kappa: the baseline success probability of the prior.
        history: ``(noise_multiplier, sample_rate, steps)`` triples of the steps the target may be in.
        samples: draws from each of :math:`\mu` and :math:`\nu`.
        seed: the draws' generator seed.

    Raises:
        ValueError: on a kappa outside [0, 1] or a history entry out of range.

    Example:
        >>> round(rero_dp_sgd(0.5, [(1.0, 1.0, 1)], samples=100_000), 2)
        0.84
    """
    _check(kappa, history)
    if kappa in (0.0, 1.0) or not any(steps for _, _, steps in history):
        return kappa
    rng = np.random.default_rng(seed)
    log_ratio = {"nu": np.zeros(samples), "mu": np.zeros(samples)}
    for sigma, q, steps in history:
        for _ in range(steps):
            for name in log_ratio:
                x = rng.normal(0.0, sigma, samples)
                if name == "mu":
                    x += rng.random(samples) < q  # the target's clipped gradient (norm 1) in this batch
                z = (2.0 * x - 1.0) / (2.0 * sigma**2)
                log_ratio[name] += z if q == 1.0 else np.logaddexp(math.log1p(-q), math.log(q) + z)
    threshold = np.quantile(log_ratio["nu"], 1.0 - kappa)
    return float(np.mean(log_ratio["mu"] > threshold))


def rero_rdp(kappa: float, history: History, *, orders: Sequence[float] = _ORDERS) -> float:
    r"""The ReRo bound of Balle et al. (S&P 2022, RDP implies ReRo) from the Rényi DP of the subsampled Gaussian
    mechanism: :math:`\min_\alpha (\kappa\,e^{\epsilon(\alpha)})^{(\alpha-1)/\alpha}`, capped at 1.

    Example:
        >>> rero_rdp(0.5, [(1.0, 1.0, 1)]) > rero_gaussian(0.5, 1.0)  # looser than the tight bound
        True
    """
    from opacus.accountants.analysis.rdp import compute_rdp

    _check(kappa, history)
    if kappa == 0.0:
        return 0.0
    rdp = sum(
        (np.asarray(compute_rdp(q=q, noise_multiplier=s, steps=n, orders=list(orders))) for s, q, n in history),
        start=np.zeros(len(orders)),
    )
    exponents = [(a - 1) / a * (math.log(kappa) + e) for a, e in zip(orders, rdp, strict=True)]
    return math.exp(min(0.0, *exponents))
