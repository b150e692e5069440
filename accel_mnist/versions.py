"""Library versions, recorded with every result so that numbers can be compared later."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version


def versions() -> dict[str, str]:
    """Installed versions of Python and the libraries a result depends on."""
    out = {"python": platform.python_version()}
    for name in ("torch", "accelerate", "deepspeed", "torchvision", "accel-mnist"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out
