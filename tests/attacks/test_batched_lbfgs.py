"""BatchedLBFGS: each row follows torch.optim.LBFGS(max_iter=1) exactly."""

from __future__ import annotations

import pytest
import torch

from lightning_fl.attacks.batched_lbfgs import BatchedLBFGS


def _rosenbrock(x: torch.Tensor) -> torch.Tensor:
    return (100 * (x[:, 1:] - x[:, :-1] ** 2) ** 2 + (1 - x[:, :-1]) ** 2).sum(1)


def _torch_trajectory(start: torch.Tensor, steps: int, history_size: int) -> torch.Tensor:
    x = start.clone().requires_grad_()
    opt = torch.optim.LBFGS([x], lr=1, max_iter=1, history_size=history_size)
    out = []
    for _ in range(steps):

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = _rosenbrock(x[None]).sum()
            loss.backward()
            return loss

        opt.step(closure)
        out.append(x.detach().clone())
    return torch.stack(out)


@pytest.mark.parametrize("history_size", [100, 3])
def test_batched_lbfgs_rows_equal_independent_torch_lbfgs(history_size: int) -> None:
    starts = torch.tensor([[-1.2, 1.0, 0.5, -0.3], [0.3, 0.1, -2.0, 1.0], [2.0, 2.0, 2.0, 2.0]], dtype=torch.float64)
    x, opt, trajectory = starts.clone(), BatchedLBFGS(num_rows=3, history_size=history_size), []
    for _ in range(40):
        probe = x.clone().requires_grad_()
        (grad,) = torch.autograd.grad(_rosenbrock(probe).sum(), probe)
        x = x + opt.step(grad)
        trajectory.append(x)
    trajectory = torch.stack(trajectory)
    for row in range(3):
        reference = _torch_trajectory(starts[row], 40, history_size)
        assert torch.allclose(trajectory[:, row], reference, atol=1e-8)


def test_batched_lbfgs_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="lr=0"):
        BatchedLBFGS(num_rows=1, lr=0)
    with pytest.raises(ValueError, match="history_size=0"):
        BatchedLBFGS(num_rows=1, history_size=0)


def test_batched_lbfgs_state_follows_the_gradient_dtype_and_device() -> None:
    x = torch.tensor([[3.0, -1.0], [0.5, 2.0]], dtype=torch.float64)
    opt = BatchedLBFGS(num_rows=2)
    for _ in range(2):
        update = opt.step(x.clone())  # gradient of |x|^2 / 2
        x = x + update
    state = [opt.step_size, opt.h_diag, opt.direction, opt.prev_grad, opt._y, opt._s]
    assert update.dtype == torch.float64 and all(t.dtype == torch.float64 for t in state)
    assert all(t.device == x.device for t in [*state, opt.n_iter]) and opt.n_iter.tolist() == [2, 2]


def test_reset_rows_restart_like_a_fresh_optimiser_and_leave_the_others_alone() -> None:
    """A reset row moved to a new point follows a new torch.optim.LBFGS from there; the other row is unaffected."""
    starts = torch.tensor([[-1.2, 1.0, 0.5, -0.3], [0.3, 0.1, -2.0, 1.0]], dtype=torch.float64)
    x, opt = starts.clone(), BatchedLBFGS(num_rows=2)
    steps = []
    for step in range(30):
        if step == 10:
            x = torch.stack([starts[0], x[1]])  # row 0 back to its start, with its history forgotten
            opt.reset(torch.tensor([True, False]))
        probe = x.clone().requires_grad_()
        (grad,) = torch.autograd.grad(_rosenbrock(probe).sum(), probe)
        x = x + opt.step(grad)
        steps.append(x)
    assert torch.allclose(steps[-1][0], _torch_trajectory(starts[0], 20, 100)[-1], atol=1e-8)
    assert torch.allclose(steps[-1][1], _torch_trajectory(starts[1], 30, 100)[-1], atol=1e-8)
