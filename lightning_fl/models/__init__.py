"""Models: the sigmoid DLG LeNet, the ReLU/BatchNorm ConvNet, LeNet-5, an MLP, AlexNet, ResNets, VGG-16 and
ImageClassifier."""

from lightning_fl.models.cifar import AlexNetCIFAR, CifarResNet, resnet18, resnet20, resnet32, vgg16
from lightning_fl.models.classifier import ImageClassifier
from lightning_fl.models.convnet import ConvNet, conv_bn_pool, conv_bn_small
from lightning_fl.models.lenet import LeNet5, LeNetDLG
from lightning_fl.models.mlp import MLP
from lightning_fl.models.registry import BACKBONES, BackboneName, build_backbone

__all__ = [
    "BACKBONES",
    "MLP",
    "AlexNetCIFAR",
    "BackboneName",
    "CifarResNet",
    "ConvNet",
    "ImageClassifier",
    "LeNet5",
    "LeNetDLG",
    "build_backbone",
    "conv_bn_pool",
    "conv_bn_small",
    "resnet18",
    "resnet20",
    "resnet32",
    "vgg16",
]
