"""One attack on one batch, without federated rounds: what ``lightning-fl attack --config PATH`` runs.

:func:`client_view` plays an honest client on a private batch (one gradient, or a few real SGD steps) and returns
only what the server would receive; :func:`run_attack` attacks it, scores the result against the batch, and
writes ``summary.json`` (the same ``attacks`` entries as a federated run) and the labelled comparison grid of
:mod:`lightning_fl.attacks.report`.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset

from lightning_fl.attacks.base import GradientAttack
from lightning_fl.attacks.metrics import bootstrap_interval, image_successes
from lightning_fl.attacks.report import attack_report
from lightning_fl.datamodules.datasets import ImageTensorDataset
from lightning_fl.datamodules.federated import FederatedDataModule
from lightning_fl.messages import GroundTruth, ServerView
from lightning_fl.private import public_state

__all__ = [
    "AttackRun",
    "attack_totals",
    "check_attack_run",
    "client_view",
    "run_attack",
    "set_running_statistics",
    "view_on",
]


def client_view(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    *,
    num_classes: int,
    local_steps: int = 1,
    lr: float = 0.01,
    client_id: int = 0,
) -> ServerView:
    """What the server sees when a client trains ``model`` on ``(images, labels)``: public tensors and metadata.

    ``local_steps=1``: the client shares its mini-batch gradient (``kind="gradient"``, leak point
    ``local_gradient``, the DLG setting). ``local_steps=T > 1``: the client runs T plain SGD steps of
    ``len(images) // T`` images each with cross-entropy and shares the weight difference (``kind="update"``,
    leak point ``client_update``). Floating buffers (BatchNorm running statistics) are shared as their change, as a
    federated update shares them. The client's computation uses ordinary autograd on a copy of ``model``;
    private parameters never enter the view, and ``view.model`` is a fresh copy of the given (server) model.

    Raises:
        ValueError: when ``len(images)`` is not a multiple of ``local_steps``.

    Example:
        >>> from lightning_fl.models import LeNetDLG
        >>> view = client_view(LeNetDLG(1, 10, 16), torch.rand(1, 1, 16, 16), torch.tensor([3]), num_classes=10)
        >>> view.kind, view.metadata["batch_size"], sorted(view.tensors)[:2]
        ('gradient', 1, ['body.0.bias', 'body.0.weight'])
    """
    if len(images) % local_steps:
        raise ValueError(f"len(images)={len(images)} must be a multiple of local_steps={local_steps}.")
    public = set(public_state(model))
    client = copy.deepcopy(model).train()
    start = {n: p.detach().clone() for n, p in client.named_parameters()}
    buffers_before = {n: b.detach().clone() for n, b in client.named_buffers() if b.is_floating_point()}
    per_step = len(images) // local_steps
    for step in range(local_steps):
        chunk = slice(step * per_step, (step + 1) * per_step)
        loss = F.cross_entropy(client(images[chunk]), labels[chunk])
        grads = torch.autograd.grad(loss, [p for _, p in client.named_parameters()])
        if local_steps == 1:
            tensors = {n: g.detach() for (n, _), g in zip(client.named_parameters(), grads, strict=True)}
            break
        with torch.no_grad():
            for p, g in zip(client.parameters(), grads, strict=True):
                p.sub_(lr * g)
    else:
        tensors = {n: (p.detach() - start[n]) for n, p in client.named_parameters()}
    tensors |= {n: b.detach() - buffers_before[n] for n, b in client.named_buffers() if n in buffers_before}
    metadata = {
        "round_idx": 0,
        "client_id": client_id,
        "num_classes": num_classes,
        "input_shape": tuple(images.shape[1:]),
        "batch_size": per_step,
        "local_steps": local_steps,
        "num_samples": len(images),
        "lr": lr,
        "optimizer": "sgd",
    }
    return ServerView(
        leak_point="local_gradient" if local_steps == 1 else "client_update",
        model=copy.deepcopy(model).train(),
        tensors={n: t for n, t in tensors.items() if n in public},
        kind="gradient" if local_steps == 1 else "update",
        metadata=metadata,
    )


def view_on(view: ServerView, device: str | torch.device) -> ServerView:
    """``view`` with its model (in place: the view's model is the attacker's own copy) and intercepted tensors
    moved to ``device``; the metadata is unchanged.

    Example:
        >>> view = ServerView("local_gradient", nn.Linear(2, 1), {"bias": torch.ones(1)}, "gradient")
        >>> view_on(view, "cpu").tensors["bias"].device
        device(type='cpu')
    """
    tensors = {name: tensor.to(device) for name, tensor in view.tensors.items()}
    return ServerView(view.leak_point, view.model.to(device), tensors, view.kind, dict(view.metadata))


def _check_device(device: str) -> None:
    try:
        where = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"run.device={device!r} is not a device ({err}); use 'cpu', 'cuda' or 'cuda:1'.") from None
    if where.type == "cuda" and (where.index or 0) >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise ValueError(f"run.device={device!r} is not on this machine ({count} CUDA device(s)); use 'cpu'.")
    if where.type not in ("cpu", "cuda", "mps") or (where.type == "mps" and not torch.backends.mps.is_available()):
        raise ValueError(f"run.device={device!r} is not available here; use 'cpu' or 'cuda'.")


@dataclass(frozen=True)
class AttackRun:
    """How the client that :func:`run_attack` plays draws and trains its batch: the ``run:`` section of
    ``lightning-fl attack``.

    Args:
        client_id: whose data the batch is drawn from.
        batch_size: images per local step B.
        local_steps: 1 attacks a gradient; T > 1 attacks the update of T local SGD steps (B x T images).
        local_lr: the client's SGD step size for ``local_steps > 1`` (public metadata of the update).
        batches: how many disjoint batches of the client are attacked, one after another (each its own gradient or
            update); the summary then holds one entry per batch and their ``totals``.
        success_ssim: an image counts as recovered (``totals["share_recovered"]``) at this SSIM or above.
        bn_statistics_client: a client whose training images set the BatchNorm running statistics of the attacked
            model first (their cumulative average, as a model that trained on them holds): the broadcast model of
            See-Through-Gradients' threat model (Yin et al., CVPR 2021, Sec. 3.2), whose statistics come from other
            clients' data; ``None`` attacks the model as it is (at initialisation: mean 0, variance 1).
        device: where the attack runs, e.g. ``"cpu"``, ``"cuda"`` or ``"cuda:1"``: the server's copy of the model
            and the intercepted tensors are moved there (the client's computation stays on the CPU); scoring and
            the image grid use the CPU. Random starts are drawn on the CPU, so a seed gives the same start anywhere.

    Raises:
        ValueError: naming the ``run.*`` key: ``batch_size``, ``local_steps`` or ``batches`` below 1, ``local_lr``
            not a finite number > 0, a ``device`` that is malformed or absent (STYLE.md R3). What depends on the data
            and the model is checked by :func:`check_attack_run`.

    Example:
        >>> AttackRun(batch_size=0)
        Traceback (most recent call last):
        ...
        ValueError: run.batch_size=0 must be >= 1.
    """

    client_id: int = 0
    batch_size: int = 1
    local_steps: int = 1
    local_lr: float = 0.01
    batches: int = 1
    success_ssim: float = 0.5
    bn_statistics_client: int | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        for key in ("batch_size", "local_steps", "batches"):
            if getattr(self, key) < 1:
                raise ValueError(f"run.{key}={getattr(self, key)} must be >= 1.")
        if not (math.isfinite(self.local_lr) and self.local_lr > 0):
            raise ValueError(f"run.local_lr={self.local_lr} must be a finite number > 0 (the client's SGD step size).")
        _check_device(self.device)


def check_attack_run(
    attack: GradientAttack, *, data: FederatedDataModule, model: nn.Module, run: AttackRun = AttackRun()
) -> None:
    """Check that ``run`` and ``attack`` fit ``data`` and ``model`` without running or writing anything.

    Raises:
        ValueError: naming the ``run.*`` or ``attack.init_args.*`` key: ``client_id`` outside the clients,
            ``batch_size`` x ``local_steps`` x ``batches`` beyond the client's images, or ``layers`` patterns that
            match no parameter; or naming the layer of ``model`` the attack cannot handle (its ``check_model``).

    Example:
        >>> from lightning_fl.attacks import DLGAttack
        >>> from lightning_fl.models import LeNetDLG
        >>> dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16)
        >>> check_attack_run(DLGAttack(), data=dm, model=LeNetDLG(1, 10, 16), run=AttackRun(client_id=5))
        Traceback (most recent call last):
        ...
        ValueError: run.client_id=5 is not a client: data.num_clients=2 gives clients 0..1.
    """
    client_id = run.client_id
    if not 0 <= client_id < data.num_clients:
        raise ValueError(
            f"run.client_id={client_id} is not a client: data.num_clients={data.num_clients} gives clients "
            f"0..{data.num_clients - 1}."
        )
    statistics = run.bn_statistics_client
    if statistics is not None and not 0 <= statistics < data.num_clients:
        raise ValueError(
            f"run.bn_statistics_client={statistics} is not a client: data.num_clients={data.num_clients} gives "
            f"clients 0..{data.num_clients - 1}."
        )
    images = len(data.client_train_set(client_id))
    if run.batch_size * run.local_steps * run.batches > images:
        raise ValueError(
            f"run.batch_size x run.local_steps x run.batches = {run.batch_size * run.local_steps * run.batches} "
            f"exceeds the {images} images of client {client_id}; lower them or use data.num_clients: 1."
        )
    check_model = getattr(attack, "check_model", None)
    if check_model is not None:
        check_model(model, num_classes=data.num_classes)
    layers = getattr(attack, "layers", None)
    names = [name for name, _ in model.named_parameters()]
    unmatched = [p for p in layers or () if not any(fnmatch.fnmatch(name, p) for name in names)]
    if unmatched:
        raise ValueError(
            f"attack.init_args.layers has {unmatched}, which match no parameter of {type(model).__name__}; use "
            f"fnmatch patterns of its parameter names, e.g. {names[:2]}."
        )


def _batch(client_set: Dataset, chosen: Tensor) -> tuple[Tensor, Tensor, tuple[str, ...] | None]:
    """Images, labels and (when known) sources of the ``chosen`` samples of any ``(x, y)`` dataset."""
    if isinstance(client_set, ImageTensorDataset):
        batch = client_set.subset(chosen)
        return *batch.tensors(), batch.sources
    samples = [client_set[int(i)] for i in chosen]
    images = torch.stack([torch.as_tensor(x, dtype=torch.float32) for x, _ in samples])
    return images, torch.as_tensor([int(y) for _, y in samples], dtype=torch.long), None


def set_running_statistics(model: nn.Module, images: Dataset, *, batch_size: int = 64) -> None:
    """Set every BatchNorm layer's running mean and variance of ``model`` to the cumulative average over the images
    of ``images`` (an ``(x, y)`` dataset), leaving the parameters and the module's mode as they were.

    Example:
        >>> net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
        >>> set_running_statistics(net, [(torch.ones(1, 4, 4), 0)])
        >>> net[1].num_batches_tracked.item(), net.training
        (1, True)
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in norms]
    training = model.training
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # cumulative average
    loader = torch.utils.data.DataLoader(images, batch_size=batch_size)
    with torch.no_grad():
        model.train()
        for x, _ in loader:
            model(x)
    for norm, momentum in zip(norms, momenta, strict=True):
        norm.momentum = momentum
    model.train(training)


def run_attack(
    attack: GradientAttack,
    *,
    data: FederatedDataModule,
    model: L.LightningModule,
    run: AttackRun = AttackRun(),
    output_dir: str | Path = "runs/attack",
    seed: int = 0,
) -> dict[str, object]:
    """Attack one batch of one client's data against ``model`` and write ``summary.json`` and the image grid.

    Args:
        attack: the attack to run.
        data: the dataset (any the foundation supports); the batch comes from client ``run.client_id``'s share.
        model: the attacked model, as the server holds it (its current weights are the attacked state).
        run: the attacked client, its batch and local steps, and the attack's device (:class:`AttackRun`).
        output_dir: where ``summary.json`` and ``attacks/*.png`` go.
        seed: seed of the batch choice.

    Returns:
        the ``summary.json["attacks"]`` entry: ``attack``, ``round``, ``client``, ``leak_point``, ``mse``,
        ``psnr``, ``ssim``, ``lpips``, ``label_accuracy``, ``psnr_ref_rmse``, ``num_images``, ``reconstructed``,
        ``recovered``, ``psnr_capped`` (:func:`~lightning_fl.attacks.metrics.score_reconstruction`), ``image``,
        ``matched_sources``, ``attacked`` (where each attacked image came from: its file for an ImageFolder),
        ``seconds``; with ``run.batches > 1``, ``summary.json["totals"]`` instead (see
        :func:`attack_totals`; the summary holds them whenever more than one image was attacked).

    Raises:
        ValueError: see :func:`check_attack_run`.
    """
    check_attack_run(attack, data=data, model=model, run=run)
    if run.bn_statistics_client is not None:
        set_running_statistics(model, data.client_train_set(run.bn_statistics_client))
    client_set = data.client_train_set(run.client_id)
    drawn = torch.randperm(len(client_set), generator=torch.Generator().manual_seed(seed))
    per_batch = run.batch_size * run.local_steps
    output_dir = Path(output_dir)
    name = getattr(attack, "name", type(attack).__name__)
    entries, ssims, psnrs, colours = [], [], [], []
    for batch in range(run.batches):
        chosen = drawn[batch * per_batch : (batch + 1) * per_batch]
        images, labels, sources = _batch(client_set, chosen)
        names = list(sources) if sources is not None else [f"client {run.client_id} image {int(i)}" for i in chosen]
        view = client_view(
            model,
            images,
            labels,
            num_classes=data.num_classes,
            local_steps=run.local_steps,
            lr=run.local_lr,
            client_id=run.client_id,
        )
        reconstruction = attack.reconstruct(view_on(view, torch.device(run.device)))
        suffix = "" if batch == 0 else f"_{batch}"
        report = attack_report(
            reconstruction,
            GroundTruth(images, labels),
            num_classes=data.num_classes,
            path=output_dir / "attacks" / f"{name}_standalone{suffix}.png",
            names=names,
            title=f"{name} on {view.leak_point}, client {run.client_id}",
        )
        psnrs += report["per_image"]["psnr"]
        ssims += report["per_image"]["ssim"]
        colours += report["per_image"]["own_colour_ssim"]
        entries.append(
            {
                "attack": name,
                "round": None,
                "client": run.client_id,
                "leak_point": view.leak_point,
                **report,
                "attacked": names,
                "seconds": reconstruction.info.get("seconds"),
            }
        )
    summary: dict[str, object] = {"attacks": entries}
    entry = entries[0]
    if len(ssims) > 1:  # one batch of several images has its interval too; the call returns them for several batches
        summary["totals"] = attack_totals(
            entries, psnrs=psnrs, ssims=ssims, own_colour=colours, success_ssim=run.success_ssim
        )
        entry = summary["totals"] if run.batches > 1 else entry
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return entry


def attack_totals(
    entries: list[dict[str, object]],
    *,
    psnrs: list[float],
    ssims: list[float],
    own_colour: list[float],
    success_ssim: float,
) -> dict[str, object]:
    """The scores of several attacked batches together: means over images with a 95 % bootstrap interval, the
    share of images recovered at ``success_ssim`` (the bar of Huang et al., 2021, who report SSIM per image), the
    share that also beats the SSIM of its own mean colour (``own_colour``, per image: a flat image of the right
    colour reaches 0.5 on smooth photos; :func:`~lightning_fl.attacks.metrics.own_colour_ssim`), and the sums of the
    entries' counts: ``reconstructed``, ``recovered`` (PSNR >= 30 dB) and ``psnr_capped`` (see
    :func:`~lightning_fl.attacks.metrics.score_reconstruction`; ``psnrs`` and ``ssims`` hold every attacked image,
    a miss scored as one).

    Example:
        >>> entry = {"attack": "ig", "leak_point": "local_gradient", "seconds": 2.0, "label_accuracy": 1.0,
        ...          "reconstructed": 1, "recovered": 0, "psnr_capped": 0}
        >>> totals = attack_totals(
        ...     [entry, entry], psnrs=[20.0, 30.0], ssims=[0.4, 0.8], own_colour=[0.2, 0.9], success_ssim=0.5
        ... )
        >>> totals["num_images"], totals["share_recovered"], totals["share_beyond_colour"], round(totals["ssim"], 3)
        (2, 0.5, 0.0, 0.6)
    """
    labels = [e["label_accuracy"] for e in entries if e.get("label_accuracy") is not None]
    psnr_mean, *psnr_interval = bootstrap_interval(psnrs)
    ssim_mean, *ssim_interval = bootstrap_interval(ssims)
    return {
        "attack": entries[0]["attack"],
        "leak_point": entries[0]["leak_point"],
        "batches": len(entries),
        "num_images": len(ssims),
        "psnr": psnr_mean,
        "psnr_interval": psnr_interval,
        "ssim": ssim_mean,
        "ssim_interval": ssim_interval,
        "success_ssim": success_ssim,
        "share_recovered": sum(v >= success_ssim for v in ssims) / len(ssims),
        "own_colour_ssim": sum(own_colour) / len(own_colour),
        "share_beyond_colour": statistics.fmean(
            image_successes({"ssim": ssims, "own_colour_ssim": own_colour}, success_ssim)
        ),
        **{key: sum(int(e[key]) for e in entries) for key in ("reconstructed", "recovered", "psnr_capped")},
        "label_accuracy": sum(labels) / len(labels) if labels else None,
        "seconds": sum(float(e["seconds"] or 0.0) for e in entries),
        "per_image_ssim": ssims,
        "per_image_psnr": psnrs,
        "per_image_own_colour_ssim": own_colour,
    }
