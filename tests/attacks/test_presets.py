"""Attack presets: each is its paper's settings of the gradient-matching engine, and builds from YAML as a class."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import yaml
from jsonargparse import ArgumentError, ArgumentParser

from lightning_fl.attacks import (
    DLGAttack,
    GradientAttack,
    IDLGAttack,
    InvertingGradientsAttack,
    KnownMaskAttack,
    NoiseAwareAttack,
    PrivateUnknownsAttack,
    SeeThroughGradientsAttack,
)
from lightning_fl.config import build
from lightning_fl.presets import REQUIRED, Preset

_COMMON = {"progress_bar": True, "seed": 0}
_DLG = {"max_iterations": "auto", "lr": 1.0, "restarts": 4, "init": "rand", "labels": "auto"}
_DLG |= {"label_strategy": "bias_count", "layers": None, "stop_below": "auto", "keep_best_after": 100}
_DLG |= {"recover_stalled": True, "tv_weight": "auto", **_COMMON}
_IG = {"max_iterations": 4800, "lr": 0.1, "restarts": 4, "tv_weight": 1e-4, "label_strategy": "bias_count"}
_IG |= {"init": "randn", "signed": True, "boxed": True, "lr_decay": True, "layers": None, "bn_statistics": "none"}
_IG |= {"bn_weight": 0.0, "consensus": False, "settle_labels_after": None, **_COMMON}
_STG = {"max_iterations": 2000, "lr": 0.1, "restarts": 4, "bn_weight": 0.1, "group_weight": 0.01}
_STG |= {"l2_weight": 1e-6, "tv_weight": 1e-4, "label_strategy": "yin", "consensus": False, **_COMMON}
_NOISE = {"noise": "gaussian", "noise_scale": REQUIRED, "prior_weight": 1e-4, "model_error": 0.01}
_NOISE |= {"max_iterations": 4800, "lr": 0.1}
_NOISE |= {"restarts": 8, "label_strategy": "bias_count", "init": "randn", "layers": None, "bn_statistics": "none"}
_NOISE |= {"bn_weight": 0.0, "consensus": False}
_NOISE |= _COMMON
_IG_STEPS = ("signed", "boxed", "lr_decay")
_PRIVATE = {"private": "secrets", "private_step": 0.1} | {k: v for k, v in _IG.items() if k not in _IG_STEPS}
_LBFGS = {"distance": "euclidean", "optimizer": "lbfgs", "signed": False, "boxed": False, "lr_decay": False}
_SIGNED_ADAM = {"optimizer": "adam", "labels": "infer", "signed": True, "boxed": True, "lr_decay": True}

PAPERS: dict[type, tuple[dict[str, Any], dict[str, Any]]] = {
    # the preset's arguments and their defaults (its docstring's paper settings), then what the paper pins
    DLGAttack: (_DLG, _LBFGS),
    IDLGAttack: ({k: v for k, v in _DLG.items() if k != "labels"}, {**_LBFGS, "labels": "infer"}),
    InvertingGradientsAttack: (_IG, {**_SIGNED_ADAM, "distance": "cosine"}),
    KnownMaskAttack: (_IG, {**_SIGNED_ADAM, "distance": "cosine"}),
    SeeThroughGradientsAttack: (
        _STG,
        {**_SIGNED_ADAM, "distance": "euclidean", "signed": False, "init": "randn", "bn_statistics": "running"},
    ),
    NoiseAwareAttack: (_NOISE, {**_SIGNED_ADAM, "distance": "euclidean"}),
    PrivateUnknownsAttack: (_PRIVATE, {**_SIGNED_ADAM, "distance": "cosine"}),
}
REQUIRED_ARGUMENTS = {NoiseAwareAttack: {"noise_scale": 0.01}}


@pytest.mark.parametrize("attack_type", list(PAPERS), ids=lambda t: t.__name__)
def test_preset_defaults_are_its_papers(attack_type: type) -> None:
    arguments, pinned = PAPERS[attack_type]
    signature = inspect.signature(attack_type).parameters
    assert {name: p.default for name, p in signature.items()} == arguments
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in signature.values())
    required = REQUIRED_ARGUMENTS.get(attack_type, {})
    attack = attack_type(**required)
    assert {name: getattr(attack, name) for name in arguments} == arguments | required
    assert {name: getattr(attack, name) for name in pinned} == pinned


OVERRIDES = {
    DLGAttack: {"restarts": 2},
    IDLGAttack: {"label_strategy": "idlg"},
    InvertingGradientsAttack: {"tv_weight": 0.01},
    KnownMaskAttack: {"max_iterations": 7},
    SeeThroughGradientsAttack: {"group_weight": 0.5},
    NoiseAwareAttack: {"noise_scale": 0.1, "noise": "laplace"},
    PrivateUnknownsAttack: {"private": "all"},
}


def _yaml(attack_type: type, init_args: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {"attack": {"class_path": f"lightning_fl.attacks.{attack_type.__name__}", "init_args": init_args}}
    )


@pytest.mark.parametrize("attack_type", list(OVERRIDES), ids=lambda t: t.__name__)
def test_yaml_class_path_builds_each_preset_with_an_override(attack_type: type) -> None:
    text = _yaml(attack_type, OVERRIDES[attack_type])
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--attack", type=GradientAttack)
    by_cli = parser.instantiate_classes(parser.parse_string(text)).attack
    by_bench = build(yaml.safe_load(text)["attack"])
    expected = PAPERS[attack_type][0] | OVERRIDES[attack_type]
    for attack in (by_cli, by_bench):
        assert type(attack) is attack_type
        assert {name: getattr(attack, name) for name in expected} == expected


def test_yaml_init_arg_typo_names_the_key() -> None:
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--attack", type=GradientAttack)
    with pytest.raises(ArgumentError, match="max_iteratons"):
        parser.parse_string(_yaml(SeeThroughGradientsAttack, {"max_iteratons": 5}))
    with pytest.raises(ValueError, match=r"init_args\.signed is not an option of .*SeeThroughGradientsAttack"):
        build(yaml.safe_load(_yaml(SeeThroughGradientsAttack, {"signed": True}))["attack"])


def test_preset_refuses_a_setting_both_pinned_and_offered() -> None:
    with pytest.raises(ValueError, match=r"\['lr'\] are both pinned and arguments"):
        Preset(pinned={"lr": 1.0}, defaults={"lr": 0.1})


def test_preset_without_a_required_argument_names_it() -> None:
    with pytest.raises(TypeError, match="NoiseAwareAttack\\(\\): missing a required argument: 'noise_scale'"):
        NoiseAwareAttack()


def test_preset_settings_cannot_be_changed_through_the_class() -> None:
    with pytest.raises(TypeError):
        DLGAttack.preset.defaults["lr"] = 0.5  # type: ignore[index]
