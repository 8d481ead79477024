"""One federated experiment from plain settings: the spec every bench run and benchmark script builds its run from.

A spec holds the parts of a ``lightning-fl fit`` config as plain data (``data``, ``model``, ``loop``,
``defences``, ``server_plugins``, ``client_callbacks``, ``seed``); :func:`build_loop` turns it into that fit config
(:func:`fit_config`) and builds its :class:`FederatedLoop` with the fit command's own parser and builder
(:func:`lightning_fl.cli_fit.build_fit_loop`), so a run built here trains exactly as ``lightning-fl fit`` with the
same settings.
"""

from __future__ import annotations

import re
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_fl.bench.grid import read_mapping

if TYPE_CHECKING:
    from lightning_fl.callbacks.base import FederatedCallback
    from lightning_fl.federation import FederatedLoop

__all__ = [
    "build_loop",
    "data_config",
    "fit_config",
    "fit_config_spec",
    "fit_loop",
    "fit_spec",
    "recorded_warnings",
    "scratch_loop",
]

_CLASS_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
"""A dotted Python name (``my_project.data.DigitsDataModule``): how a ``data.dataset`` string names a class."""

_SPEC_KEYS = frozenset({"data", "model", "loop", "defences", "server_plugins", "client_callbacks", "seed"})


def build_loop(
    spec: Mapping[str, Any],
    output_dir: str | Path,
    *,
    callbacks: Sequence[FederatedCallback] = (),
    checkpoint: bool = False,
    progress_bar: bool = False,
) -> FederatedLoop:
    """The federated run of ``spec``, built by ``lightning-fl fit``'s builder from :func:`fit_config`; nothing is
    written yet.

    Args:
        spec: ``data`` (:class:`~lightning_fl.datamodules.FederatedDataModule` options), ``model``
            (``class_path``/``init_args``), ``loop`` (:class:`FederatedLoop` options), ``defences``,
            ``server_plugins`` and ``client_callbacks`` (lists of ``class_path``/``init_args`` or built objects),
            ``seed``.
        output_dir: the run directory.
        callbacks: federated callbacks added to the loop's own (attacks).
        checkpoint: write a checkpoint after every round.
        progress_bar: show the rounds' progress bar.

    Raises:
        ValueError: from any part that rejects its settings (one line naming the key).
    """
    from lightning_fl.cli_fit import build_fit_loop

    config = fit_config(spec)
    return build_fit_loop(config, output_dir, callbacks=callbacks, checkpoint=checkpoint, progress_bar=progress_bar)


def fit_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The ``lightning-fl fit`` config of a spec: ``seed`` becomes ``seed_everything``, the spec's
    ``client_callbacks`` go after ``loop.client_callbacks``, ``data`` is read by :func:`data_config`.

    Example:
        >>> fit_config({"seed": 1, "data": {}, "model": {"class_path": "m.M"}, "loop": {"num_rounds": 2}})
        {'seed_everything': 1, 'data': {}, 'model': {'class_path': 'm.M'}, 'loop': {'num_rounds': 2}, \
'defences': [], 'server_plugins': []}
    """
    loop = dict(spec["loop"] or {})
    extra = list(spec.get("client_callbacks") or [])
    if extra:
        loop["client_callbacks"] = [*(loop.get("client_callbacks") or []), *extra]
    return {
        "seed_everything": int(spec["seed"]),
        "data": data_config(spec["data"]),
        "model": spec["model"],
        "loop": loop,
        "defences": list(spec.get("defences") or []),
        "server_plugins": list(spec.get("server_plugins") or []),
    }


def data_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """A spec's ``data`` section as the fit command reads it: a ``dataset`` string that names no dataset or folder
    but a class (``my_project.DigitsDataModule``) becomes ``{"class_path": ...}`` (made with its default arguments).
    A dataset name, an ImageFolder path, a ``class_path`` mapping and a built data set stay as they are.

    Example:
        >>> data_config({"dataset": "torch.utils.data.TensorDataset"})
        {'dataset': {'class_path': 'torch.utils.data.TensorDataset'}}
        >>> data_config({"dataset": "digits", "num_clients": 4})
        {'dataset': 'digits', 'num_clients': 4}
    """
    from lightning_fl.datamodules.datasets import OFFLINE_DATASETS, TORCHVISION_DATASETS

    options = dict(data)
    dataset = options.get("dataset")
    named = isinstance(dataset, str) and (dataset in OFFLINE_DATASETS + TORCHVISION_DATASETS or Path(dataset).exists())
    if isinstance(dataset, str) and not named and _CLASS_PATH.fullmatch(dataset):
        options["dataset"] = {"class_path": dataset}
    return options


def fit_config_spec(path: str | Path, **overrides: Any) -> dict[str, Any]:
    """The spec of a ``lightning-fl fit`` YAML config (``seed_everything`` becomes ``seed``), ``overrides`` on top.

    Each override replaces one top-level key (``data``, ``model``, ``loop``, ``defences``, ``server_plugins``,
    ``client_callbacks``, ``seed``) whole; ``output_dir`` and ``resume`` of the file are not part of a spec
    (:func:`build_loop` takes the directory).

    Raises:
        ValueError: naming the file when it is missing, is not a mapping, or has a key a spec does not know.
    """
    config = read_mapping(path, "fit config")
    spec: dict[str, Any] = {
        "seed": config.pop("seed_everything", 0),
        "loop": {},
        "defences": [],
        "client_callbacks": [],
    }
    for key in ("output_dir", "resume", "overwrite"):
        config.pop(key, None)
    unknown = sorted(set(config) - _SPEC_KEYS)
    if unknown:
        raise ValueError(f"{path}: keys {unknown} are not fit settings; a spec has {sorted(_SPEC_KEYS)}.")
    spec = {**spec, **config}
    return {**spec, "loop": spec["loop"] or {}, **overrides}


@contextmanager
def recorded_warnings(path: Path) -> Iterator[None]:
    """Collect every warning raised inside the block into ``path`` (one per line), shown nowhere else."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(f"{w.message}\n" for w in caught))


@contextmanager
def scratch_loop(spec: Mapping[str, Any], *, callbacks: Sequence[FederatedCallback] = ()) -> Iterator[FederatedLoop]:
    """The run of ``spec`` (:func:`build_loop`) in a temporary directory, removed when the block ends.

    For a measurement that reads the loop in memory (``fit()``'s summary, the global model): its warnings go to
    the directory's ``warnings.txt`` and are shown nowhere else.
    """
    with tempfile.TemporaryDirectory() as output_dir, recorded_warnings(Path(output_dir) / "warnings.txt"):
        yield build_loop(spec, output_dir, callbacks=callbacks)


def fit_spec(spec: Mapping[str, Any], output_dir: str | Path) -> dict[str, Any]:
    """Train the run of ``spec`` (:func:`build_loop`), save its public global model and return its summary.

    The summary is ``summary.json``'s; ``output_dir`` also gets ``global_model.safetensors`` (as ``lightning-fl
    fit`` writes it) and ``warnings.txt``.
    """
    return fit_loop(spec, output_dir)[1]


def fit_loop(spec: Mapping[str, Any], output_dir: str | Path) -> tuple[FederatedLoop, dict[str, Any]]:
    """:func:`fit_spec`, returning the trained loop too (its clients' state: a DP accountant's history)."""
    from lightning_fl.federation.export import GLOBAL_MODEL_FILE, save_global_model
    from lightning_fl.federation.run_dir import holds_run, record_written

    output_dir = Path(output_dir)
    with recorded_warnings(output_dir / "warnings.txt"):
        loop = build_loop(spec, output_dir)
        summary = loop.fit(overwrite=holds_run(output_dir))  # a cell run again with other settings replaces its run
    save_global_model(loop.global_model, output_dir / GLOBAL_MODEL_FILE)
    record_written(output_dir, GLOBAL_MODEL_FILE)
    return loop, summary
