r"""Paillier encryption of model updates with fixed-point encoding and BatchCrypt-style packing.

The arithmetic layer of the secure aggregation of the thesis (Ren, "Gradient Leakage and Protection for
Federated Learning", Swansea 2023, Sec. 4.2.2): floats become integers, integers become Paillier plaintexts,
and the server adds ciphertexts and multiplies them by plaintext integer weights (Eq. 4.4)
:math:`\mathrm{Enc}(a)\,\mathrm{Enc}(b) = \mathrm{Enc}(a+b)`, :math:`\mathrm{Enc}(a)^k = \mathrm{Enc}(k a)`.
Paillier itself is the ``phe`` package (python-paillier, with gmpy2).

Encoding of one value :math:`x` (fixed point with ``precision_bits`` :math:`f` fractional bits, bound
:math:`B` = ``value_bound``):

.. math::
    q = \mathrm{round}(\mathrm{clip}(x, -B, B) \cdot 2^f) + o, \qquad o = \mathrm{round}(B \cdot 2^f),

so :math:`q \in [0, 2o]` is never negative. Packing puts ``slots`` such values side by side in one plaintext,
each in a slot of ``slot_bits`` bits: :math:`m = \sum_s q_s 2^{s \cdot \mathrm{slot\_bits}}`. A weighted sum
with integer weights :math:`w_i` gives slot contents :math:`\sum_i w_i q_{i,s} \le 2o \sum_i w_i`; the slot
has room for this as long as :math:`\sum_i w_i \le` ``max_weight_sum`` (the headroom bits), so no slot ever
carries into its neighbour. Decoding subtracts :math:`o \sum_i w_i` and divides by :math:`2^f` and by the
normaliser (the total weight for a weighted mean, the thesis' :math:`P` for FedBoosting).

Precision: each value is rounded to a multiple of :math:`2^{-f}` (error at most :math:`2^{-f-1}`, about
:math:`4.8 \times 10^{-7}` at the default :math:`f = 20`); a weighted mean of such values has the same bound;
values beyond :math:`\pm B` are clipped to it.

Deviation: the thesis scales by :math:`10^{32}` and pre-divides each update by the number of pieces :math:`P`
(:math:`g = \lfloor G \cdot 10^{32} / P \rfloor`). Its 1e32 scale is far beyond float64 precision and leaves
no room for packing; we use binary fixed point with a precision chosen so that the slots fit, and divide by
:math:`P` after decryption (the same value, without the floor's loss).

Inferred: BatchCrypt (Zhang et al., USENIX ATC 2020) packs signed quantised values with padding bits; we use
an offset (non-negative) encoding instead of two's complement, so decoding needs only the public total
weight and no sign handling.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     spec = PackingSpec(key_size=256, precision_bits=16, value_bound=1.0, max_weight_sum=4)
    ...     public_key, private_key = generate_keypair(spec=spec)
    >>> spec.slot_bits, spec.slots
    (20, 12)
    >>> a = encrypt_tensors({"w": torch.tensor([0.5, -0.25])}, public_key=public_key, spec=spec)
    >>> b = encrypt_tensors({"w": torch.tensor([-0.5, 0.75])}, public_key=public_key, spec=spec)
    >>> decrypt_tensors(weighted_sum([a, b], weights=[1, 3], normaliser=4), private_key=private_key)
    {'w': tensor([-0.2500,  0.5000])}
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from phe import paillier
from phe.paillier import EncryptedNumber, PaillierPrivateKey, PaillierPublicKey
from torch import Tensor

__all__ = [
    "EncryptedTensors",
    "PackingSpec",
    "decode_values",
    "decrypt_tensors",
    "encode_values",
    "encrypt_tensors",
    "generate_keypair",
    "private_key_from_state",
    "private_key_state",
    "weighted_sum",
]

SECURE_KEY_SIZE = 2048
SMALL_KEY_WARNING = (
    "PackingSpec(key_size={key_size}) is below {secure} bits and offers no real security; use it only in "
    "tests and quick experiments (the thesis' 128-bit keys are for reproduction only)."
)
_FLOAT64_MANTISSA_BITS = 53


@dataclass(frozen=True)
class PackingSpec:
    """Public layout of fixed-point values in Paillier plaintexts; shared by clients and server.

    Args:
        key_size: Paillier modulus size in bits (``n_length`` of ``phe``). 2048 by default; smaller keys are
            insecure and warn (the thesis used 128 bits).
        precision_bits: fractional bits :math:`f` of the fixed-point encoding; the step is :math:`2^{-f}`.
        value_bound: values are clipped to :math:`[-B, B]` before encoding; pick it above the largest update
            entry you expect (the encryption transform reports how many values were clipped).
        max_weight_sum: headroom: the largest sum of integer weights the server may apply in one combination
            (e.g. the thesis' :math:`P` plus the number of clients, or the total sample count for FedAvg).
        packing: pack as many values per plaintext as fit (BatchCrypt); ``False`` encrypts one value per
            ciphertext (the thesis and its reference code).

    Raises:
        ValueError: if a field is out of range, if ``precision_bits`` and ``value_bound`` ask for more than
            float64 resolves, or if one slot with its headroom does not fit into a plaintext of ``key_size``.
    """

    key_size: int = SECURE_KEY_SIZE
    precision_bits: int = 20
    value_bound: float = 4.0
    max_weight_sum: int = 2**16
    packing: bool = True

    def __post_init__(self) -> None:
        self._validate()
        if self.key_size < SECURE_KEY_SIZE:
            warnings.warn(SMALL_KEY_WARNING.format(key_size=self.key_size, secure=SECURE_KEY_SIZE), stacklevel=3)

    def _validate(self) -> None:
        if self.key_size < 128:
            raise ValueError(f"PackingSpec(key_size={self.key_size}) must be >= 128 bits (2048 for real use).")
        if self.precision_bits < 1:
            raise ValueError(f"PackingSpec(precision_bits={self.precision_bits}) must be >= 1.")
        if not (math.isfinite(self.value_bound) and self.value_bound > 0):
            raise ValueError(f"PackingSpec(value_bound={self.value_bound}) must be a finite number > 0.")
        if self.max_weight_sum < 1:
            raise ValueError(f"PackingSpec(max_weight_sum={self.max_weight_sum}) must be >= 1.")
        value_bits = (2 * self.offset).bit_length()
        if value_bits > _FLOAT64_MANTISSA_BITS:
            raise ValueError(
                f"PackingSpec(precision_bits={self.precision_bits}, value_bound={self.value_bound}) needs "
                f"{value_bits}-bit integers, more than the {_FLOAT64_MANTISSA_BITS}-bit float64 mantissa the "
                "updates come from resolves; lower precision_bits or value_bound."
            )
        if self.slot_bits > self.key_size - 1:
            raise ValueError(
                f"PackingSpec(key_size={self.key_size}, precision_bits={self.precision_bits}, "
                f"value_bound={self.value_bound}, max_weight_sum={self.max_weight_sum}) needs {self.slot_bits}-bit "
                f"slots ({value_bits} value bits + {self.slot_bits - value_bits} headroom bits), but a "
                f"{self.key_size}-bit key holds plaintexts of at most {self.key_size - 1} bits; lower "
                "precision_bits, value_bound or max_weight_sum, or raise key_size."
            )

    @property
    def offset(self) -> int:
        """The encoding offset :math:`o = \\mathrm{round}(B \\cdot 2^f)` that makes every slot non-negative."""
        return round(self.value_bound * 2**self.precision_bits)

    @property
    def slot_bits(self) -> int:
        """Bits per slot: room for :math:`2o \\cdot` ``max_weight_sum``, so weighted sums never overflow."""
        return (2 * self.offset * self.max_weight_sum).bit_length()

    @property
    def slots(self) -> int:
        """Values per plaintext (1 without packing)."""
        return (self.key_size - 1) // self.slot_bits if self.packing else 1

    @property
    def step(self) -> float:
        """Quantisation step :math:`2^{-f}`; the rounding error of one value is at most half of it."""
        return 2.0**-self.precision_bits


def generate_keypair(*, spec: PackingSpec) -> tuple[PaillierPublicKey, PaillierPrivateKey]:
    """A fresh Paillier key pair of ``spec.key_size`` bits (``phe.generate_paillier_keypair``).

    Call it on a client (the key holder of the thesis' Algorithm 3, line 2); only the public key may go to
    the server.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     public_key, _ = generate_keypair(spec=PackingSpec(key_size=256, max_weight_sum=1))
        >>> public_key.n.bit_length()
        256
    """
    return paillier.generate_paillier_keypair(n_length=spec.key_size)


def private_key_state(private_key: PaillierPrivateKey) -> dict[str, str]:
    """The private key as hexadecimal strings, for client storage that ``torch.load(weights_only=True)`` reads.

    Strings, not Python integers: PyTorch's safe unpickler rejects integers of 2040 bits or more (pickle's
    ``LONG4`` opcode), so a 2048-bit modulus stored as an ``int`` could never be restored on resume.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     _, key = generate_keypair(spec=PackingSpec(key_size=256, max_weight_sum=1))
        >>> state = private_key_state(key)
        >>> sorted(state), type(state["n"]).__name__
        (['n', 'p', 'q'], 'str')
        >>> private_key_from_state(state) == key
        True
    """
    return {"n": f"{private_key.public_key.n:x}", "p": f"{private_key.p:x}", "q": f"{private_key.q:x}"}


def private_key_from_state(state: Mapping[str, str | int]) -> PaillierPrivateKey:
    """Rebuild the private key that :func:`private_key_state` stored (hex strings; plain integers also accepted).

    Raises:
        ValueError: if ``state`` lacks ``n``, ``p`` or ``q``, holds a non-hexadecimal value, or ``p * q != n``.
    """
    missing = {"n", "p", "q"} - set(state)
    if missing:
        raise ValueError(f"stored Paillier key lacks {sorted(missing)}; the client checkpoint is incomplete.")
    n, p, q = (int(v, 16) if isinstance(v, str) else int(v) for v in (state["n"], state["p"], state["q"]))
    if p * q != n:
        raise ValueError("stored Paillier key is inconsistent (p * q != n); the client checkpoint is corrupt.")
    return PaillierPrivateKey(PaillierPublicKey(n), p, q)


def encode_values(values: Tensor, *, spec: PackingSpec) -> list[int]:
    """Quantise, clip, offset and pack a flat tensor into Paillier plaintexts (module docstring, encoding).

    Raises:
        ValueError: if a value is NaN or infinite (it has no fixed-point code; the update is broken).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     spec = PackingSpec(key_size=128, precision_bits=2, value_bound=1.0, max_weight_sum=1)
        >>> encode_values(torch.tensor([-1.0, 0.0, 0.5]), spec=spec)  # q = 0, 4, 6 in 4-bit slots
        [1600]
    """
    if not torch.isfinite(values).all():
        raise ValueError("cannot encode non-finite values (NaN or inf) for Paillier; the update is broken.")
    scaled = np.rint(
        np.clip(values.detach().double().cpu().numpy(), -spec.value_bound, spec.value_bound) * 2**spec.precision_bits
    )
    quantised = (scaled.astype(np.int64) + spec.offset).tolist()
    width, slots = spec.slot_bits, spec.slots
    plaintexts = []
    for start in range(0, len(quantised), slots):
        packed = 0
        for position, value in enumerate(quantised[start : start + slots]):
            packed |= value << (position * width)
        plaintexts.append(packed)
    return plaintexts


def decode_values(
    plaintexts: Sequence[int], *, spec: PackingSpec, count: int, weight_sum: int = 1, normaliser: int = 1
) -> Tensor:
    r"""Unpack plaintexts into ``count`` float64 values: :math:`(q - o \cdot W) / (2^f \cdot \mathrm{normaliser})`.

    Args:
        plaintexts: decrypted (possibly summed) plaintexts.
        spec: the layout they were encoded with.
        count: number of values encoded (the last plaintext may be partly empty).
        weight_sum: :math:`W`, the sum of the integer weights that produced the plaintexts (1 for a fresh one).
        normaliser: divide the sum by this (the total weight for a mean, :math:`P` in the thesis).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     spec = PackingSpec(key_size=128, precision_bits=2, value_bound=1.0, max_weight_sum=1)
        >>> decode_values([1600], spec=spec, count=3)
        tensor([-1.0000,  0.0000,  0.5000], dtype=torch.float64)
    """
    width, mask = spec.slot_bits, (1 << spec.slot_bits) - 1
    shift, scale = spec.offset * weight_sum, float(2**spec.precision_bits * normaliser)
    values = [
        ((plaintext >> (position * width)) & mask) - shift for plaintext in plaintexts for position in range(spec.slots)
    ]
    return torch.tensor([v / scale for v in values[:count]], dtype=torch.float64)


@dataclass(frozen=True)
class EncryptedTensors:
    """Paillier ciphertexts of a dict of tensors: what a client sends and what the server combines.

    Everything here is public: the public key, the packing layout, tensor names and shapes, and the integer
    weights already applied. Decrypting needs the private key, which only clients hold.

    Args:
        public_key: the Paillier public key the ciphertexts are under.
        spec: the packing layout.
        shapes: tensor name to shape, in encoding order.
        ciphertexts: one ``phe`` ``EncryptedNumber`` per plaintext.
        weight_sum: sum of the integer weights applied so far (1 for a fresh encryption).
        normaliser: what the decrypted sum is divided by (1 for a fresh encryption).
    """

    public_key: PaillierPublicKey
    spec: PackingSpec
    shapes: dict[str, tuple[int, ...]]
    ciphertexts: tuple[EncryptedNumber, ...]
    weight_sum: int = 1
    normaliser: int = 1

    @staticmethod
    def weighted_sum(items: Sequence[EncryptedTensors], *, weights: Sequence[int], normaliser: int) -> EncryptedTensors:
        """The homomorphic weighted sum of ``items`` (:func:`weighted_sum`): how the server combines payloads of
        this type (:class:`~lightning_fl.server.encrypted.LinearPayload`)."""
        return weighted_sum(items, weights=weights, normaliser=normaliser)

    @property
    def num_values(self) -> int:
        return sum(math.prod(shape) for shape in self.shapes.values())

    @property
    def nbytes(self) -> int:
        """Size on the wire: each ciphertext is an integer below :math:`n^2`."""
        return len(self.ciphertexts) * math.ceil(self.public_key.nsquare.bit_length() / 8)

    def structure_error(self, *, round_idx: int) -> str | None:
        """Server side, on arrival: why this is not a fresh encryption the server can combine, or ``None``.

        A client's upload must hold, under its own public key, one ciphertext per ``spec.slots`` values of the
        layers it declares (:func:`encrypt_tensors`), with no weight applied yet; a truncated or padded payload would
        otherwise surface as an ``IndexError`` inside the homomorphic sum. ``round_idx`` is unused: ciphertexts carry
        no round.

        Example:
            >>> import dataclasses
            >>> with warnings.catch_warnings():
            ...     warnings.simplefilter("ignore")
            ...     spec = PackingSpec(key_size=128, precision_bits=2, value_bound=1.0, max_weight_sum=1, packing=False)
            >>> public_key, _ = generate_keypair(spec=spec)
            >>> sent = encrypt_tensors({"w": torch.zeros(3)}, public_key=public_key, spec=spec)
            >>> sent.structure_error(round_idx=0) is None
            True
            >>> dataclasses.replace(sent, ciphertexts=sent.ciphertexts[:2]).structure_error(round_idx=0)
            'it holds 2 ciphertexts, but 3 values in slots of 1 need 3'
        """
        if not isinstance(self.public_key, PaillierPublicKey) or not isinstance(self.spec, PackingSpec):
            return "its public key or packing spec is not a Paillier key and PackingSpec"
        shapes = self.shapes if isinstance(self.shapes, dict) else {}
        if not shapes or not all(
            isinstance(s, tuple) and all(isinstance(d, int) and d >= 0 for d in s) for s in shapes.values()
        ):
            return f"its declared shapes {self.shapes!r} are not a mapping of layer names to shapes"
        ciphertexts = self.ciphertexts if isinstance(self.ciphertexts, tuple | list) else ()
        needed = math.ceil(self.num_values / self.spec.slots)
        if len(ciphertexts) != needed:
            return (
                f"it holds {len(ciphertexts)} ciphertexts, but {self.num_values} values in slots of "
                f"{self.spec.slots} need {needed}"
            )
        if not all(isinstance(c, EncryptedNumber) and c.public_key == self.public_key for c in ciphertexts):
            return "a ciphertext is not a Paillier EncryptedNumber under the payload's public key"
        if self.weight_sum != 1 or self.normaliser != 1:
            return f"it claims weights already applied (weight_sum={self.weight_sum!r}, normaliser={self.normaliser!r})"
        return None


def encrypt_tensors(
    tensors: dict[str, Tensor], *, public_key: PaillierPublicKey, spec: PackingSpec
) -> EncryptedTensors:
    """Encode and encrypt ``tensors`` (each ciphertext freshly obfuscated by ``raw_encrypt``).

    Raises:
        ValueError: if ``public_key`` is smaller than ``spec.key_size`` (the slots would not fit).
    """
    if public_key.n.bit_length() < spec.key_size:
        raise ValueError(
            f"the public key has {public_key.n.bit_length()} bits but the packing spec assumes "
            f"key_size={spec.key_size}; build both from the same PackingSpec."
        )
    flat = torch.cat([t.detach().reshape(-1) for t in tensors.values()]) if tensors else torch.zeros(0)
    ciphertexts = tuple(
        EncryptedNumber(public_key, public_key.raw_encrypt(m), 0) for m in encode_values(flat, spec=spec)
    )
    return EncryptedTensors(public_key, spec, {k: tuple(t.shape) for k, t in tensors.items()}, ciphertexts)


def weighted_sum(items: Sequence[EncryptedTensors], *, weights: Sequence[int], normaliser: int) -> EncryptedTensors:
    r"""Homomorphic :math:`\sum_i w_i \cdot \mathrm{Enc}(x_i) / \mathrm{normaliser}` (thesis Eq. 4.4 and 4.5).

    Only the public key is used: ciphertexts are multiplied by the plaintext integer weights and added.

    Args:
        items: encrypted tensors under one public key, with one layout and equal normalisers.
        weights: non-negative integer weights :math:`w_i`, not all zero.
        normaliser: integer the decrypted sum is divided by (the total weight for a weighted mean).

    Raises:
        ValueError: on mismatched keys, layouts or shapes, invalid weights, or when the weights exceed the
            headroom ``spec.max_weight_sum`` (the slots would overflow).
    """
    _check_combinable(items, weights, normaliser)
    first = items[0]
    weight_sum = sum(w * item.weight_sum for w, item in zip(weights, items, strict=True))
    if weight_sum > first.spec.max_weight_sum:
        raise ValueError(
            f"the integer weights {list(weights)} sum to {weight_sum}, beyond the packing headroom "
            f"max_weight_sum={first.spec.max_weight_sum}; the slots would overflow. Raise "
            "PaillierEncryption(max_weight_sum=...) or lower the aggregator's weights (pieces)."
        )
    terms = [(w, item) for w, item in zip(weights, items, strict=True) if w > 0]
    ciphertexts = []
    for index in range(len(first.ciphertexts)):
        total = None
        for w, item in terms:
            term = item.ciphertexts[index] if w == 1 else item.ciphertexts[index] * w
            total = term if total is None else total + term
        ciphertexts.append(total)
    return EncryptedTensors(
        first.public_key, first.spec, first.shapes, tuple(ciphertexts), weight_sum, normaliser * first.normaliser
    )


def _check_combinable(items: Sequence[EncryptedTensors], weights: Sequence[int], normaliser: int) -> None:
    if not items:
        raise ValueError("weighted_sum needs at least one EncryptedTensors.")
    if len(items) != len(weights):
        raise ValueError(f"got {len(items)} encrypted updates but {len(weights)} weights.")
    if any(not isinstance(w, int | np.integer) or w < 0 for w in weights) or sum(weights) == 0:
        raise ValueError(f"Paillier weights must be non-negative integers, not all zero; got {list(weights)}.")
    if not isinstance(normaliser, int | np.integer) or normaliser < 1:
        raise ValueError(f"normaliser={normaliser} must be a positive integer.")
    first = items[0]
    for item in items[1:]:
        if item.public_key != first.public_key:
            raise ValueError("encrypted updates are under different public keys; all clients must share one key.")
        if item.spec != first.spec or item.shapes != first.shapes or item.normaliser != first.normaliser:
            raise ValueError(
                "encrypted updates have different layouts (packing spec, tensor names/shapes or normaliser); "
                "all clients must encrypt the same layers with the same PackingSpec."
            )


def decrypt_tensors(encrypted: EncryptedTensors, *, private_key: PaillierPrivateKey) -> dict[str, Tensor]:
    """Decrypt and decode into float32 tensors of the original shapes (a client-side operation).

    Raises:
        ValueError: if ``private_key`` does not belong to the ciphertexts' public key.
    """
    if private_key.public_key != encrypted.public_key:
        raise ValueError("the private key does not match the public key of these ciphertexts.")
    plaintexts = [private_key.raw_decrypt(c.ciphertext(be_secure=False)) for c in encrypted.ciphertexts]
    flat = decode_values(
        plaintexts,
        spec=encrypted.spec,
        count=encrypted.num_values,
        weight_sum=encrypted.weight_sum,
        normaliser=encrypted.normaliser,
    ).float()
    out, start = {}, 0
    for name, shape in encrypted.shapes.items():
        size = math.prod(shape)
        out[name] = flat[start : start + size].reshape(shape)
        start += size
    return out
