"""What each setting of :class:`~lightning_fl.federation.loop.FederatedLoop` means: the loop's docstring, which
``help(FederatedLoop)``, the API reference and ``lightning-fl fit --help`` (one line a ``--loop.*`` option) read.

It lives apart from ``loop.py`` so that the assembler reads as what it builds, and the thirty-odd settings' meaning
reads in one place.
"""

from __future__ import annotations

__all__ = ["FEDERATED_LOOP_DOC"]

FEDERATED_LOOP_DOC = """Run federated training where every client is an ordinary Lightning Trainer.

Args:
    model: the global model; any ``LightningModule`` (see :mod:`lightning_fl.federation.model_contract`);
        modules marked private (:mod:`lightning_fl.private`) stay on the clients.
    datamodule: the federated data.
    num_rounds: number of communication rounds T.
    clients_per_round: clients per round: an int K, or a fraction C in (0, 1] of the clients.
    local_epochs: local epochs E per client fit.
    local_steps: local optimiser steps per client fit instead of epochs (``None``: ``local_epochs``).
    defences: defence bundles; each adds its model layers (applied to ``model`` now), client callbacks,
        transforms, aggregator or selector to the stages below (see :class:`~lightning_fl.defences.Defence`).
    server_plugins: what a malicious server changes of the model it ships and of what it broadcasts, applied
        before the defences (see :class:`~lightning_fl.transforms.ServerPlugin`).
    selector: client selection strategy (uniform by default).
    aggregator: aggregation rule (sample-weighted FedAvg by default).
    client_transforms: client-side chain applied to each update before it is sent (clip, noise, encrypt).
    server_transforms: server-side chain applied to the aggregate delta (server noise, fine-tuning).
    broadcast_transforms: server-side chain applied to the global state sent to each client.
    callbacks: federated callbacks (attacks, budget, logging).
    client_callbacks: Lightning callbacks added to every client's Trainer.
    trainer: options for each client's ``lightning.Trainer`` (``accelerator``, ``devices``, ``strategy``,
        ``precision``, ...); logging, checkpointing and the per-client progress bar are off unless given.
    loggers: Lightning loggers stepped by round (a CSV logger is always added).
    wandb_project: log the run to this Weights & Biases project (``None``: no Weights & Biases).
    wandb_mode: the Weights & Biases mode with ``wandb_project``: ``offline`` (the default), ``online`` or
        ``disabled``.
    eval_every: evaluate every this many rounds (and always after the last); 0 disables.
    eval_on: ``global`` evaluates the global model; ``clients`` averages the accuracy of each trained
        client's own model (global public state + its private layers), as personalised defences need.
    eval_metric: the name the model logs in ``test_step`` (reported as ``test_accuracy``).
    train_loss_key: the name the model logs in ``training_step`` (reported as ``train_loss``).
    min_clients: a round fails with an error when fewer valid updates than this remain.
    max_update_norm_ratio: drop a plaintext update whose L2 norm (after the client transforms) exceeds this
        multiple of the round's median update norm; ``None`` disables (docs/architecture.md).
    max_update_norm: drop any update whose L2 norm exceeds this absolute bound (checked on the client, before
        encryption, for an encrypted update); ``None`` disables.
    output_dir: run directory for ``summary.json``, checkpoints, logs and attack images.
    checkpoint: write a checkpoint after every round (needed for ``resume``).
    seed: master seed; every random stream derives from it.
    progress_bar: show a rich progress bar over rounds.
    workers: train each round's clients in this many local worker processes (CPU), each reusing one model;
        the history equals ``workers=1`` for the same seed (:mod:`lightning_fl.federation.workers`).
    backend: where ``workers`` run: local ``processes``, or ``ray`` actors (needs the ``ray`` extra).
    vectorize: ``True`` trains each round's plain clients at once, parameters stacked
        (:mod:`lightning_fl.federation.vectorised_contract` says which models qualify); ``"auto"`` where the
        model qualifies and it pays; ``False`` one by one. Equal to the sequential history to float tolerance.

Raises:
    ValueError: on inconsistent settings (named in the message), before any training.
    TypeError: on a model that cannot be a client model (the message says what to add).
"""
"""The Google-style docstring of :class:`~lightning_fl.federation.loop.FederatedLoop` (its ``Args`` give each
setting)."""
