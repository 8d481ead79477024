"""The quickstart workload as Flower apps, for ``benchmarks/scaling.py flower``.

Two ways to run ``configs/quickstart.yaml``'s federation (digits 32x32, 10 clients, Dirichlet 0.5, seed 0; the sigmoid
DLG LeNet, Adam lr 2e-3, batch 32, 3 local epochs, 5 clients a round, FedAvg, global test accuracy every round) in
Flower's simulation engine (Ray actors, one CPU each):

* ``bare``: a plain Flower app as Flower's PyTorch quickstart writes it (Message API, 1.42): a ``ClientApp`` whose
  ``train`` loads the arrays into the same model and runs a bare PyTorch loop on its partition, and a ``ServerApp``
  running Flower's own ``FedAvg`` strategy (``fraction_train=0.5``, Flower samples the clients) with a centralised
  ``evaluate_fn`` on the test set.
* ``adapter``: :class:`lightning_fl.FlowerFederation` of the same ``FederatedLoop`` that ``lightning-fl fit`` builds
  (Lightning client fits, our selection, seeds and FedAvg).

This is a module, not a script: Flower sends the ClientApp to its Ray actors, which import it by name (scaling.py
puts ``benchmarks/`` on ``PYTHONPATH``); a function of ``__main__`` would be sent by value with every message.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from lightning_fl import FederatedDataModule, FederatedLoop, FlowerFederation, ImageClassifier, derive_seed
from lightning_fl.bench import build_loop, fit_config_spec
from lightning_fl.federation.client_runner import seed_all

ROUNDS_VARIABLE = "LIGHTNING_FL_BENCH_ROUNDS"  # set by scaling.py; the Ray actors inherit it
ACCURACIES: list[float] = []  # the test accuracy of each round of the bare run
QUICKSTART = Path(__file__).resolve().parent.parent / "configs" / "quickstart.yaml"


@functools.cache
def data() -> FederatedDataModule:
    """The quickstart's partition, loaded once per process."""
    spec = fit_config_spec(QUICKSTART)
    dm = FederatedDataModule(**{"seed": spec["seed"], **spec["data"]})
    dm.setup()
    return dm


def rounds() -> int:
    """The number of rounds of this run (25, as in the quickstart, unless scaling.py says otherwise)."""
    return int(os.environ.get(ROUNDS_VARIABLE, "25"))


def model() -> ImageClassifier:
    """The quickstart's model, as ``lightning-fl fit`` initialises it (``seed_everything: 0``)."""
    spec = fit_config_spec(QUICKSTART)
    L.seed_everything(spec["seed"], verbose=False)
    return ImageClassifier(**data().model_options, **spec["model"]["init_args"])


@functools.cache
def _worker() -> ImageClassifier:
    return model()


bare_client = ClientApp()


@bare_client.train()
def bare_train(message: Message, context: Context) -> Message:
    """Flower's quickstart client: load the global arrays, 3 epochs of Adam on this node's partition."""
    client, round_idx = int(context.node_config["partition-id"]), int(message.content["config"]["server-round"])
    net = _worker()
    net.load_state_dict(message.content["arrays"].to_torch_state_dict())
    seed = derive_seed(0, round_idx, "fit", client)
    seed_all(seed)
    optimizer = torch.optim.Adam(net.parameters(), lr=2e-3)
    net.train()
    loss = torch.zeros(())
    for _ in range(3):
        for x, y in data().train_dataloader(client, seed=seed):
            optimizer.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
    metrics = MetricRecord({"train_loss": float(loss), "num-examples": data().num_train_samples(client)})
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=message)


def _evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    net = model()
    net.load_state_dict(arrays.to_torch_state_dict())
    net.eval()
    correct = n = 0
    with torch.no_grad():
        for x, y in data().test_dataloader():
            correct += int((net(x).argmax(1) == y).sum())
            n += len(y)
    if server_round > 0:  # round 0 scores the initial model
        ACCURACIES.append(correct / n)
    return MetricRecord({"accuracy": correct / n})


bare_server = ServerApp()


@bare_server.main()
def bare_main(grid: Grid, context: Context) -> None:
    """Flower's FedAvg: half the nodes train each round, a centralised test accuracy after each round."""
    strategy = FedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=10, min_train_nodes=5)
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model().state_dict()),
        num_rounds=rounds(),
        train_config=ConfigRecord({}),
        evaluate_fn=_evaluate,
    )


def build_quickstart() -> FederatedLoop:
    """The ``FederatedLoop`` that ``lightning-fl fit -c configs/quickstart.yaml`` builds (writing to a temp dir)."""
    spec = fit_config_spec(QUICKSTART)
    spec["loop"] = {**spec["loop"], "num_rounds": rounds()}
    return build_loop(spec, tempfile.mkdtemp(prefix="flower-quickstart-"), checkpoint=True)  # as the command does


def run(impl: str) -> list[float]:
    """Run the ``bare`` or ``adapter`` Flower simulation; returns the test accuracy of each round."""
    from flwr.simulation import run_simulation

    resources: dict[str, Any] = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
    if impl == "adapter":
        summary = FlowerFederation(build_quickstart).run_simulation(backend_config=resources)
        return [h["test_accuracy"] for h in summary["history"]]
    run_simulation(server_app=bare_server, client_app=bare_client, num_supernodes=10, backend_config=resources)
    return ACCURACIES
