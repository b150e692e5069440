"""Whether this process read torch's bytecode or compiled torch's sources, and what to do about the latter.

Python compiles a module's source to bytecode when it imports it and caches the bytecode (in `__pycache__`,
or under PYTHONPYCACHEPREFIX) for the next process. Where nothing wrote it at install time (pip does; uv
only with `--compile-bytecode`) and Python may not write it when importing (PYTHONDONTWRITEBYTECODE, common
in container images, or a read-only install), every command compiles torch's, accelerate's and dynamo's
sources again before it trains: a two-step CPU run took 6.8 s instead of 2.8 s, and on one H100 machine
compiling and reading sources were 7.2 s of an 11.4 s command (docs/measurements.md#launchbytecodepy).
`python -m compileall` writes the bytecode once, whatever PYTHONDONTWRITEBYTECODE says; Python reads it
from then on.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from types import ModuleType


def uncached_bytecode_note(module: ModuleType | None = None) -> str | None:
    """One line saying that `module` (default: torch) was compiled from its sources in this process, and how
    to cache its bytecode; None where its bytecode is cached (or the module has none: a built-in, a zip)."""
    if module is None:
        import torch

        module = torch
    spec = module.__spec__
    if spec is None or spec.origin is None or not spec.cached or Path(spec.cached).exists():
        return None
    # After the import a writable place would hold the bytecode already: it is missing because Python
    # may not write it here.
    why = "PYTHONDONTWRITEBYTECODE or -B is set" if sys.dont_write_bytecode else "its folder is read-only"
    folder = Path(spec.origin).parent.parent  # the folder that holds the package: site-packages
    prefix = "" if os.access(folder, os.W_OK) or sys.pycache_prefix else "PYTHONPYCACHEPREFIX=/a/writable/folder "
    return (
        f"{module.__name__}'s bytecode is not cached ({why}): every command compiles its sources again, seconds "
        f"of start-up; `{prefix}python -m compileall -q {shlex.quote(str(folder))}` writes it once"
        + (" (keep PYTHONPYCACHEPREFIX set after)" if prefix else "")
    )
