"""Vectorised clients train a round's plain clients at once with the sequential path's maths; the others say why not."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from lightning_fl import FederatedLoop
from lightning_fl.callbacks.base import FederatedCallback
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import PrivateSplit
from lightning_fl.federation.vectorised_contract import use_vectorised, vectorised_refusal
from lightning_fl.federation.vectorised_layers import StackedConv2d, StackedLinear
from lightning_fl.federation.vectorised_optim import StackedOptimizer
from tests.conftest import make_classifier
from tests.federation.user_model import UserNet

DELTA_TOLERANCE = 2e-4
"""How close a vectorised update is to the sequential one, relative to its L2 norm: float32 sums in another order,
which Adam's normalised steps amplify where a gradient is near 0 (6.5e-5 measured over 18 local steps; SGD: 1e-6)."""
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


class _Updates(FederatedCallback):
    """Keeps every raw update the server is sent (after the client transforms: none here)."""

    def __init__(self) -> None:
        self.updates = []

    def on_client_fit_end(self, federation, update) -> None:
        self.updates.append(update)


def _run(
    tmp_path: Path, vectorize, *, model_options=None, loop_options=None, defences=(), batch_size=24, client_callbacks=()
):
    dm = FederatedDataModule(
        "digits", num_clients=6, partition="dirichlet", alpha=0.5, image_size=16, batch_size=batch_size
    )
    torch.manual_seed(0)
    recorder = _Updates()
    options = {"num_rounds": 2, "clients_per_round": 3, "local_epochs": 1, **(loop_options or {})}
    loop = FederatedLoop(
        make_classifier(dm, **(model_options or {})),
        dm,
        defences=defences,
        callbacks=[recorder],
        client_callbacks=client_callbacks,
        output_dir=tmp_path / f"vectorize_{vectorize}",
        checkpoint=False,
        progress_bar=False,
        vectorize=vectorize,
        **options,
    )
    loop.fit()
    return loop, recorder.updates


def _assert_same_run(sequential, vectorised) -> None:
    (loop_s, updates_s), (loop_v, updates_v) = sequential, vectorised
    assert [u.client_id for u in updates_s] == [u.client_id for u in updates_v]
    for a, b in zip(updates_s, updates_v, strict=True):
        assert a.delta.keys() == b.delta.keys()
        difference = torch.cat([(b.delta[k] - a.delta[k]).flatten() for k in a.delta])
        norm = torch.cat([a.delta[k].flatten() for k in a.delta]).norm()
        assert float(difference.norm() / norm) < DELTA_TOLERANCE
        assert b.loss == pytest.approx(a.loss, rel=1e-5)
        assert (b.num_samples, b.metadata) == (a.num_samples, a.metadata)
    for a, b in zip(loop_s.history, loop_v.history, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)
        assert b["test_accuracy"] == pytest.approx(a["test_accuracy"], abs=1e-3)


@pytest.mark.parametrize(
    ("model_options", "loop_options"),
    [
        ({}, {}),  # Adam, clients of different sizes: the short ones finish first and are masked
        ({"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3}, {}),
        ({"optimizer": "adam", "weight_decay": 1e-3}, {"local_steps": 5, "local_epochs": 1}),
    ],
    ids=["adam_epochs", "sgd_momentum_decay", "adam_local_steps"],
)
def test_vectorised_fit_matches_sequential_updates_and_history(tmp_path: Path, model_options, loop_options) -> None:
    sequential = _run(tmp_path, False, model_options=model_options, loop_options=loop_options)
    vectorised = _run(tmp_path, True, model_options=model_options, loop_options=loop_options)
    _assert_same_run(sequential, vectorised)
    assert vectorised[0].vectorised._stacked is not None  # the client step trained them stacked, not one by one
    moved = max(float(u.delta[k].abs().max()) for u in vectorised[1] for k in u.delta)
    assert moved > 1e-3  # the clients trained: a comparison of untouched models would prove nothing
    if "local_steps" not in loop_options:  # clients of different lengths: the short ones were masked
        assert len({u.metadata["local_steps"] for u in vectorised[1]}) > 1


def test_vectorised_fit_keeps_private_layers_per_client(tmp_path: Path) -> None:
    sequential = _run(tmp_path, False, defences=[PrivateSplit(cut=1)])
    vectorised = _run(tmp_path, True, defences=[PrivateSplit(cut=1)])
    _assert_same_run(sequential, vectorised)
    states_s, states_v = sequential[0].clients, vectorised[0].clients
    trained = [k for k, s in enumerate(states_s) if s.initialised]
    assert trained and trained == [k for k, s in enumerate(states_v) if s.initialised]
    for k in trained:
        assert set(states_v[k].private) == {"backbone.body.0.weight", "backbone.body.0.bias"}
        for key, value in states_s[k].private.items():
            torch.testing.assert_close(states_v[k].private[key], value, **TOLERANCE)
    assert all(not set(u.delta) & set(states_v[trained[0]].private) for u in vectorised[1])


@pytest.mark.parametrize("sizes", [[5, 5, 5], [5, 3, 1]], ids=["equal", "ragged"])
@pytest.mark.parametrize("grouped", [False, True], ids=["per_client", "grouped"])
def test_stacked_layers_match_each_clients_own_layers(sizes: list[int], grouped: bool) -> None:
    """Each client's examples meet only its own weights, in every form (per-client channels-last convolutions, the
    grouped convolution a GPU takes for equal sizes, the batched product), forward and backward."""
    generator = torch.Generator().manual_seed(0)
    convs = [nn.Conv2d(2, 4, 3, stride=2, padding=1) for _ in sizes]
    linears = [nn.Linear(4 * 4 * 4, 3) for _ in sizes]
    x = torch.randn(sum(sizes), 2, 8, 8, generator=generator)
    conv, linear = StackedConv2d(convs[0]), StackedLinear()
    for layer, own in ((conv, convs), (linear, linears)):
        layer.sizes, layer.grouped = sizes, grouped
        layer.weight = torch.stack([m.weight.detach() for m in own]).requires_grad_()
        layer.bias = torch.stack([m.bias.detach() for m in own]).requires_grad_()
    out = linear(torch.sigmoid(conv(x)).flatten(1))
    expected = torch.cat(
        [lin(torch.sigmoid(c(part)).flatten(1)) for c, lin, part in zip(convs, linears, x.split(sizes), strict=True)]
    )
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    grads = torch.autograd.grad(out.square().sum(), [conv.weight, linear.weight])
    expected.square().sum().backward()
    torch.testing.assert_close(grads[0], torch.stack([c.weight.grad for c in convs]), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(grads[1], torch.stack([lin.weight.grad for lin in linears]), rtol=1e-4, atol=1e-6)


def random_client_batches(step_sizes: list[list[int]]) -> list:
    """One ``ClientBatches`` of random 16x16 digits-shaped batches per client, ``step_sizes[k]`` its batch sizes."""
    from lightning_fl.federation.vectorised_fit import ClientBatches

    generator = torch.Generator().manual_seed(0)
    return [
        ClientBatches([(torch.randn(n, 1, 16, 16, generator=generator), torch.randint(0, 10, (n,))) for n in sizes],
            [0] * len(sizes))
        for sizes in step_sizes
    ]  # fmt: skip


def test_padded_grouped_fit_matches_the_per_client_fit() -> None:
    """The GPU form (batches padded to the longest with weight-0 copies, one grouped convolution a layer) trains
    clients of different sizes and step counts as the per-client form does."""
    from lightning_fl.federation.vectorised_fit import fit_stacked, stacked_copy

    data = random_client_batches([[8, 8, 3], [8, 5], [2]])
    torch.manual_seed(0)
    model = make_classifier(_digits(), optimizer="sgd", lr=0.1, momentum=0.9)
    starts = [{name: value.detach().clone() for name, value in model.named_parameters()}] * 3
    names = {id(v): n for n, v in model.named_parameters()}
    outcomes = {}
    for grouped in (False, True):
        optimizer = StackedOptimizer.like(model.configure_optimizers(), names)
        cpu = torch.device("cpu")
        outcomes[grouped] = fit_stacked(stacked_copy(model), starts, data, optimizer, device=cpu, grouped=grouped)
    for a, b in zip(outcomes[False], outcomes[True], strict=True):
        assert (a.steps, a.epochs) == (b.steps, b.epochs)
        assert b.loss == pytest.approx(a.loss, rel=1e-5)
        for key, value in a.state.items():
            torch.testing.assert_close(b.state[key], value, rtol=1e-4, atol=1e-5)
    moved = max(float((outcomes[True][2].state[k] - starts[2][k]).abs().max()) for k in starts[2])
    assert moved > 1e-3  # the two-example client, padded to 8, trained


def test_stacked_optimizer_leaves_finished_rows_untouched() -> None:
    """Rows past ``active`` keep their parameters and state; the others follow ``torch.optim.Adam`` each."""
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(3, 4, generator=generator)
    grads = [torch.randn(3, 4, generator=generator) for _ in range(3)]
    params = {"w": start.clone()}
    references = [start[k].clone().requires_grad_() for k in range(3)]
    optimisers = [torch.optim.Adam([p], lr=0.1, weight_decay=0.01) for p in references]
    stacked = StackedOptimizer.like(optimisers[0], {id(references[0]): "w"})
    for step, active in enumerate([3, 3, 1], start=1):
        stacked.step(params, {"w": grads[step - 1][:active]}, active=active, step=step)
        for k in range(active):
            references[k].grad = grads[step - 1][k].clone()
            optimisers[k].step()
    for k in range(3):
        torch.testing.assert_close(params["w"][k], references[k].detach(), rtol=0, atol=1e-7)
    assert int(stacked.state["w"]["exp_avg"][1:].ne(0).sum()) > 0  # rows 1, 2 kept the state of their 2 steps


class _Dropout(UserNet):
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def per_example_loss(self, batch):
        return nn.functional.cross_entropy(self.drop(self(batch[0])), batch[1], reduction="none")


def test_dropout_draws_each_clients_masks_independently() -> None:
    """Two clients with the same start and the same batches: with dropout their stacked fits differ (each example
    of the pass has its own mask), without it they are equal; a dropout model qualifies."""
    from lightning_fl.federation.vectorised_fit import ClientBatches, fit_stacked, stacked_copy

    assert vectorised_refusal(_Dropout(), options={"accelerator": "cpu"}) is None
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(6, 1, 16, 16, generator=generator), torch.arange(6)) for _ in range(3)]
    trained = {}
    for p in (0.0, 0.5):
        torch.manual_seed(0)
        model = _Dropout()
        model.drop.p = p
        start = {name: value.detach().clone() for name, value in model.named_parameters()}
        optimizer = StackedOptimizer.like(model.configure_optimizers(), {id(v): n for n, v in model.named_parameters()})
        data = [ClientBatches(batches, [0, 0, 0]) for _ in range(2)]
        trained[p] = fit_stacked(stacked_copy(model), [start, start], data, optimizer, device=torch.device("cpu"))
    for p, (a, b) in trained.items():
        gap = max(float((a.state[k] - b.state[k]).abs().max()) for k in a.state)
        assert (gap == 0.0) if p == 0.0 else (gap > 1e-3), (p, gap)
        assert (a.loss == b.loss) if p == 0.0 else (a.loss != b.loss)


class _AdamW(UserNet):
    def per_example_loss(self, batch):
        return nn.functional.cross_entropy(self(batch[0]), batch[1], reduction="none")

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())


@pytest.mark.parametrize(
    ("model", "options", "reason"),
    [
        (lambda: UserNet(), {}, "defines no per_example_loss"),
        (lambda: _AdamW(), {}, "optimiser AdamW"),
        (lambda: make_classifier(_digits(), backbone="resnet20"), {}, "BatchNorm2d"),
        (lambda: make_classifier(_digits()), {"gradient_clip_val": 1.0}, "gradient_clip_val"),
        (lambda: make_classifier(_digits()), {"devices": 2}, "runs on one device"),
    ],
    ids=["no_contract", "adamw", "batchnorm", "trainer_option", "two_devices"],
)
def test_vectorised_refusal_says_why(model, options, reason: str) -> None:
    assert reason in vectorised_refusal(model(), options={"accelerator": "cpu", **options})


def _digits() -> FederatedDataModule:
    return FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16)


def test_vectorize_true_on_a_refused_model_warns_and_trains_one_by_one(tmp_path: Path) -> None:
    dm = FederatedDataModule("digits", num_clients=3, partition="iid", image_size=16, seed=0)
    histories = []
    for vectorize in (False, True):
        torch.manual_seed(0)
        options = {"num_rounds": 1, "clients_per_round": 3, "local_steps": 2, "checkpoint": False}
        loop = FederatedLoop(
            UserNet(), dm, eval_metric="acc", train_loss_key="loss", output_dir=tmp_path / str(vectorize),
            progress_bar=False, vectorize=vectorize, **options,
        )  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loop.fit()
        histories.append(loop.history)
        said = [str(w.message) for w in caught if "loop.vectorize" in str(w.message)]
        assert said == ([] if vectorize is False else [said[0]])
    assert "per_example_loss" in said[0]
    assert histories[0] == histories[1]  # the sequential path, bit for bit


@pytest.mark.parametrize(
    ("mode", "clients", "parameters", "device", "expected"),
    [
        ("auto", 5, 15_000, "cpu", True),
        ("auto", 1, 15_000, "cpu", False),
        ("auto", 5, 62_000, "cpu", True),  # LeNet-5: faster stacked
        ("auto", 5, 265_000, "cpu", False),  # the MLP: slower stacked on a CPU
        ("auto", 5, 20_000_000, "cuda", True),
        (True, 1, 20_000_000, "cpu", True),
        (False, 5, 15_000, "cpu", False),
    ],
)
def test_use_vectorised_auto_rule(mode, clients: int, parameters: int, device: str, expected: bool) -> None:
    use, _ = use_vectorised(mode, None, clients=clients, parameters=parameters, device=torch.device(device))
    assert use is expected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"vectorize": "yes"}, r"loop\.vectorize='yes' is unknown; use true, false or auto"),
        ({"vectorize": True, "workers": 2}, r"cannot be combined with loop\.workers > 1"),
    ],
)
def test_loop_rejects_bad_vectorize_settings(
    tiny_digits: FederatedDataModule, tmp_path: Path, options, message
) -> None:
    with pytest.raises(ValueError, match=message):
        FederatedLoop(make_classifier(tiny_digits), tiny_digits, output_dir=tmp_path, **options)


def test_auto_with_worker_processes_says_why_the_clients_train_there(
    tiny_digits: FederatedDataModule, tmp_path: Path
) -> None:
    loop = FederatedLoop(make_classifier(tiny_digits), tiny_digits, output_dir=tmp_path, workers=2, vectorize="auto")
    assert loop.vectorised.decision == "no (auto: loop.workers, Ray or DDP ranks train the clients in other processes)"


@pytest.mark.parametrize("value", ["true", "auto"])
def test_cli_vectorize_option_trains_the_quickstart_vectorised(tmp_path: Path, value: str, caplog, capsys) -> None:
    """The decision is logged when it changes and printed with the run's result (``auto`` decides per round)."""
    from lightning_fl.cli import main

    quickstart = Path(__file__).parents[2] / "configs" / "quickstart.yaml"
    options = ["--loop.num_rounds", "1", "--data.image_size", "16", "--loop.progress_bar", "false"]
    with caplog.at_level("INFO", logger="lightning_fl.federation.loop"):
        rc = main(
            ["fit", "--config", str(quickstart), "--output_dir", str(tmp_path), *options, "--loop.vectorize", value]
        )
    assert rc == 0
    assert "vectorised client fit: yes" in caplog.text
    assert f"vectorised client fit (loop.vectorize={value}): yes (" in capsys.readouterr().out


def test_cli_prints_why_auto_trains_clients_one_by_one(tmp_path: Path, capsys) -> None:
    from lightning_fl.cli import main

    quickstart = Path(__file__).parents[2] / "configs" / "quickstart.yaml"
    options = ["--loop.num_rounds", "1", "--data.image_size", "16", "--loop.progress_bar", "false"]
    early_stopping = ["--loop.client_callbacks+=lightning.pytorch.callbacks.EarlyStopping"]
    early_stopping += ["--loop.client_callbacks.monitor", "train_loss"]
    args = ["fit", "--config", str(quickstart), "--output_dir", str(tmp_path), *options, *early_stopping]
    assert main([*args, "--loop.vectorize", "auto"]) == 0
    assert (
        "vectorised client fit (loop.vectorize=auto): no (client callbacks ['EarlyStopping'])"
        in capsys.readouterr().out
    )


def test_cli_rejects_unknown_vectorize_value(tmp_path: Path, capsys) -> None:
    from lightning_fl.cli import main

    quickstart = Path(__file__).parents[2] / "configs" / "quickstart.yaml"
    rc = main(["fit", "--config", str(quickstart), "--output_dir", str(tmp_path), "--loop.vectorize", "sometimes"])
    assert rc == 2
    assert "loop.vectorize='sometimes' is invalid" in capsys.readouterr().err
    assert not (tmp_path / "summary.json").exists()


def test_resume_with_another_vectorize_setting_exits_2_naming_it(tmp_path: Path, capsys) -> None:
    from lightning_fl.cli import main

    quickstart = Path(__file__).parents[2] / "configs" / "quickstart.yaml"
    fast = [
        "--data.image_size",
        "16",
        "--loop.local_steps",
        "1",
        "--loop.eval_every",
        "0",
        "--loop.progress_bar",
        "false",
    ]

    def fit(rounds: str, vectorize: str, *extra: str) -> int:
        run = ["--loop.num_rounds", rounds, "--loop.vectorize", vectorize, *extra]
        return main(["fit", "--config", str(quickstart), "--output_dir", str(tmp_path), *fast, *run])

    assert fit("1", "false") == 0
    manifest = (tmp_path / "manifest.json").read_bytes()
    capsys.readouterr()
    assert fit("2", "true", "--resume", "true") == 2
    assert "loop.vectorize: False -> True" in capsys.readouterr().err
    assert (tmp_path / "manifest.json").read_bytes() == manifest  # the run is untouched
    assert fit("2", "false", "--resume", "true") == 0  # the same setting resumes
