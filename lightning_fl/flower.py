"""The same federation as a Flower ``ServerApp`` and ``ClientApp``, so an experiment moves to real devices.

Flower (Beutel et al., 2020, "Flower: A Friendly Federated Learning Research Framework") runs a ``ServerApp`` that
sends :class:`flwr.app.Message` objects through a ``Grid`` to ``ClientApp`` instances on SuperNodes: simulated
(``flwr.simulation.run_simulation``, Ray actors) or real devices (``flower-supernode``, the deployment engine).
:class:`FlowerFederation` wraps a function that builds a :class:`~lightning_fl.federation.loop.FederatedLoop`
(model, data, defences, aggregation) and splits it along the trust boundary:

* ``ServerApp``: the loop itself, unchanged (selection, downlink with the broadcast transforms, FL callbacks and
  leak points, update checks, the aggregator and the server transforms, evaluation, checkpoints, logs), with a
  :class:`FlowerPool` as its client pool: each round's selected clients are sent to their SuperNodes as ``train``
  messages (an ``ArrayRecord`` of the state the client received) instead of worker processes. The server's loop
  runs no client transform (nor their client-side set-up): they run on the clients.
* ``ClientApp``: on a ``train`` message, the node's client (``node_config["partition-id"]``) is trained by the
  loop's :class:`~lightning_fl.federation.client_runner.ClientRunner`, exactly as in-process (seeds from
  ``(seed, round, client)``), then encoded by the client transforms (clip, noise). Its own state (private layers,
  passports, keys, client-side component state) is kept in the node's Flower ``Context.state`` and never put in
  a reply; the reply carries the encoded update, its sample count, loss and public metadata, and the metrics the
  client transforms logged. Each ClientApp process builds the loop once and reuses one model for every client
  it trains (the design of :mod:`lightning_fl.federation.workers`).

Because the loop, its selector and its seeds are the same, a Flower run gives the history of ``FederatedLoop``
for the same seed. Not supported (refused before training): client
transforms that decode the aggregate (Paillier: the decryption would need another round trip to a client),
``eval_on="clients"`` (the server holds no client's private layers), client Trainer callbacks, a local-gradient
(type-2) listener, ``workers``/``backend``/DDP settings. Needs the ``flower`` extra
(``pip install 'lightning-fl[flower]'``).
"""

from __future__ import annotations

import io
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lightning_fl.contexts import ClientContext, ClientState, RoundContext
from lightning_fl.federation.client_store import ClientFit
from lightning_fl.federation.failures import ClientFailure
from lightning_fl.federation.updates import encode_update
from lightning_fl.messages import ClientUpdate
from lightning_fl.transforms import ClientTransform

if TYPE_CHECKING:
    from lightning_fl.federation.loop import FederatedLoop

__all__ = ["FlowerFederation", "FlowerPool", "check_flower"]

_STATE_KEY = "lightning_fl.client_state"  # the client's own state in its Flower Context.state
_CLIENT_LOOPS: dict[str, Any] = {}  # one built loop per ClientApp process and federation (by its key)


def _flwr() -> Any:
    """The ``flwr`` package, or an ``ImportError`` with the install line."""
    try:
        import flwr.app
        import flwr.clientapp
        import flwr.serverapp
        import flwr.simulation
    except ImportError as err:
        raise ImportError("the Flower adapter needs Flower: pip install 'lightning-fl[flower]'") from err
    return flwr


def check_flower(loop: FederatedLoop) -> None:
    """Raise a one-line ``ValueError`` when ``loop`` cannot run as Flower apps (before any training)."""
    decoders = [type(t).__name__ for t in loop.client_transforms if _decodes_aggregate(t)]
    if decoders:
        raise ValueError(
            f"client transforms {decoders} decode the aggregate on a client (secure aggregation), which the Flower "
            "adapter does not support yet; run them with FederatedLoop.fit()."
        )
    if loop.evaluator.on != "global":
        raise ValueError(
            "loop.eval_on='clients' needs the clients' private layers on the server; use 'global' with Flower."
        )
    if loop.client_callbacks:
        names = sorted({type(cb).__name__ for cb in loop.client_callbacks})
        raise ValueError(f"the Flower adapter cannot run client Trainer callbacks {names} yet; drop them.")
    if loop.leaks.listeners("on_local_gradient"):
        raise ValueError("the Flower adapter cannot tap local gradients (type-2 leak point) on the clients.")
    if loop.workers != 1 or loop.backend != "processes" or loop.ranks != 1:
        raise ValueError(
            "loop.workers, loop.backend and DDP ranks do not apply under Flower (its SuperNodes train the "
            "clients); leave them at their defaults."
        )


def _decodes_aggregate(transform: ClientTransform) -> bool:
    return type(transform).decode_aggregate is not ClientTransform.decode_aggregate


def _to_bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _from_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)


class FlowerPool:
    """The loop's client pool under a Flower ``ServerApp``: a round's clients are trained on their SuperNodes.

    Args:
        grid: the ``ServerApp``'s grid.
        nodes: the SuperNode of each client id.
        timeout: seconds to wait for a round's replies (``None``: until every client replied).
    """

    encodes = True  # the ClientApps run the client transforms

    def __init__(
        self,
        grid: Any,
        nodes: Mapping[int, int],
        *,
        timeout: float | None = None,
    ) -> None:
        self.flwr, self.grid, self.nodes, self.timeout = _flwr(), grid, dict(nodes), timeout

    def run(self, fits: Sequence[tuple[int, int, dict[str, Tensor]]]) -> dict[int, Any]:
        """Send ``(client_id, round_idx, received)`` as ``train`` messages; the replies (or why none came) by id."""
        app = self.flwr.app
        messages = [
            app.Message(
                app.RecordDict(
                    {
                        "arrays": app.ArrayRecord(torch_state_dict={k: v.detach().cpu() for k, v in received.items()}),
                        "config": app.ConfigRecord({"round": round_idx, "client": client_id}),
                    }
                ),
                dst_node_id=self.nodes[client_id],
                message_type=app.MessageType.TRAIN,
                group_id=str(round_idx),
            )
            for client_id, round_idx, received in fits
        ]
        client_of = {self.nodes[k]: k for k, _, _ in fits}
        replies: dict[int, Any] = {k: (k, f"no reply from its SuperNode within {self.timeout} s") for k, _, _ in fits}
        for reply in self.grid.send_and_receive(messages, timeout=self.timeout):
            replies[client_of[reply.metadata.src_node_id]] = reply
        return replies

    def collect(self, reply: Any, *, ctx: ClientContext) -> ClientFit:
        """The fit in ``reply`` (its encoded update; the private state stays on the node); logs the metrics its client
        transforms logged through ``ctx``.

        Raises:
            ClientFailure: with the ClientApp's error when the client failed, or when it did not reply: a remote
                client's crash or silence is its own failure (:mod:`lightning_fl.federation.failures`).
        """
        if isinstance(reply, tuple):
            raise ClientFailure(reply[0], "its Flower SuperNode", reply[1])
        if reply.has_error():
            client_id = next(k for k, node in self.nodes.items() if node == reply.metadata.src_node_id)
            raise ClientFailure(client_id, "its Flower ClientApp", reply.error.reason)
        content = reply.content
        meta, logged = dict(content["metadata"]), dict(content["logged"])
        if logged:
            ctx.log_metrics(logged)
        report = content["report"]
        update = ClientUpdate(
            client_id=int(report["client"]),
            round_idx=int(report["round"]),
            delta=content["arrays"].to_torch_state_dict(),
            num_samples=int(content["metrics"]["num-examples"]),
            loss=float(content["metrics"]["loss"]),
            metadata={k: meta.get(k) for k in ("local_steps", "local_epochs", "lr", "optimizer", "batch_size")},
        )
        return ClientFit(update)  # the client's private state stays on its node

    def close(self) -> None:
        """Nothing to stop: the SuperNodes belong to Flower."""


def _client_loop(build: Callable[[], FederatedLoop], key: str) -> FederatedLoop:
    """The loop this ClientApp process trains clients with: built once per federation ``key`` (``build`` itself may
    arrive as a new object with every message, when Flower sends a function of ``__main__`` by value)."""
    if key not in _CLIENT_LOOPS:
        loop = build()
        check_flower(loop)
        setup, client_setup = loop.setup_context(), loop.client_setup_context()
        for transform in loop.client_transforms:
            transform.setup(setup)
            transform.setup_clients(client_setup)
        _CLIENT_LOOPS[key] = loop
    return _CLIENT_LOOPS[key]


def _partition(context: Any, num_clients: int) -> int:
    """This node's client id: its ``node_config["partition-id"]`` (Flower's simulation sets it; a real SuperNode
    gets it from ``--node-config "partition-id=K"``)."""
    if "partition-id" not in context.node_config:
        raise ValueError('node_config has no partition-id; start the SuperNode with --node-config "partition-id=K".')
    client_id = int(context.node_config["partition-id"])
    if not 0 <= client_id < num_clients:
        raise ValueError(f"node_config partition-id={client_id} must be in [0, {num_clients}) for this federation.")
    return client_id


def client_query(build: Callable[[], FederatedLoop], key: str, message: Any, context: Any) -> Any:
    """ClientApp ``query``: which client this node is (its ``partition-id``)."""
    app = _flwr().app
    client_id = _partition(context, _client_loop(build, key).num_clients)
    return app.Message(app.RecordDict({"report": app.ConfigRecord({"client": client_id})}), reply_to=message)


def client_train(build: Callable[[], FederatedLoop], key: str, message: Any, context: Any) -> Any:
    """ClientApp ``train``: fit this node's client on what it received, encode the update, keep its own state."""
    app = _flwr().app
    loop = _client_loop(build, key)
    runner, client_id = loop.runner, _partition(context, loop.num_clients)
    config = message.content["config"]
    if int(config["client"]) != client_id:
        raise ValueError(f"message for client {config['client']} reached the node of client {client_id}.")
    received = message.content["arrays"].to_torch_state_dict()
    stored = context.state.config_records.get(_STATE_KEY)
    store = runner.store
    store.restore(ClientState.from_state_dict(_from_bytes(stored["state"])) if stored else ClientState(client_id))
    logged: dict[str, float] = {}
    try:
        round_ctx = RoundContext(loop.spec, int(config["round"]), received, logged.update)
        ctx = runner.context(round_ctx, client_id)
        fit = runner.fit(ctx, received)
        store.keep_fit(client_id, fit.private or {})
        update, refused = encode_update(fit.update, loop.client_transforms, ctx=ctx, max_norm=loop.max_update_norm)
        if refused is not None:
            raise RuntimeError(f"update not sent: {refused}")
        context.state[_STATE_KEY] = app.ConfigRecord({"state": _to_bytes(store[client_id].state_dict())})
    finally:
        store.forget(client_id)  # the process keeps no client's state between messages
    loss = update.loss if math.isfinite(update.loss) else float("nan")
    content = {
        "arrays": app.ArrayRecord(torch_state_dict={k: v.detach().cpu() for k, v in update.delta.items()}),
        "metrics": app.MetricRecord({"num-examples": update.num_samples, "loss": loss}),
        "logged": app.MetricRecord(logged),
        "metadata": app.ConfigRecord({k: v for k, v in update.metadata.items() if v is not None}),
        "report": app.ConfigRecord({"client": client_id, "round": update.round_idx}),
    }
    return app.Message(app.RecordDict(content), reply_to=message)


def discover_nodes(grid: Any, num_clients: int, *, timeout: float = 300.0) -> dict[int, int]:
    """Ask every SuperNode which client it is; waits up to ``timeout`` seconds for ``num_clients`` of them.

    Raises:
        RuntimeError: when fewer nodes connect or answer in time, or two nodes claim one client.
    """
    app = _flwr().app
    deadline = time.monotonic() + timeout
    while len(node_ids := list(grid.get_node_ids())) < num_clients:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(node_ids)} of {num_clients} Flower SuperNodes connected in {timeout} s.")
        time.sleep(1.0)
    queries = [app.Message(app.RecordDict(), dst_node_id=n, message_type=app.MessageType.QUERY) for n in node_ids]
    replies = list(grid.send_and_receive(queries, timeout=timeout))
    if len(replies) < len(queries):  # a ClientApp that builds its loop slower than the timeout (a loaded machine)
        raise RuntimeError(
            f"only {len(replies)} of {len(queries)} Flower SuperNodes answered in {timeout} s; "
            "raise FlowerFederation(node_timeout=...)."
        )
    nodes: dict[int, int] = {}
    for reply in replies:
        if reply.has_error():
            raise RuntimeError(f"SuperNode {reply.metadata.src_node_id} failed to say its client: {reply.error.reason}")
        client_id = int(reply.content["report"]["client"])
        if client_id in nodes:
            raise RuntimeError(f"two SuperNodes claim client {client_id} (node_config partition-id).")
        nodes[client_id] = reply.metadata.src_node_id
    missing = sorted(set(range(num_clients)) - set(nodes))
    if missing:
        raise RuntimeError(f"no Flower SuperNode holds clients {missing[:5]} (node_config partition-id).")
    return nodes


class FlowerFederation:
    """A federation built by ``build`` as a Flower ``ServerApp`` and ``ClientApp``.

    ``build`` must return a new :class:`~lightning_fl.federation.loop.FederatedLoop` each call, the same one on the
    server and on every client (model, data, defences, seed); on a real device it may load only that device's
    data, as long as the partition ids agree. It must be importable where the ClientApp runs (a module-level
    function), since Flower sends the ClientApp to its nodes.

    Example (``my_fl/apps.py``, run with ``flwr run`` or the deployment engine)::

        def build() -> FederatedLoop:
            dm = FederatedDataModule("digits", num_clients=10)
            return FederatedLoop(ImageClassifier(**dm.model_options), dm, defences=[KeyLocks()], num_rounds=5)

        federation = FlowerFederation(build)
        server_app, client_app = federation.server_app, federation.client_app

    Raises:
        ImportError: with the install line, when Flower is not installed.
    """

    def __init__(self, build: Callable[[], FederatedLoop], *, node_timeout: float = 300.0) -> None:
        self.flwr, self.build, self.node_timeout = _flwr(), build, node_timeout
        self.key = uuid.uuid4().hex  # names this federation's loop in each ClientApp process
        self.summary: dict[str, Any] | None = None
        self._loop: FederatedLoop | None = None

    @property
    def loop(self) -> FederatedLoop:
        """The server's loop (built on first use, checked by :func:`check_flower`)."""
        if self._loop is None:
            loop = self.build()
            check_flower(loop)
            self._loop = loop
        return self._loop

    @property
    def server_app(self) -> Any:
        """The ``flwr.serverapp.ServerApp`` that runs the loop; its summary lands in :attr:`summary`."""
        app = self.flwr.serverapp.ServerApp()

        @app.main()
        def main(grid: Any, context: Any) -> None:
            loop = self.loop
            nodes = discover_nodes(grid, loop.num_clients, timeout=self.node_timeout)
            self.summary = loop.fit(pool=FlowerPool(grid, nodes))

        return app

    @property
    def client_app(self) -> Any:
        """The ``flwr.clientapp.ClientApp`` that trains the node's client (sent to the nodes: holds ``build`` and
        :attr:`key` only)."""
        app, build, key = self.flwr.clientapp.ClientApp(), self.build, self.key

        @app.query()
        def query(message: Any, context: Any) -> Any:
            return client_query(build, key, message, context)

        @app.train()
        def train(message: Any, context: Any) -> Any:
            return client_train(build, key, message, context)

        return app

    def run_simulation(self, *, backend_config: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run the apps in Flower's simulation engine, one SuperNode per client; returns the loop's summary.

        Args:
            backend_config: Flower's backend configuration; by default one CPU per ClientApp actor.
        """
        config = backend_config or {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
        self.flwr.simulation.run_simulation(
            server_app=self.server_app,
            client_app=self.client_app,
            num_supernodes=self.loop.num_clients,
            backend_config=config,
        )
        if self.summary is None:
            raise RuntimeError("the Flower ServerApp ended without a summary; see Flower's log above.")
        return self.summary
