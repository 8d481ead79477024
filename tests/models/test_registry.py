from __future__ import annotations

import pytest
import torch

from lightning_fl.models import BACKBONES, ImageClassifier, LeNetDLG, build_backbone


@pytest.mark.parametrize("name", sorted(BACKBONES))
@pytest.mark.parametrize("channels", [1, 3])
def test_every_backbone_takes_any_channel_and_class_count(name: str, channels: int) -> None:
    net = build_backbone(name, in_channels=channels, num_classes=7).eval()
    with torch.no_grad():
        assert net(torch.rand(2, channels, 32, 32)).shape == (2, 7)


def test_dlg_lenet_matches_the_papers_architecture() -> None:
    net = LeNetDLG(in_channels=3, num_classes=10)
    convs = [m for m in net.body if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (12, (5, 5), (2, 2)),
        (12, (5, 5), (2, 2)),
        (12, (5, 5), (1, 1)),
    ]
    assert all(isinstance(m, torch.nn.Sigmoid) for m in net.body[1::2])
    assert net.fc.in_features == 768 and all(p.abs().max() <= 0.5 for p in net.parameters())


def test_classifier_standardises_inside_forward() -> None:
    model = ImageClassifier(torch.nn.Flatten(), num_classes=4, in_channels=1, input_mean=[0.5], input_std=[0.25])
    assert torch.allclose(model(torch.full((1, 1, 2, 2), 0.75)), torch.ones(1, 4))


def test_classifier_rejects_unknown_optimiser() -> None:
    with pytest.raises(ValueError, match=r"model\.optimizer='rmsprop' is unknown"):
        ImageClassifier("lenet_dlg", optimizer="rmsprop")  # type: ignore[arg-type]


def test_resnet18_cifar_keeps_a_32x32_image_spatial_until_the_last_stage() -> None:
    features = {}
    net = build_backbone("resnet18_cifar", in_channels=3, num_classes=9).eval()
    net.layer4.register_forward_hook(lambda _m, _i, out: features.update(layer4=out.shape))
    with torch.no_grad():
        net(torch.rand(1, 3, 32, 32))
    assert features["layer4"][-2:] == (4, 4)  # the ImageNet stem leaves 1x1 here
