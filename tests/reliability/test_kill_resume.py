"""A run killed at any checkpoint write resumes to exactly the weights, client secrets and history of a run that
was never interrupted: plain FedAvg, key-lock (private client keys) and Paillier (a client-side secret key).

The kill is injected into :func:`lightning_fl.federation.checkpoint.atomic_write` (it leaves half a temporary file
and raises), at every write of every round: before, between and after the server file, the client files and the
manifest; after the manifest, before the stale files are cleaned up; and after a commit, before the CSV row and
the summary.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_fl import FederatedLoop
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import KeyLocks, PaillierEncryption, SecureFedAvg
from lightning_fl.federation import checkpoint as checkpoint_module
from lightning_fl.federation.checkpoint import Checkpoint
from lightning_fl.federation.recording import RunRecorder
from tests.conftest import make_classifier


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs, no ``except Exception`` catches it."""


def _data() -> FederatedDataModule:
    return FederatedDataModule("digits", num_clients=3, partition="iid", image_size=8, batch_size=16, seed=0)


CONFIGS = {
    "plain": dict,
    "keylock": lambda: {"defences": [KeyLocks(key_length=16)]},
    "paillier": lambda: {
        "aggregator": SecureFedAvg(),
        "client_transforms": [PaillierEncryption(key_size=256, layers=["backbone.fc.bias"], packing=False)],
    },
}


def _loop(name: str, output_dir, *, seed: int = 0) -> FederatedLoop:
    torch.manual_seed(seed)  # the resumed run starts from another process state: all must come from disk
    dm = _data()
    return FederatedLoop(
        make_classifier(dm),
        dm,
        num_rounds=2,
        clients_per_round=2,
        local_steps=2,
        eval_every=2,
        output_dir=output_dir,
        progress_bar=False,
        **CONFIGS[name](),
    )


def _fit(loop: FederatedLoop, *, resume: bool = False) -> FederatedLoop:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the small test key
        loop.fit(resume=resume)
    return loop


def _outcome(loop: FederatedLoop) -> tuple:
    history = [{k: v for k, v in h.items() if not k.endswith("_s")} for h in loop.history]  # no timings
    clients = [{k: v.clone() for k, v in c.private.items()} for c in loop.clients]
    return {k: v.clone() for k, v in loop.global_model.state_dict().items()}, clients, history


def _assert_same(expected: tuple, loop: FederatedLoop) -> None:
    weights, clients, history = _outcome(loop)
    for key, value in expected[0].items():
        if not key.startswith("backbone.body.1.lock"):  # private: compared per client
            assert torch.equal(value, weights[key]), key
    for a, b in zip(expected[1], clients, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert history == expected[2]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """Per config: the outcome of the uninterrupted run and how many checkpoint writes it made."""
    out, real, writes = {}, checkpoint_module.atomic_write, []

    def counted(path, data: bytes) -> None:
        writes.append(path)
        real(path, data)

    for name in CONFIGS:
        writes.clear()
        checkpoint_module.atomic_write = counted
        try:
            loop = _fit(_loop(name, tmp_path_factory.mktemp(name)))
        finally:
            checkpoint_module.atomic_write = real
        out[name] = (_outcome(loop), len(writes))
    return out


def _kill_at(monkeypatch, n: int) -> None:
    calls = iter(range(10**6))
    real = checkpoint_module.atomic_write

    def write(path, data: bytes) -> None:
        if next(calls) == n:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.with_name(f".{path.name}.tmp").write_bytes(data[: len(data) // 2])
            raise Killed
        real(path, data)

    monkeypatch.setattr(checkpoint_module, "atomic_write", write)


def _kill_after_manifest(monkeypatch, n: int) -> None:
    calls = iter(range(10**6))
    real = Checkpoint.remove_uncommitted

    def remove(self, manifest=None):
        if manifest is not None and next(calls) == n:
            raise Killed
        return real(self, manifest)

    monkeypatch.setattr(Checkpoint, "remove_uncommitted", remove)


def _kill_before_the_csv(monkeypatch, n: int) -> None:
    calls = iter(range(10**6))
    real = RunRecorder.write

    def write(self, **kwargs):
        if next(calls) == n:
            raise Killed
        return real(self, **kwargs)

    monkeypatch.setattr(RunRecorder, "write", write)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_kill_at_any_checkpoint_write_resumes_bit_identically(name, uninterrupted, tmp_path, monkeypatch) -> None:
    expected, writes = uninterrupted[name]
    kills = [(_kill_at, n) for n in range(writes)] + [(_kill_after_manifest, n) for n in range(3)]
    kills += [(_kill_before_the_csv, n) for n in (1, 2)]  # write() 0 is the start; 1, 2 follow rounds 0, 1
    for i, (kill, n) in enumerate(kills):
        run = tmp_path / f"kill{i}"
        with monkeypatch.context() as patch:
            kill(patch, n)
            with pytest.raises(Killed):
                _fit(_loop(name, run))
        committed = (run / "manifest.json").exists()  # else the kill came before the first commit: a plain rerun
        assert committed or (kill is _kill_at and n < 6), f"kill {kill.__name__}({n}) left no committed round"
        resumed = _fit(_loop(name, run, seed=123 if committed else 0), resume=True)
        _assert_same(expected, resumed)
        rows = (run / "logs" / "metrics.csv").read_text().splitlines()[1:]
        assert [int(r.split(",")[0]) for r in rows] == [0, 1]
        leftovers = [p.name for p in run.rglob("*") if p.name.endswith(".tmp")]
        assert not leftovers, leftovers
        committed = set(resumed.checkpoint.committed_files())
        stale = [p for d in ("checkpoints", "clients") for p in (run / d).glob("*.pt") if p not in committed]
        assert not stale, f"kill {kill.__name__}({n}): files of no committed round remain: {stale}"
