"""RoundWandbLogger: the round is the one x-axis of every metric of an offline W&B run."""

from __future__ import annotations

from lightning_fl.federation.wandb_logger import RoundWandbLogger
from tests.wandb_offline import offline_run


def test_every_metric_is_stepped_by_round_only(tmp_path) -> None:
    logger = RoundWandbLogger("lightning-fl-tests", str(tmp_path), mode="offline", config={"seed": 0})
    for round_idx in (0, 1):
        logger.log_metrics({"test_accuracy": 0.5 + round_idx / 10}, step=round_idx)
        logger.log_metrics({"attack/psnr": 12.0}, step=round_idx)
    logger.finalize("success")
    run = offline_run(tmp_path)
    assert [d for d in run["definitions"] if d[0] == "*"] == [("*", "round")]
    assert "trainer/global_step" not in run["metrics"]
    assert [(row["round"], row["attack/psnr"]) for row in run["history"]] == [(0, 12.0), (1, 12.0)]
