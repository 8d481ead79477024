"""The public global model as a ``safetensors`` file: what a run publishes, and what ``lightning-fl test`` loads.

Only :func:`~lightning_fl.private.public_state` is written, the state the server holds anyway; private layers
(passports, key-locks, private splits) stay on the clients and never reach the file. ``safetensors`` stores raw
tensors and no code, so loading a downloaded file cannot execute anything (unlike a pickle).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch import nn

from lightning_fl.private import load_state_into, private_state, public_state

__all__ = ["GLOBAL_MODEL_FILE", "load_global_model", "save_global_model"]

GLOBAL_MODEL_FILE = "global_model.safetensors"
"""The file name ``lightning-fl fit`` writes next to ``summary.json``."""


def save_global_model(model: nn.Module, path: str | Path, *, metadata: Mapping[str, str] | None = None) -> Path:
    """Write the public state of ``model`` (copies, contiguous, on CPU) to ``path``.

    Example:
        >>> import tempfile, torch
        >>> from lightning_fl.private import mark_private
        >>> net = nn.Sequential(nn.Linear(2, 2), mark_private(nn.Linear(2, 1)))
        >>> from safetensors.torch import load_file
        >>> sorted(load_file(save_global_model(net, tempfile.mkdtemp() + "/g.safetensors")))
        ['0.bias', '0.weight']
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous().clone() for k, v in public_state(model).items()}
    save_file(state, str(path), metadata={"content": "lightning-fl public global state", **(metadata or {})})
    return path


def load_global_model(model: nn.Module, path: str | Path) -> nn.Module:
    """Load a :func:`save_global_model` file into ``model`` in place; its private layers keep their own values.

    Raises:
        FileNotFoundError: when ``path`` does not exist or is not a regular file (a named pipe would block).
        ValueError: when the file is not a safetensors file, its tensors do not match the model's public state
            (names the keys and the fix), or a weight is NaN or infinite.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        what = "is not a regular file (a named pipe or device)" if path.exists() and not path.is_dir() else what
        raise FileNotFoundError(
            f"ckpt_path={str(path)!r} {what}; pass the {GLOBAL_MODEL_FILE} that lightning-fl fit writes."
        )
    try:
        state = load_file(str(path))
    except SafetensorError as err:
        raise ValueError(
            f"ckpt_path={str(path)!r} is not a safetensors file ({err}); pass the {GLOBAL_MODEL_FILE} a fit run wrote."
        ) from None
    public = public_state(model)
    private = set(private_state(model)) & set(state)
    if private:
        raise ValueError(f"{path} holds private tensors {sorted(private)[:3]}; a public export never may.")
    missing, unknown = sorted(set(public) - set(state)), sorted(set(state) - set(public))
    shapes = sorted(k for k in set(state) & set(public) if state[k].shape != public[k].shape)
    if missing or unknown or shapes:
        raise ValueError(
            f"{path} does not fit the configured model (missing {missing[:3]}, unknown {unknown[:3]}, shape "
            f"mismatch {shapes[:3]}); use the config (model:, defences:, data.image_size) the run was trained with."
        )
    broken = sorted(k for k, v in state.items() if v.is_floating_point() and not bool(v.isfinite().all()))
    if broken:
        raise ValueError(
            f"{path} holds non-finite weights (NaN or inf) in {broken[:3]}{' and more' if len(broken) > 3 else ''}: "
            "the run diverged; evaluate a checkpoint of an earlier round, or lower the learning rate and train again."
        )
    load_state_into(model, state)
    return model
