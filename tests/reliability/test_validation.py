"""The pure pre-training checks of lightning_fl.validation."""

from __future__ import annotations

import math
import os

import pytest

from lightning_fl.validation import (
    check_learning_rate,
    check_output_dir,
    check_trainer_options,
    update_norm_outliers,
)


@pytest.mark.parametrize(
    ("norms", "outliers"),
    [
        ([0.5, 0.7, 0.6], []),
        ([0.5, 0.7, 3e38, 0.6], [2]),  # the huge finite update
        ([0.5, math.nan, math.inf, 0.6], [1, 2]),
        ([0.5, 3e38], [1]),  # two clients: the lower median keeps the honest one as the centre
        ([2e6], [0]),  # one client: only the absolute bound applies
        ([1e-3, 2e-3, 5.0], [2]),  # 2500x the median
        ([], []),
    ],
)
def test_update_norm_outliers_flags_non_finite_and_huge_updates(norms: list[float], outliers: list[int]) -> None:
    assert update_norm_outliers(norms) == outliers


def test_update_norm_outliers_keeps_ordinary_spread() -> None:
    norms = [0.1 * (1 + k) for k in range(20)]  # a 20x spread between clients is normal non-IID variation
    assert update_norm_outliers(norms) == []


def test_a_huge_learning_rate_warns_with_the_fix() -> None:
    with pytest.warns(UserWarning, match=r"model.init_args.lr=100 is above 10.*negative exponent"):
        check_learning_rate(100.0)
    with pytest.raises(ValueError, match=r"model.init_args.lr=1e\+10 is above 1000, where no model trains"):
        check_learning_rate(1e10)


def test_trainer_options_name_the_nearest_valid_option() -> None:
    with pytest.raises(ValueError, match=r"loop.trainer.precison is not an option.*did you mean 'precision'"):
        check_trainer_options({"precison": "32-true"})


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_output_dir_is_rejected(tmp_path) -> None:
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(ValueError, match="is not writable"):
            check_output_dir(tmp_path / "run")
    finally:
        tmp_path.chmod(0o755)


@pytest.mark.parametrize(
    ("options", "rule"),
    [
        ({"clipping": "per_example"}, "(clipping='per_example') is unknown; use 'flat' or 'per_layer'."),
        ({"noise_scaling": "paper"}, "(noise_scaling='paper') is unknown; use 'per_batch' (one noise draw per batch"),
        ({"accounting_noise": "x"}, "(accounting_noise='x') is unknown; use 'nominal' or 'effective'."),
        ({"sampling": "uniform"}, "(sampling='uniform') is unknown; use 'poisson' (what the accountant assumes)"),
        ({"delta": 1.0}, "(delta=1.0) must be in (0, 1); 1/n for n training samples is usual."),
        ({"noise_multiplier": -1.0}, "(noise_multiplier=-1.0) must be a finite number >= 0."),
    ],
)
@pytest.mark.parametrize("owner", ["PerExampleDP", "ClientDPSGD"])
def test_dp_sgd_arguments_are_checked_once_and_named_after_the_class_given_them(owner, options, rule) -> None:
    from lightning_fl.defences import dp

    with pytest.raises(ValueError) as err:
        getattr(dp, owner)(**options)
    assert str(err.value).startswith(owner + rule)
