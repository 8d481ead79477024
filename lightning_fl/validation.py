"""Checks of a run's settings that must pass before any training, each raising one message that names the key.

The ``lightning-fl`` command calls them after building the objects of a config and before it writes anything, so
a bad config exits with code 2, a one-line error and no run directory. Every message follows STYLE.md R3: the
key, the value received, the rule, and the fix. :func:`update_norm_outliers` is the pure rule a federated loop
applies to the norms of one round's client updates before aggregating them.
"""

from __future__ import annotations

import difflib
import inspect
import math
import os
import pickle
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch

__all__ = [
    "check_callback_schedule",
    "check_checkpoints_load_safely",
    "check_config_file",
    "check_device_count",
    "check_federated_data",
    "check_learning_rate",
    "check_non_negative",
    "check_num_rounds",
    "check_output_dir",
    "check_positive",
    "check_private_state_stays_local",
    "check_resume",
    "check_seed",
    "check_trainer_options",
    "update_norm_outliers",
]

LARGE_LEARNING_RATE = 10.0
MAX_LEARNING_RATE = 1e3
"""Above this a learning rate is legal but almost surely a typo (1e10 for 1e-10): :func:`check_learning_rate` warns."""

# the names the loop sets itself; the Trainer accepts them, but loop.trainer must not
_LOOP_OWNED_TRAINER_OPTIONS = frozenset({"max_epochs", "max_steps", "callbacks"})


def check_learning_rate(lr: float, *, key: str = "model.init_args.lr") -> None:
    """Reject a learning rate that is not a finite positive number or absurdly large; warn when it is large.

    Above :data:`MAX_LEARNING_RATE` no optimiser of a neural network trains (every update is dropped by the norm
    bounds or overflows), so the run is refused before it writes anything; above :data:`LARGE_LEARNING_RATE` it warns.

    Raises:
        ValueError: if ``lr`` is NaN, infinite, zero, negative (``lr > 0`` alone lets NaN through) or above
            :data:`MAX_LEARNING_RATE`.

    Example:
        >>> check_learning_rate(0.01)
        >>> check_learning_rate(float("nan"))
        Traceback (most recent call last):
        ...
        ValueError: model.init_args.lr=nan must be a finite number > 0 (e.g. 0.001).
    """
    if not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"{key}={lr} must be a finite number > 0 (e.g. 0.001).")
    if lr > MAX_LEARNING_RATE:
        raise ValueError(
            f"{key}={lr:g} is above {MAX_LEARNING_RATE:g}, where no model trains; did you mean a negative exponent "
            "(e.g. 1e-3)?"
        )
    if lr > LARGE_LEARNING_RATE:
        warnings.warn(
            f"{key}={lr:g} is above {LARGE_LEARNING_RATE:g}; training will most likely diverge. "
            "Did you mean a negative exponent (e.g. 1e-3)?",
            stacklevel=2,
        )


def check_positive(value: float, *, owner: str, name: str, hint: str = "") -> None:
    """Reject an argument that is not a finite number > 0 (``value <= 0`` alone lets NaN through).

    Raises:
        ValueError: ``<owner>(<name>=<value>) must be a finite number > 0`` and ``hint``.

    Example:
        >>> check_positive(-1.0, owner="DualDPFL", name="target_epsilon", hint="; it is the privacy budget")
        Traceback (most recent call last):
        ...
        ValueError: DualDPFL(target_epsilon=-1.0) must be a finite number > 0; it is the privacy budget.
    """
    if not (isinstance(value, int | float) and 0 < value < math.inf):
        raise ValueError(f"{owner}({name}={value}) must be a finite number > 0{hint}.")


def check_non_negative(value: float, *, owner: str, name: str, hint: str = "") -> None:
    """Reject an argument that is not a finite number >= 0 (``value < 0`` alone lets NaN through).

    Raises:
        ValueError: ``<owner>(<name>=<value>) must be a finite number >= 0`` and ``hint``.

    Example:
        >>> check_non_negative(float("nan"), owner="GaussianNoise", name="noise_std")
        Traceback (most recent call last):
        ...
        ValueError: GaussianNoise(noise_std=nan) must be a finite number >= 0.
    """
    if not (isinstance(value, int | float) and 0 <= value < math.inf):
        raise ValueError(f"{owner}({name}={value}) must be a finite number >= 0{hint}.")


MAX_SEED = 2**32 - 1
"""The largest seed every generator takes (numpy's ``np.random.seed`` bound)."""


def check_seed(seed: int, *, key: str = "seed_everything") -> None:
    """Reject a seed that numpy, torch and Python's ``random`` do not all accept.

    Raises:
        ValueError: if ``seed`` is outside ``0..2**32 - 1``.

    Example:
        >>> check_seed(-1)
        Traceback (most recent call last):
        ...
        ValueError: seed_everything=-1 must be between 0 and 4294967295 (every generator takes it); e.g. 0.
    """
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{key}={seed} must be between 0 and {MAX_SEED} (every generator takes it); e.g. 0.")


def check_config_file(path: str | Path, *, key: str = "config") -> None:
    """Reject a config file that is not a YAML mapping of keys (empty, a list, binary), naming the file.

    A missing file is left to the parser, whose message names it.

    Raises:
        ValueError: naming the file, what it holds and what a config looks like.

    Example:
        >>> import tempfile
        >>> empty = Path(tempfile.mkdtemp()) / "empty.yaml"
        >>> _ = empty.write_text("")
        >>> check_config_file(empty)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: config=.../empty.yaml' is empty; a config is a YAML mapping of sections, e.g. ...
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        return
    example = "a config is a YAML mapping of sections, e.g. 'loop: {num_rounds: 2}'"
    try:
        content = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{key}={str(path)!r} is not text (a binary file?); {example}.") from None
    except yaml.YAMLError as err:
        reason = " ".join(str(err).split())
        raise ValueError(f"{key}={str(path)!r} is not valid YAML ({reason}); {example}.") from None
    if content is None:
        raise ValueError(f"{key}={str(path)!r} is empty; {example}.")
    if not isinstance(content, dict):
        raise ValueError(f"{key}={str(path)!r} holds a YAML {type(content).__name__}, not a mapping; {example}.")


def check_num_rounds(num_rounds: int, *, key: str = "loop.num_rounds") -> None:
    """Reject a run that would train nothing.

    Raises:
        ValueError: if ``num_rounds < 1``.

    Example:
        >>> check_num_rounds(0)
        Traceback (most recent call last):
        ...
        ValueError: loop.num_rounds=0 trains nothing; it must be >= 1.
    """
    if num_rounds < 1:
        raise ValueError(f"{key}={num_rounds} trains nothing; it must be >= 1.")


def _trainer_parameters() -> frozenset[str]:
    return frozenset(inspect.signature(L.Trainer.__init__).parameters) - {"self"}


def check_trainer_options(options: Mapping[str, Any], *, key: str = "loop.trainer") -> None:
    """Check per-client ``lightning.Trainer`` options against ``Trainer.__init__``'s signature, then build one.

    The names are checked first so a typo is reported with its nearest valid name; building a Trainer (which
    trains nothing and writes nothing) then catches values Lightning rejects: an accelerator this machine
    lacks, an unknown precision or strategy, more devices than exist.

    Raises:
        ValueError: on an unknown option, an option the loop sets itself, or one Lightning rejects.

    Example:
        >>> check_trainer_options({"accelerator": "cpu", "precision": "32-true"})
        >>> check_trainer_options({"acelerator": "cpu"})
        Traceback (most recent call last):
        ...
        ValueError: loop.trainer.acelerator is not an option of lightning.Trainer; did you mean 'accelerator'?
    """
    known = _trainer_parameters()
    for name in options:
        if name in _LOOP_OWNED_TRAINER_OPTIONS:
            raise ValueError(
                f"{key}.{name} is set by the loop; use loop.local_epochs / loop.local_steps / loop.client_callbacks."
            )
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"did you mean {close[0]!r}?" if close else "see `help(lightning.Trainer)` for the options."
            raise ValueError(f"{key}.{name} is not an option of lightning.Trainer; {hint}")
    _check_accelerator(options.get("accelerator", "cpu"), key=f"{key}.accelerator")
    check_device_count(options, key=key)
    quiet = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            L.Trainer(**{"accelerator": "cpu", "devices": 1, **options, **quiet, "enable_model_summary": False})
    except Exception as err:  # Lightning raises MisconfigurationException, ValueError, RuntimeError, ...
        reason = " ".join(str(err).split())
        raise ValueError(f"{key}={dict(options)} is rejected by lightning.Trainer: {reason}") from None


def check_private_state_stays_local(
    model: torch.nn.Module, trainer: Mapping[str, Any] | None, client_callbacks: Sequence[Any] = ()
) -> None:
    """Refuse client Trainer options that would write a client's model, private state included, outside the
    client's own storage: Lightning's checkpointing and loggers (``loop.trainer``) and checkpoint callbacks
    (``loop.client_callbacks``), when the model holds private state (a key lock, a passport).

    The loop stores each client's private state in ``clients/`` itself; a Trainer's ``lightning_logs/`` would hold
    the same keys in the working directory, where the server side reads.

    Raises:
        ValueError: naming the option, a private key and the fix.

    Example:
        >>> check_private_state_stays_local(torch.nn.Linear(1, 1), {"enable_checkpointing": True})
    """
    from lightning.pytorch.callbacks import Checkpoint

    from lightning_fl.private import private_state

    private = sorted(private_state(model))
    if not private:
        return
    writers = [f"loop.trainer.{name}" for name in ("enable_checkpointing", "logger") if (trainer or {}).get(name)]
    writers += [f"loop.client_callbacks[{type(cb).__name__}]" for cb in client_callbacks if isinstance(cb, Checkpoint)]
    if writers:
        raise ValueError(
            f"{writers[0]} would write each client's model with its private state ({private[0]!r}"
            f"{f' and {len(private) - 1} more' if len(private) > 1 else ''}) outside the client's storage; remove it "
            "(the loop keeps every client's private state in clients/ and checkpoints every round itself)."
        )


def _check_accelerator(name: Any, *, key: str) -> None:
    """A named accelerator must be present on this machine (``gpu`` means CUDA or MPS, as in Lightning)."""
    from lightning.pytorch.accelerators import AcceleratorRegistry

    if not isinstance(name, str) or name in ("auto", "cpu"):
        return
    wanted = ("cuda", "mps") if name == "gpu" else (name,)
    if not set(wanted) <= set(AcceleratorRegistry.available_accelerators()):
        return  # unknown name: Lightning's own message lists the choices
    if not any(AcceleratorRegistry[w]["accelerator"].is_available() for w in wanted):
        raise ValueError(
            f"{key}={name!r} is not available on this machine; use 'cpu' (or 'auto' to take what there is)."
        )


def check_device_count(options: Mapping[str, Any], *, key: str = "loop.trainer") -> None:
    """Refuse more ``devices`` per node than this machine has, before any process is launched for them.

    Each device of a DDP federation is one process (:mod:`lightning_fl.federation.distributed`); on CPU the
    machine has ``os.cpu_count()`` of them, on GPUs ``torch.cuda.device_count()``. A list of GPU ids must name
    existing GPUs.

    Raises:
        ValueError: naming the requested and the available count, and the largest value that works.

    Example:
        >>> check_device_count({"accelerator": "cpu", "devices": 1})
        >>> check_device_count({"accelerator": "cpu", "strategy": "ddp", "devices": 100000})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: loop.trainer.devices=100000 asks for 100000 processes on this machine, which has ... CPU(s); ...
    """
    devices, accelerator = options.get("devices", 1), str(options.get("accelerator", "cpu"))
    gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    available, kind = (torch.cuda.device_count(), "GPU(s)") if gpu else (os.cpu_count() or 1, "CPU(s)")
    if isinstance(devices, list | tuple):
        wanted = [int(d) for d in devices]
        missing = [d for d in wanted if not 0 <= d < available] if gpu else []
        if missing:
            raise ValueError(
                f"{key}.devices={wanted} names GPU(s) {missing}, but this machine has {available} GPU(s) "
                f"(ids 0..{available - 1}); list existing ids."
            )
        count = len(wanted)
    elif isinstance(devices, int) or (isinstance(devices, str) and devices.isdigit()):
        count = int(devices)
    else:
        return  # "auto", -1: resolved by Lightning (and refused for a federation by ranks_requested)
    if count > available:
        raise ValueError(
            f"{key}.devices={devices!r} asks for {count} processes on this machine, which has {available} {kind}; "
            f"use at most {available}."
        )


def check_federated_data(datamodule: Any, *, key: str = "datamodule") -> None:
    """Refuse data that is not a :class:`~lightning_fl.datamodules.FederatedDataModule`, naming the wrapper.

    A user's ``LightningDataModule`` or ``Dataset`` holds one data set, not clients; the federation needs it split
    (``num_clients``, ``client_train_set``), which the wrapper does. Checked where a run takes its data, before
    anything reads it.

    Raises:
        TypeError: naming the class received and the call that wraps it.

    Example:
        >>> import lightning as L
        >>> check_federated_data(L.LightningDataModule())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: datamodule is a LightningDataModule (one data set, not clients); wrap it: ...
    """
    if all(hasattr(datamodule, name) for name in ("num_clients", "client_train_set", "test_dataloader")):
        return
    name = type(datamodule).__name__
    what = "LightningDataModule" if isinstance(datamodule, L.LightningDataModule) else name
    if isinstance(datamodule, L.LightningDataModule | torch.utils.data.Dataset):
        raise TypeError(
            f"{key} is a {what} (one data set, not clients); wrap it: FederatedDataModule({name}(...), "
            "num_clients=10, partition='iid') splits its training set across the clients, and its test set "
            "evaluates the global model."
        )
    raise TypeError(
        f"{key} is a {name}; pass a FederatedDataModule (a dataset name, an ImageFolder path, a Dataset or your "
        "LightningDataModule split across clients: FederatedDataModule(..., num_clients=10))."
    )


def check_output_dir(path: str | Path, *, key: str = "output_dir") -> None:
    """Check that ``path`` is, or can be created as, a writable directory, without creating it.

    Raises:
        ValueError: if ``path`` is empty (it would write into the current directory), ``path`` or one of its
            parents is a file, or the nearest existing directory is read-only.

    Example:
        >>> check_output_dir("runs/example")
        >>> check_output_dir("")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: output_dir='' is empty, which would write the run into the current directory; ...
    """
    if not str(path).strip():
        raise ValueError(
            f"{key}={str(path)!r} is empty, which would write the run into the current directory; give a directory "
            "path such as runs/my-run (or '.' to mean the current directory)."
        )
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{key}={str(path)!r} is a file, not a directory; choose a directory path.")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"{key}={str(path)!r} lies under the file {str(existing)!r}; choose a directory path.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{key}={str(path)!r} is not writable ({str(existing)!r} is read-only); choose another.")


def check_resume(resume: bool, checkpoint: Path, *, key: str = "resume") -> None:
    """Reject ``resume`` when there is no checkpoint to continue from (it would silently start afresh).

    Raises:
        ValueError: if ``resume`` is true and ``checkpoint`` does not exist.
    """
    if resume and not checkpoint.exists():
        raise ValueError(
            f"{key}=true but {str(checkpoint)!r} does not exist, so there is nothing to resume; "
            "drop --resume or set output_dir to the run to continue."
        )


def check_checkpoints_load_safely(paths: Iterable[Path]) -> None:
    """Open every checkpoint with ``torch.load(weights_only=True)`` before a resumed run relies on it.

    A checkpoint that holds anything but tensors and plain containers (a pickled object, possibly a planted
    payload) is refused by PyTorch's safe unpickler without running it; this turns that refusal into one line.

    Raises:
        ValueError: naming the first file that does not load safely.
    """
    for path in paths:
        try:
            torch.load(path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as err:
            reason = " ".join(str(err).split()).split(" Check the documentation", 1)[0][:200]
            raise ValueError(
                f"checkpoint {str(path)!r} does not load with torch.load(weights_only=True) and was not run "
                f"({reason}); it is corrupt or not written by lightning-fl: delete it or choose another output_dir."
            ) from None  # the reason is in the message; the refused file is not worth a traceback


def check_callback_schedule(
    callbacks: Sequence[object],
    *,
    num_rounds: int,
    num_clients: int,
    max_local_steps: int | None = None,
    key: str = "loop.callbacks",
) -> None:
    """Reject callbacks scheduled at rounds, clients or local steps that the run does not have (they would never
    fire).

    Any callback with ``rounds``, ``clients`` and/or ``step_indices`` attributes (0-based integers, ``None`` for
    all clients) is checked, e.g. :class:`~lightning_fl.callbacks.GradientLeakage`; ``max_local_steps`` is the
    most local optimiser steps a client takes in a round (``None``: not checked).

    Raises:
        ValueError: naming the callback, its index, the unreachable values and the run's shape.

    Example:
        >>> from types import SimpleNamespace
        >>> check_callback_schedule([SimpleNamespace(rounds={0, 99})], num_rounds=2, num_clients=4)
        Traceback (most recent call last):
        ...
        ValueError: loop.callbacks[0].init_args.rounds has [99], which never run: loop.num_rounds=2 gives rounds 0..1.
    """
    for index, callback in enumerate(callbacks):
        rounds = sorted(r for r in getattr(callback, "rounds", None) or () if r >= num_rounds)
        if rounds:
            raise ValueError(
                f"{key}[{index}].init_args.rounds has {rounds}, which never run: loop.num_rounds={num_rounds} "
                f"gives rounds 0..{num_rounds - 1}."
            )
        clients = sorted(c for c in getattr(callback, "clients", None) or () if not 0 <= c < num_clients)
        if clients:
            raise ValueError(
                f"{key}[{index}].init_args.clients has {clients}, which do not exist: data.num_clients={num_clients} "
                f"gives clients 0..{num_clients - 1}."
            )
        steps = sorted(s for s in getattr(callback, "step_indices", None) or () if s >= (max_local_steps or math.inf))
        if steps:
            raise ValueError(
                f"{key}[{index}].init_args.step_indices has {steps}, which never run: a client takes at most "
                f"{max_local_steps} local steps per round (loop.local_steps, or loop.local_epochs x its batches)."
            )


def update_norm_outliers(norms: Sequence[float], *, max_ratio: float = 1e3, max_norm: float = 1e6) -> list[int]:
    r"""Indices of client updates whose norm is not finite or far beyond the round's others.

    Update :math:`i` is an outlier when :math:`\|\Delta_i\|` is NaN or infinite, exceeds the absolute bound
    ``max_norm``, or exceeds ``max_ratio`` times the median norm of the round (a robust centre that one huge
    update cannot move). A loop drops these updates before aggregation and warns, as it does for non-finite
    ones; a single 3e38 update would otherwise overwrite the global model.

    Inferred: no paper fixes this rule; norm bounding of updates follows Sun et al., "Can You Really Backdoor
    Federated Learning?" (arXiv:1911.07963, Sec. 4), with the bound set relative to the median instead of fixed.

    Args:
        norms: :math:`\|\Delta_i\|_2` of the round's updates (compute them in float64; float32 overflows).
        max_ratio: allowed multiple of the median norm.
        max_norm: absolute bound on any update norm.

    Raises:
        ValueError: if ``max_ratio <= 1`` or ``max_norm <= 0``.

    Example:
        >>> update_norm_outliers([0.5, 0.7, 3e38, float("nan"), 0.6])
        [2, 3]
    """
    if max_ratio <= 1 or max_norm <= 0:
        raise ValueError(f"update_norm_outliers(max_ratio={max_ratio}, max_norm={max_norm}) needs > 1 and > 0.")
    finite = sorted(n for n in norms if math.isfinite(n))
    median = finite[(len(finite) - 1) // 2] if finite else 0.0  # the lower median: robust with two clients
    bound = min(max_norm, max_ratio * median) if median > 0 else max_norm
    return [i for i, n in enumerate(norms) if not math.isfinite(n) or n > bound]
