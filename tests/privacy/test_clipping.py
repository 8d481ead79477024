import pytest
import torch

from lightning_fl.privacy import clip_per_tensor, clip_state, clip_update, state_norm


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": 10 * torch.randn(7, 5, generator=g), "b": 10 * torch.randn(5, generator=g)}


@pytest.mark.parametrize("max_norm", [0.5, 1.0, 4.0])
@pytest.mark.parametrize("p", [1.0, 2.0])
def test_clip_update_never_exceeds_bound(max_norm: float, p: float) -> None:
    update = 10 * torch.randn(1000, generator=torch.Generator().manual_seed(0))
    assert clip_update(update, max_norm=max_norm, p=p).norm(p=p) <= max_norm * (1 + 1e-6)


def test_clip_update_leaves_small_updates_alone() -> None:
    update = torch.tensor([0.1, -0.2])
    assert torch.equal(clip_update(update, max_norm=1.0), update)


@pytest.mark.parametrize("seed", range(5))
def test_clip_state_bounds_the_joint_l1_norm_and_keeps_direction(seed: int) -> None:
    state = _state(seed)
    clipped = clip_state(state, max_norm=3.0, p=1.0)
    assert state_norm(clipped, p=1.0) == pytest.approx(3.0, rel=1e-5)
    ratio = clipped["w"] / state["w"]
    assert torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio))
    assert torch.allclose(clipped["b"] / state["b"], ratio.flatten()[0].expand(5))


@pytest.mark.parametrize("seed", range(5))
def test_clip_per_tensor_bounds_every_tensor(seed: int) -> None:
    clipped = clip_per_tensor(_state(seed), max_norm=2.0)
    assert all(v.norm() <= 2.0 * (1 + 1e-6) for v in clipped.values())


@pytest.mark.parametrize("fn", [clip_update, clip_state, clip_per_tensor])
def test_clipping_rejects_non_positive_bound(fn) -> None:
    arg = torch.ones(2) if fn is clip_update else {"w": torch.ones(2)}
    with pytest.raises(ValueError, match="clip bound"):
        fn(arg, max_norm=0.0)
