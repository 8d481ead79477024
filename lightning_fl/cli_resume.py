"""Why ``lightning-fl fit --resume true`` refuses a run: the changed settings named as the config writes them.

The fingerprint a checkpoint stores (:mod:`lightning_fl.federation.fingerprint`) decides whether a run may continue,
and it is computed from the built parts: its keys name attributes (``defences[0].dp.noise_multiplier``), a
DataModule's batch size as ``data.batch_size``, the seed as ``seed``. The command knows more: the config the run
recorded (``config.yaml``) and the one given now. So the refusal names the config keys, dotted as on the command line
(``defences.0.init_args.noise_multiplier: 6.0 -> 3.0``), that differ where the fingerprint changed, and the
fingerprint's own keys only where the config is the same (a default that changed in the code).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from lightning_fl.federation.checkpoint import fingerprint_changes, refuse_other_settings
from lightning_fl.federation.fingerprint import PLUGIN_GROUPS

__all__ = ["check_resume_settings", "config_key"]

_INDEXED = re.compile(r"^(?P<group>[a-z_.]+?)\[(?P<index>\d+)\]")


def config_key(key: str) -> str:
    """The part of a fit config that holds the setting behind the fingerprint key ``key``.

    Example:
        >>> [config_key(k) for k in ("seed", "data.client_indices (digest)", "defences[0].dp.noise_multiplier")]
        ['seed_everything', 'data', 'defences.0']
        >>> [config_key(k) for k in ("loop.aggregator.weighted", "model layers and shapes (digest)", "loop.eval_on")]
        ['loop.aggregator', 'model', 'loop.eval_on']
    """
    if key == "seed":
        return "seed_everything"
    if key.startswith("data."):  # a DataModule's own settings and the derived seed and split live under data too
        return "data"
    if key.startswith("model"):
        return "model"
    indexed = _INDEXED.match(key)
    if indexed:
        return f"{indexed['group']}.{indexed['index']}"
    return next((group for group in PLUGIN_GROUPS if key == group or key.startswith(f"{group}.")), key)


def _leaves(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of every leaf of a config, list entries by index (``defences.0.init_args.x``)."""
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        yield key, value
        return
    for k, v in items:
        yield from _leaves(v, f"{key}.{k}" if key else str(k))


def _under(key: str, part: str) -> bool:
    return key == part or key.startswith(f"{part}.")


def check_resume_settings(
    output_dir: Path, *, stored: Mapping[str, Any], current: Mapping[str, Any], config: Mapping[str, Any]
) -> None:
    """Refuse a resume whose fingerprint ``current`` differs from the ``stored`` one, naming config keys.

    Args:
        output_dir: the run directory; its ``config.yaml`` is the config the run recorded.
        stored: the fingerprint of the run's manifest.
        current: the fingerprint of the run being resumed.
        config: the resolved config given now, as the run records it.

    Raises:
        ValueError: one line: each changed setting as ``key: old -> new``.
    """
    changes = fingerprint_changes(stored, current)
    if not changes:
        return
    recorded_file = output_dir / "config.yaml"
    recorded = yaml.safe_load(recorded_file.read_text()) if recorded_file.is_file() else {}
    before, now = dict(_leaves(recorded or {})), dict(_leaves(config))
    named: dict[str, tuple[Any, Any]] = {}
    for part in dict.fromkeys(config_key(k) for k in changes):
        differ = {k: (before.get(k), now.get(k)) for k in dict.fromkeys([*before, *now]) if _under(k, part)}
        differ = {k: values for k, values in differ.items() if values[0] != values[1]}
        named.update(differ or {k: values for k, values in changes.items() if config_key(k) == part})
    raise refuse_other_settings(output_dir, named)
