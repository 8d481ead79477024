r"""The cryptographic core of secure aggregation by pairwise masking (Bonawitz et al., CCS 2017).

Pure functions on integers and tensors, no loop import:

* **Key agreement** (Sec. 3, "Key Agreement"): Diffie-Hellman over the 2048-bit MODP group 14 of RFC 3526
  (generator 2); a private key is a 256-bit exponent. :func:`agree` hashes the shared group element with SHA-256.
* **Pseudorandom generator** (Sec. 3, "Pseudorandom Generator"): :func:`prg_mask` expands a 32-byte seed with
  SHAKE-256 into uniform integers modulo :math:`2^k`.
* **Shamir's t-out-of-n secret sharing** (Sec. 3, "Secret Sharing") over the prime field of :math:`2^{521}-1`:
  :func:`shamir_share`, :func:`shamir_reconstruct`.
* **Fixed-point encoding** modulo :math:`R = 2^k` (Sec. 4, inputs in :math:`\mathbb Z_R`): :func:`encode`,
  :func:`decode`.

All of it is the Python standard library (``hashlib``, ``secrets``) and torch; no extra dependency.

References:
    Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017,
    doi:10.1145/3133956.3133982. RFC 3526 (MODP groups). Shamir, "How to Share a Secret", CACM 1979.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "DH_GENERATOR",
    "DH_PRIME",
    "SHAMIR_PRIME",
    "agree",
    "decode",
    "encode",
    "generate_private_key",
    "prg_mask",
    "public_key",
    "shamir_reconstruct",
    "shamir_share",
]

#: RFC 3526, Sec. 3: the 2048-bit MODP group (group 14), a safe prime with generator 2.
DH_PRIME = int(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DD"
    "EF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED"
    "EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA48361C55D39A69163FA8FD24CF5F"
    "83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804F1746C08CA18217C32905E462E36CE3B"
    "E39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF6955817183995497CEA956AE515D2261898FA0510"
    "15728E5A8AACAA68FFFFFFFFFFFFFFFF",
    16,
)
DH_GENERATOR = 2
#: The Mersenne prime :math:`2^{521}-1`: Shamir shares of 256-bit secrets live in its field.
SHAMIR_PRIME = 2**521 - 1


def generate_private_key() -> int:
    """A fresh 256-bit Diffie-Hellman exponent from the operating system's CSPRNG."""
    return secrets.randbits(256) | 1 << 255


def public_key(private_key: int) -> int:
    r""":math:`g^{a} \bmod p` in RFC 3526 group 14.

    Example:
        >>> public_key(1) == DH_GENERATOR
        True
    """
    return pow(DH_GENERATOR, private_key, DH_PRIME)


def agree(private_key: int, other_public_key: int, *context: object) -> bytes:
    r"""The 32-byte shared secret :math:`\mathrm{SHA256}(g^{ab} \bmod p \,\|\, \mathrm{context})`.

    Both ends derive the same value: ``agree(a, public_key(b)) == agree(b, public_key(a))``.

    Raises:
        ValueError: on a public key outside :math:`(1, p-1)` (a degenerate or malicious key).

    Example:
        >>> agree(3, public_key(5), "round", 0) == agree(5, public_key(3), "round", 0)
        True
    """
    if not 1 < other_public_key < DH_PRIME - 1:
        raise ValueError("a Diffie-Hellman public key must lie in (1, p - 1); this one is degenerate.")
    shared = pow(other_public_key, private_key, DH_PRIME)
    digest = hashlib.sha256(shared.to_bytes(256, "big"))
    digest.update("/".join(map(str, context)).encode())
    return digest.digest()


def prg_mask(seed: bytes, numel: int, *, bits: int) -> Tensor:
    r"""``numel`` pseudorandom integers uniform in :math:`[0, 2^{bits})` from ``seed`` (SHAKE-256), as int64.

    Example:
        >>> a = prg_mask(b"seed", 4, bits=32)
        >>> torch.equal(a, prg_mask(b"seed", 4, bits=32)), bool(((0 <= a) & (a < 2**32)).all())
        (True, True)
    """
    if not 1 <= bits <= 62:
        raise ValueError(f"prg_mask(bits={bits}) must be in [1, 62] so that sums stay in int64.")
    raw = np.frombuffer(hashlib.shake_256(seed).digest(8 * numel), dtype="<u8")
    return torch.from_numpy((raw >> np.uint64(64 - bits)).astype(np.int64))


def _polynomial(coefficients: Sequence[int], x: int) -> int:
    value = 0
    for c in reversed(coefficients):
        value = (value * x + c) % SHAMIR_PRIME
    return value


def shamir_share(secret: int, *, holders: Sequence[int], threshold: int) -> dict[int, int]:
    r"""Split ``secret`` into one share per holder so that any ``threshold`` of them rebuild it (Shamir, 1979).

    The shares are :math:`f(x_h)` of a random polynomial of degree ``threshold - 1`` with :math:`f(0)` = secret,
    evaluated at :math:`x_h = h + 1` for holder id ``h``.

    Raises:
        ValueError: on a threshold outside [1, len(holders)] or a secret outside the field.

    Example:
        >>> shares = shamir_share(42, holders=[0, 1, 2, 3], threshold=3)
        >>> shamir_reconstruct({h: shares[h] for h in (0, 2, 3)})
        42
    """
    if not 1 <= threshold <= len(holders):
        raise ValueError(f"shamir_share(threshold={threshold}) must be in [1, {len(holders)}] (the holders).")
    if not 0 <= secret < SHAMIR_PRIME:
        raise ValueError("a Shamir secret must lie in the field [0, 2^521 - 1).")
    coefficients = [secret] + [secrets.randbelow(SHAMIR_PRIME) for _ in range(threshold - 1)]
    return {h: _polynomial(coefficients, h + 1) for h in holders}


def shamir_reconstruct(shares: Mapping[int, int]) -> int:
    r"""The secret :math:`f(0)` from shares ``{holder: f(holder + 1)}`` by Lagrange interpolation.

    With fewer shares than the threshold the result is a uniformly random field element, not the secret.
    """
    xs = {h: h + 1 for h in shares}
    secret = 0
    for h, y in shares.items():
        numerator, denominator = 1, 1
        for other, x in xs.items():
            if other != h:
                numerator = numerator * -x % SHAMIR_PRIME
                denominator = denominator * (xs[h] - x) % SHAMIR_PRIME
        secret = (secret + y * numerator * pow(denominator, -1, SHAMIR_PRIME)) % SHAMIR_PRIME
    return secret


def encode(values: Tensor, *, precision_bits: int, bits: int) -> Tensor:
    r"""Fixed point in :math:`\mathbb Z_{2^{bits}}`: :math:`\lfloor v\,2^{f} \rceil \bmod 2^{bits}`, as int64.

    Example:
        >>> decode(encode(torch.tensor([-1.5, 0.25]), precision_bits=8, bits=32), precision_bits=8, bits=32)
        tensor([-1.5000,  0.2500], dtype=torch.float64)
    """
    scaled = torch.round(values.double() * 2.0**precision_bits).to(torch.int64)
    return torch.remainder(scaled, 2**bits)


def decode(encoded: Tensor, *, precision_bits: int, bits: int) -> Tensor:
    """The signed values of :func:`encode` (the upper half of the ring holds the negatives), as float64."""
    signed = torch.where(encoded >= 2 ** (bits - 1), encoded - 2**bits, encoded)
    return signed.double() / 2.0**precision_bits
