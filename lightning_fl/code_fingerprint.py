"""The fingerprint of the code a cached result was made by: lightning_fl's sources and the versions it runs on.

Two caches key on it. The CLI's schema cache (:mod:`lightning_fl.cli_schema`) answers ``--help`` and unknown keys
only while the parsers it was read from would be built the same. The bench (:mod:`lightning_fl.bench.runner`)
reuses a finished run only if the same code made it: its settings' fingerprint cannot see a changed attack schedule
or defence mechanism, nor a torch release that moves the numerics. It imports neither torch nor Lightning.
"""

from __future__ import annotations

import hashlib
import sys
from functools import cache
from importlib import metadata
from pathlib import Path

__all__ = ["LIBRARIES", "code_fingerprint"]

LIBRARIES = ("jsonargparse", "lightning", "opacus", "torch")
"""The libraries whose versions enter the fingerprint: the parsers are built from them, the results computed."""
_PACKAGE = Path(__file__).resolve().parent


@cache
def code_fingerprint() -> str:
    """A short digest of the package's Python sources and of the Python and :data:`LIBRARIES` versions.

    Example:
        >>> len(code_fingerprint()) == 16 and code_fingerprint() == code_fingerprint()
        True
    """
    digest = hashlib.sha256(f"{sys.version_info[:2]}".encode())
    for name in LIBRARIES:
        try:
            digest.update(f"{name}={metadata.version(name)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name}=none".encode())
    for path in sorted(_PACKAGE.rglob("*.py")):
        digest.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]
