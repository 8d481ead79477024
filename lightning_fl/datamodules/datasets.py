"""Datasets by name, as in-memory image tensors in [0, 1].

Real datasets ship inside installed packages and need no network: ``digits`` (scikit-learn's 1,797
handwritten 8x8 digits, Alpaydin & Kaynak 1998, resized), ``lfw_faces`` (scikit-image's
``data.lfw_subset()``: 100 real LFW face crops and 100 non-face crops of 25x25), ``photos`` (81 crops of
nine natural RGB photographs: scikit-learn's ``load_sample_images()`` and scikit-image's colour photos; see
:data:`PHOTO_SOURCES`) and ``photo_tiles`` (the same photographs cut into 6x6 tiles: 324 images, for batches
larger than the 63 training images of ``photos``). ``digits`` is the default everywhere. ``mnist``,
``fashion_mnist``, ``cifar10``, ``cifar100`` and ``lfw`` come from torchvision and are downloaded when the user
has a network; any other string is read as an ImageFolder path (a class with a single image stays in the training
split, so a folder of one's own few images can be attacked as it is).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = ["OFFLINE_DATASETS", "PHOTO_SOURCES", "TORCHVISION_DATASETS", "ImageTensorDataset", "load_dataset"]

OFFLINE_DATASETS = ("digits", "lfw_faces", "photos", "photo_tiles")
PHOTO_SOURCES = (
    "sklearn:china",
    "sklearn:flower",
    "skimage:astronaut",
    "skimage:chelsea",
    "skimage:coffee",
    "skimage:rocket",
    "skimage:hubble_deep_field",
    "skimage:immunohistochemistry",
    "skimage:retina",
)
"""The photographs behind ``photos``, one class each (label = position here). The two scikit-learn photos are the
attack suite's tuning set; the seven scikit-image photos were kept out of all tuning (docs/attacks.md)."""
TORCHVISION_DATASETS = ("mnist", "fashion_mnist", "cifar10", "cifar100", "lfw")


@dataclass
class ImageTensorDataset(Dataset):
    """Images ``(N, C, H, W)`` and integer labels ``(N,)``; the pixels are stored as uint8 or float in [0, 1] and
    every read (:attr:`images`, indexing, :meth:`tensors`) gives float images in [0, 1], so no caller can mistake
    0-255 pixels for [0, 1] ones."""

    pixels: Tensor
    """The stored pixels (uint8 where the source was 8-bit: four times less memory than float)."""
    labels: Tensor
    num_classes: int
    sources: tuple[str, ...] | None = None
    """Where each image came from (a file path, or a photo and crop), when the loader knows it."""

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return _to_float(self.pixels[index]), self.labels[index]

    def subset(self, indices: np.ndarray | Tensor) -> ImageTensorDataset:
        """A new dataset holding the given rows (no copy of unrelated rows)."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        sources = tuple(self.sources[i] for i in idx.tolist()) if self.sources is not None else None
        return ImageTensorDataset(self.pixels[idx], self.labels[idx], self.num_classes, sources)

    @property
    def images(self) -> Tensor:
        """All images as float in [0, 1], ``(N, C, H, W)``."""
        return _to_float(self.pixels)

    def tensors(self) -> tuple[Tensor, Tensor]:
        """All images as float in [0, 1] and all labels."""
        return self.images, self.labels


def _to_float(images: Tensor) -> Tensor:
    return images.float().div_(255.0) if images.dtype == torch.uint8 else images


def _resize(images: Tensor, image_size: int | None) -> Tensor:
    if image_size is None or (images.shape[-1] == image_size and images.shape[-2] == image_size):
        return images
    needed = 4 * len(images) * images.shape[1] * image_size**2  # float32 after interpolation
    if needed > _memory_bytes():
        raise ValueError(
            f"data.image_size={image_size} would need {needed / 2**30:.0f} GiB for {len(images)} images, more than "
            f"this machine's {_memory_bytes() / 2**30:.0f} GiB; lower it (e.g. 32) or set null for the native size."
        )
    resized = F.interpolate(_to_float(images), size=(image_size, image_size), mode="bilinear", align_corners=False)
    return resized.clamp_(0.0, 1.0)


def _memory_bytes() -> int:
    """Physical memory of this machine (an upper bound on what a dataset may take)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**40


def _set_channels(images: Tensor, channels: int | None) -> Tensor:
    if channels is None or images.shape[1] == channels:
        return images
    if images.shape[1] == 1 and channels == 3:
        return images.expand(-1, 3, -1, -1).contiguous()
    if images.shape[1] == 3 and channels == 1:
        return _to_float(images).mean(dim=1, keepdim=True)
    raise ValueError(f"data.channels={channels}: cannot convert {images.shape[1]}-channel images; use 1 or 3.")


def _stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per class, ``test_fraction`` of the samples (at least one) to the test split; a class with one sample keeps it
    for training, so a folder of a user's own few images is all training data (an empty test split)."""
    rng = np.random.default_rng(seed)
    test = []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        test.extend(idx[: max(1, round(len(idx) * test_fraction)) if len(idx) > 1 else 0].tolist())
    test_idx = np.sort(np.asarray(test))
    return np.setdiff1d(np.arange(len(labels)), test_idx), test_idx


@cache  # decoded once per process: load_dataset indexes (copies) what it keeps
def _digits() -> tuple[Tensor, Tensor, int]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return images, torch.tensor(bunch.target, dtype=torch.long), 10


@cache  # decoded once per process: load_dataset indexes (copies) what it keeps
def _lfw_faces() -> tuple[Tensor, Tensor, int]:
    from skimage import data

    images = torch.tensor(np.asarray(data.lfw_subset()), dtype=torch.float32).unsqueeze(1)
    images = (images - images.min()) / (images.max() - images.min())
    labels = torch.cat([torch.zeros(100), torch.ones(100)]).long()  # 0 = face, 1 = non-face crop
    return images, labels, 2


@cache  # decoded once per process: load_dataset indexes (copies) what it keeps
def _photos(grid: int = 3) -> tuple[Tensor, Tensor, int, tuple[str, ...]]:
    """A ``grid`` x ``grid`` grid of square crops (side: the shorter edge over ``grid``) of each of
    :data:`PHOTO_SOURCES`, resized to 64x64 with antialiasing; label = the photo."""
    from skimage import data
    from sklearn.datasets import load_sample_images

    sample = dict(zip(("china", "flower"), load_sample_images().images, strict=True))
    crops, labels, sources = [], [], []
    for label, source in enumerate(PHOTO_SOURCES):
        package, name = source.split(":")
        photo = sample[name] if package == "sklearn" else getattr(data, name)()
        image = torch.tensor(np.asarray(photo)[..., :3]).permute(2, 0, 1).float() / 255.0
        side = min(image.shape[1:]) // grid
        top, left = (image.shape[1] - grid * side) // 2, (image.shape[2] - grid * side) // 2
        for row in range(grid):
            for col in range(grid):
                y, x = top + row * side, left + col * side
                crops.append(image[:, y : y + side, x : x + side])
                labels.append(label)
                sources.append(f"{source}[{row},{col}]")
    stacked = torch.cat([F.interpolate(c[None], size=(64, 64), mode="bilinear", antialias=True) for c in crops])
    return stacked.clamp(0, 1), torch.tensor(labels), len(PHOTO_SOURCES), tuple(sources)


def _torchvision(name: str, root: str | None, train: bool, download: bool) -> tuple[Tensor, Tensor, int]:
    from torchvision import datasets

    if root is None:
        root = str(Path.home() / ".cache" / "lightning_fl" / "data")
    try:
        if name == "lfw":
            ds = datasets.LFWPeople(root, split="train" if train else "test", download=download)
            images = np.stack([np.asarray(img.convert("RGB")) for img, _ in ds])
            labels = np.asarray([t for _, t in ds])
            return torch.tensor(images).permute(0, 3, 1, 2), torch.tensor(labels).long(), len(ds.class_to_idx)
        cls = {
            "mnist": datasets.MNIST,
            "fashion_mnist": datasets.FashionMNIST,
            "cifar10": datasets.CIFAR10,
            "cifar100": datasets.CIFAR100,
        }[name]
        ds = cls(root, train=train, download=download)
    except Exception as err:  # torchvision raises RuntimeError, URLError or OSError when offline
        raise RuntimeError(
            f"data.dataset={name!r} could not be loaded from data.root={root!r} ({type(err).__name__}: {err}). "
            f"Without a network, place the torchvision files for {name!r} under data.root, or use an "
            f"offline dataset: {', '.join(OFFLINE_DATASETS)}."
        ) from err
    images = torch.as_tensor(np.asarray(ds.data))
    images = images.unsqueeze(1) if images.ndim == 3 else images.permute(0, 3, 1, 2)
    return images.contiguous(), torch.as_tensor(np.asarray(ds.targets)).long(), len(ds.classes)


def _read(folder: Dataset, index: int, path: str) -> Tensor:
    """Image ``index`` of an ImageFolder at ``path``; a file that is no readable image is named with the fix."""
    try:
        return folder[index][0]
    except OSError as err:  # PIL: not an image, or truncated
        name = Path(folder.samples[index][0]).relative_to(path)
        reason = str(err).split(" <_io.")[0]  # PIL appends the open file object
        raise ValueError(
            f"data.dataset={path!r} holds {str(name)!r}, which is not a readable image ({reason}); remove or replace "
            "it."
        ) from None


def _image_folder(path: str) -> tuple[Tensor, Tensor, int, tuple[str, ...]]:
    from torchvision import datasets, transforms

    if not Path(path).is_dir():
        raise ValueError(
            f"data.dataset={path!r} is neither a known dataset ({', '.join(OFFLINE_DATASETS + TORCHVISION_DATASETS)}) "
            "nor an existing ImageFolder directory; fix the name or the path."
        )
    ds = datasets.ImageFolder(path, transform=transforms.PILToTensor(), loader=_native_loader)
    if len(ds) == 0:
        raise ValueError(f"data.dataset={path!r} holds no images in class sub-folders (ImageFolder layout).")
    if len(ds.classes) < 2:
        raise ValueError(
            f"data.dataset={path!r} has one class sub-folder ({ds.classes[0]!r}); a classifier needs at least 2: "
            "put each class's images in its own sub-folder."
        )
    sizes = {tuple(_read(ds, i, path).shape[1:]) for i in range(min(len(ds), 64))}
    if len(sizes) > 1:
        resize = transforms.Compose([transforms.Resize((64, 64)), transforms.PILToTensor()])
        ds = datasets.ImageFolder(path, transform=resize, loader=_native_loader)
    images = _same_channels([_read(ds, i, path) for i in range(len(ds))], path)
    return torch.stack(images), torch.tensor(ds.targets).long(), len(ds.classes), tuple(p for p, _ in ds.samples)


def _native_loader(file: str) -> Image:
    """An image file in its own channel count: grayscale modes as one channel ``L``, everything else as ``RGB``
    (torchvision's default loader turns every image into RGB, so a grayscale folder read as 3 equal channels)."""
    from PIL import Image

    with open(file, "rb") as handle:
        image = Image.open(handle)
        return image.convert("L" if image.mode in ("1", "L", "LA", "I", "I;16", "F") else "RGB")


def _same_channels(images: list[Tensor], path: str) -> list[Tensor]:
    """The images of one folder with one channel count: all grayscale stay 1 channel; a folder mixing grayscale and
    colour files gives 3, and a warning says how many grayscale files were repeated into 3 equal channels."""
    gray = sum(image.shape[0] == 1 for image in images)
    if gray in (0, len(images)):
        return images
    warnings.warn(
        f"data.dataset={path!r} mixes {gray} grayscale and {len(images) - gray} colour images: the grayscale ones "
        "are read as 3 equal channels (set data.channels: 1 to read every image as grayscale).",
        stacklevel=3,
    )
    return [image.expand(3, -1, -1) if image.shape[0] == 1 else image for image in images]


def load_dataset(
    name: str,
    *,
    train: bool,
    root: str | None = None,
    image_size: int | None = 32,
    channels: int | None = None,
    download: bool = True,
    split_seed: int = 0,
    test_fraction: float = 0.2,
) -> ImageTensorDataset:
    """Load a dataset by name (or ImageFolder path) as an :class:`ImageTensorDataset`.

    Args:
        name: ``digits``, ``lfw_faces``, ``photos``, ``photo_tiles``, a torchvision name (``mnist``,
            ``fashion_mnist``, ``cifar10``, ``cifar100``, ``lfw``) or a directory in ImageFolder layout.
        train: the training split if true, else the test split. Datasets without an official split
            (``digits``, ``lfw_faces``, ``photos``, ``photo_tiles``, ImageFolder) are split per class with
            ``test_fraction``; a class with a single image stays in the training split.
        root: where torchvision datasets live (default ``~/.cache/lightning_fl/data``).
        image_size: side length to resize to (bilinear); ``None`` keeps the native size.
        channels: 1 or 3 to convert; ``None`` keeps the native channel count.
        download: let torchvision download when the files are missing.
        split_seed: seed of the per-class train/test split for datasets without an official one.
        test_fraction: share of each class held out for testing for those datasets.

    Example:
        >>> ds = load_dataset("digits", train=False, image_size=16)
        >>> tuple(ds.images.shape), ds.num_classes
        ((359, 1, 16, 16), 10)
    """
    sources: tuple[str, ...] | None = None
    if name in TORCHVISION_DATASETS:
        images, labels, num_classes = _torchvision(name, root, train, download)
    else:
        if name in ("digits", "lfw_faces"):
            images, labels, num_classes = {"digits": _digits, "lfw_faces": _lfw_faces}[name]()
        else:
            grid = {"photos": 3, "photo_tiles": 6}.get(name)
            images, labels, num_classes, sources = _photos(grid) if grid else _image_folder(name)
        train_idx, test_idx = _stratified_split(labels.numpy(), test_fraction, split_seed)
        keep = torch.as_tensor(train_idx if train else test_idx, dtype=torch.long)
        images, labels = images[keep], labels[keep]
        sources = tuple(sources[i] for i in keep.tolist()) if sources is not None else None
    images = _set_channels(_resize(images, image_size), channels)
    return ImageTensorDataset(images.contiguous(), labels, num_classes, sources)
