"""One federated experiment from plain settings: the builder every bench run and benchmark script shares.

A spec holds the parts of a ``lightning-fl fit`` config as plain data (``data``, ``model``, ``loop``,
``defences``, ``server_plugins``, ``client_callbacks``, ``seed``); :func:`build_loop` turns it into a
:class:`FederatedLoop` the way the command does (seed first, data built and linked into the model's data options,
the server plug-ins and defences applied by the loop), so a run built here trains exactly as ``lightning-fl fit``
with the same settings.
"""

from __future__ import annotations

import inspect
import re
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_fl.bench.grid import read_mapping
from lightning_fl.config import build, load_class

if TYPE_CHECKING:
    from lightning_fl.callbacks.base import FederatedCallback
    from lightning_fl.federation import FederatedLoop

__all__ = [
    "build_loop",
    "data_options",
    "fit_config_spec",
    "fit_loop",
    "fit_loop_options",
    "fit_spec",
    "recorded_warnings",
    "scratch_loop",
]

_DATA_LINKS = ("num_classes", "in_channels", "image_size", "input_mean", "input_std")
"""The data options the command links into a model's ``init_args`` (when the model accepts them)."""

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
    """The federated run of ``spec``, built as ``lightning-fl fit`` builds it; nothing is written yet.

    Args:
        spec: ``data`` (:class:`~lightning_fl.datamodules.FederatedDataModule` options), ``model``
            (``class_path``/``init_args``), ``loop`` (:class:`FederatedLoop` options), ``defences``,
            ``server_plugins`` and ``client_callbacks`` (lists of ``class_path``/``init_args``), ``seed``.
        output_dir: the run directory.
        callbacks: federated callbacks added to the loop's own (attacks).
        checkpoint: write a checkpoint after every round.
        progress_bar: show the rounds' progress bar.

    Raises:
        ValueError: from any part that rejects its settings (the message names the key).
    """
    import lightning as L

    from lightning_fl.datamodules import FederatedDataModule
    from lightning_fl.federation import FederatedLoop

    seed = int(spec["seed"])
    L.seed_everything(seed, verbose=False)
    data = FederatedDataModule(**{"seed": seed, **data_options(spec["data"])})
    model_type = load_class(spec["model"]["class_path"])
    accepted = inspect.signature(model_type).parameters
    links = {k: v for k, v in data.model_options.items() if k in _DATA_LINKS and k in accepted}
    model = model_type(**{**links, **build(spec["model"].get("init_args") or {})})
    loop_options = fit_loop_options(spec["loop"])
    return FederatedLoop(
        model,
        data,
        defences=build(list(spec.get("defences") or [])),
        server_plugins=build(list(spec.get("server_plugins") or [])),
        callbacks=[*loop_options.pop("callbacks", []), *callbacks],
        client_callbacks=[*loop_options.pop("client_callbacks", []), *build(list(spec.get("client_callbacks") or []))],
        output_dir=output_dir,
        seed=seed,
        checkpoint=checkpoint,
        progress_bar=progress_bar,
        **loop_options,
    )


def data_options(data: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`~lightning_fl.datamodules.FederatedDataModule` options of a ``data`` section, its ``dataset``
    built as ``lightning-fl fit`` builds it.

    A ``class_path``/``init_args`` mapping (``dataset`` or ``test_dataset``) becomes an instance; so does a
    ``dataset`` string that names no dataset or folder but a class (``my_project.DigitsDataModule``), made with its
    default arguments. A dataset name or an ImageFolder path stays a string.

    Raises:
        ValueError: naming ``data.dataset`` when it reads as a class path (``a.b.C``) that does not import.

    Example:
        >>> type(data_options({"dataset": "torch.utils.data.TensorDataset"})["dataset"]).__name__
        'TensorDataset'
        >>> data_options({"dataset": "digits", "num_clients": 4})
        {'dataset': 'digits', 'num_clients': 4}
    """
    from lightning_fl.datamodules.datasets import OFFLINE_DATASETS, TORCHVISION_DATASETS

    options = build(dict(data))
    dataset = options.get("dataset")
    named = isinstance(dataset, str) and (dataset in OFFLINE_DATASETS + TORCHVISION_DATASETS or Path(dataset).exists())
    if isinstance(dataset, str) and not named and _CLASS_PATH.fullmatch(dataset):
        try:
            options["dataset"] = load_class(dataset)()
        except ValueError as err:
            raise ValueError(
                f"data.dataset={dataset!r} is no known dataset or folder, and as a class path: {err}"
            ) from None
    return options


FIT_COMMAND_LOOP_DEFAULTS: dict[str, Any] = {"vectorize": "auto"}
"""Where ``lightning-fl fit``'s ``loop:`` defaults differ from :class:`FederatedLoop`'s: the command stacks plain
clients where it pays (the quickstart's history equals the one-by-one fit's to 6e-7 in loss and exactly in accuracy;
docs/performance.md, "Vectorised clients"). The command's parser sets them as its defaults and
:func:`fit_loop_options` puts them under every spec's ``loop``, so a bench run or a fit config read as a spec trains
as the command does."""


def fit_loop_options(loop: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`FederatedLoop` options of a spec's ``loop`` section as ``lightning-fl fit`` sets them: the command's
    defaults (:data:`FIT_COMMAND_LOOP_DEFAULTS`), then the section's keys, ``class_path`` entries built.

    Example:
        >>> fit_loop_options({"num_rounds": 2})
        {'vectorize': 'auto', 'num_rounds': 2}
        >>> fit_loop_options({"vectorize": False})
        {'vectorize': False}
    """
    return build({**FIT_COMMAND_LOOP_DEFAULTS, **loop})


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
