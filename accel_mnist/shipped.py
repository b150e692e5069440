"""The accelerate configs and training recipes that ship with accel_mnist: `accel-mnist configs [NAME]`.

Each file exists once, in the repository's `accelerate_configs/` (and `recipes/`, where present).
A wheel carries them as the data packages `accel_mnist.accelerate_configs` and `accel_mnist.recipes`
(setup.py maps the folders there); run from a source checkout (an editable install, PYTHONPATH)
the checkout's own folders are read, so an edit there shows at once.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import textwrap
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, UsageError

if TYPE_CHECKING:
    from importlib.abc import Traversable

# folder -> what its files are for, as the listing says it.
FOLDERS = {
    "accelerate_configs": "accelerate configs: accelerate launch --config_file FILE -m accel_mnist train",
    "recipes": "training recipes: accel-mnist train --config NAME (or FILE)",
}
# folder -> what one of its files is called in a message.
FOLDER_NOUNS = {"accelerate_configs": "accelerate config", "recipes": "recipe"}
SUFFIXES = (".yaml", ".yml", ".json")
_CHECKOUT = Path(__file__).resolve().parent.parent


def _folder(name: str) -> Traversable | None:
    # A checkout first: setuptools' editable finder maps accel_mnist to the checkout but not the
    # folders setup.py maps into it, and a PYTHONPATH run has no package data at all.
    if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "accel_mnist").is_dir():
        folder: Traversable = _CHECKOUT / name
    else:
        try:
            folder = resources.files(f"{__package__}.{name}")
        except ModuleNotFoundError:  # a wheel built without that folder
            return None
    return folder if folder.is_dir() else None


def shipped() -> dict[str, Traversable]:
    """{"folder/file": file} for every config and recipe there is, in listing order."""
    out: dict[str, Traversable] = {}
    for name in FOLDERS:
        folder = _folder(name)
        if folder is not None:
            files = [f for f in folder.iterdir() if f.is_file() and f.name.endswith(SUFFIXES)]
            out.update((f"{name}/{f.name}", f) for f in sorted(files, key=lambda f: f.name))
    return out


def _short_names(keys: list[str]) -> dict[str, str]:
    # "zero2" for accelerate_configs/zero2.yaml; the folder stays in the name only where two
    # files share a stem.
    stems = [Path(k).stem for k in keys]
    return {k: s if stems.count(s) == 1 else str(Path(k).with_suffix("")) for k, s in zip(keys, stems, strict=True)}


def find(name: str, folder: str | None = None) -> Traversable:
    """The shipped file called `name`: its stem (`zero2`), file name (`zero2.yaml`) or folder/stem;
    with `folder` (`recipes`), among that folder's files only."""
    files = shipped()
    short = _short_names(list(files))  # the names the listing shows, whichever folder is searched
    if folder is not None:
        files = {k: f for k, f in files.items() if k.startswith(folder + "/")}
    matches = [k for k, f in files.items() if name in (k, short[k], f.name, str(Path(k).with_suffix("")))]
    what = "config" if folder is None else FOLDER_NOUNS[folder]
    if len(matches) > 1:
        raise UsageError(f"{what} name {name!r} is ambiguous: {', '.join(short[k] for k in matches)}")
    if not matches:
        known = ", ".join(short[k] for k in files) or "none are installed"
        raise UsageError(f"no {what} named {name!r} (known: {known})")
    return files[matches[0]]


def config_file(path: str | Path) -> Path | Traversable:
    """A training config `--config` names: the file `path`, else the shipped recipe of that name
    (`fast99`, as the listing shows it); neither: one line naming both."""
    file = Path(path)
    if file.is_file():
        return file
    if file.exists():
        raise ConfigError(f"config file {path} is not a file")
    try:
        return find(str(path), folder="recipes")
    except UsageError as e:  # the recipes there are, or the names it could not tell apart
        raise ConfigError(f"config file {path} does not exist, and {e}") from None


def _summary(file: Traversable) -> str:
    """What the file is: the first sentence of its YAML header comment (JSON has no comments)."""
    header = []
    for line in file.read_text(encoding="utf-8").splitlines():
        text = line.lstrip("#").strip()
        if not line.startswith("#") or not text:  # the header's first paragraph only
            break
        header.append(text)
    if not header:
        return f"({Path(file.name).suffix[1:].upper()})"
    # A sentence ends at a full stop before a space ("fast99.yaml" goes on), not after "e.g." or "i.e.".
    return re.split(r"(?<=\.)(?<!e\.g\.)(?<!i\.e\.)\s", " ".join(header), maxsplit=1)[0]


def _configs(args: argparse.Namespace) -> int:
    if args.name is not None:
        sys.stdout.write(find(args.name).read_text(encoding="utf-8"))
        return 0
    files = shipped()
    short = _short_names(list(files))
    width = max((len(s) for s in short.values()), default=0)
    # Whole sentences, wrapped under their column to the terminal's width (80 when not a terminal).
    columns = max(shutil.get_terminal_size().columns, width + 40)
    hang = " " * (width + 4)
    for folder, title in FOLDERS.items():
        keys = [k for k in files if k.startswith(folder + "/")]
        if keys:
            print(title)
            for key in keys:
                first = f"  {short[key]:<{width}}  "
                print(textwrap.fill(_summary(files[key]), columns, initial_indent=first, subsequent_indent=hang,
                                    break_long_words=False, break_on_hyphens=False))  # fmt: skip
    print("accel-mnist configs NAME prints one, e.g. accel-mnist configs zero2 > zero2.yaml")
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `configs [NAME]` to the CLI's subparsers (handler: args.handler)."""
    parser = subparsers.add_parser(
        "configs", help="list the shipped accelerate configs and recipes, or print one",
        description="Without NAME, list the accelerate configs and training recipes that come with "
        "accel_mnist; with NAME, print that file (accel-mnist configs zero2 > zero2.yaml).",
    )  # fmt: skip
    parser.add_argument("name", nargs="?", metavar="NAME", help="a name from the listing, e.g. zero2")
    parser.set_defaults(handler=_configs)
    return parser
