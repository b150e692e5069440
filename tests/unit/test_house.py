"""The package's layout, read from its code: what a strategy does is known in its own rooms only,
no module imports another that imports it back, no function is longer than the house's limit and
no two modules share a name.

Outside distributed/ (the strategy's room), launch/ and memory/, code asks the `Strategy` value
(distributed/strategy.py) instead of looking at Accelerate's distributed type or plugins: a second
place that imitates what a strategy does goes wrong (a prewarm copy prepared otherwise than the
strategy prepares the model crashed under FSDP2 at 16 bits).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.helpers import REPO

PACKAGE = REPO / "accel_mnist"
STRATEGY_ROOMS = ("distributed", "launch", "memory")
# The two modules outside them that name one, each by DeepSpeed's own functions for the files a ZeRO
# checkpoint holds (they read a layout found on disk and branch on no distributed type):
# consolidating its shards into weights for `export`, and converting them to DeepSpeed's
# universal format for a resume on another number of processes.
READ_DEEPSPEED_FILES = {"accel_mnist.run.checkpoint_weights": ["deepspeed.utils.zero_to_fp32"],
                        "accel_mnist.run.universal": ["deepspeed.checkpoint"]}  # fmt: skip
# What naming a strategy looks like in code: Accelerate's attributes and enum, the plugins, and
# the distributed type's names compared as strings; DeepSpeed's and FSDP's own modules.
ATTRIBUTES = {"distributed_type", "deepspeed_plugin", "fsdp_plugin", "is_fsdp2", "zero_stage", "fsdp_version"}
NAMES = {"DistributedType"}
KINDS = {"DEEPSPEED", "FSDP", "MULTI_GPU", "MULTI_CPU", "distributed_type"}
MODULES = ("deepspeed", "torch.distributed.fsdp")


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(REPO).with_suffix("").parts): p for p in sorted(PACKAGE.rglob("*.py"))}


def strategy_names(source: str) -> list[str]:
    """Each place in `source` that names a strategy, as 'line: what'."""
    found = []
    for node in sorted(
        ast.walk(ast.parse(source)), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0))
    ):
        what = None
        if isinstance(node, ast.Attribute) and node.attr in ATTRIBUTES:
            what = f".{node.attr}"
        elif isinstance(node, ast.Name) and node.id in NAMES:
            what = node.id
        elif isinstance(node, ast.Constant) and node.value in KINDS and not isinstance(node.value, bool):
            what = repr(node.value)
        elif isinstance(node, ast.Import):
            what = next((a.name for a in node.names if a.name.startswith(MODULES)), None)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(MODULES):
            what = node.module
        if what:
            found.append(f"{node.lineno}: {what}")
    return found


def test_the_probe_sees_what_it_looks_for():
    sample = (
        "import deepspeed\nif accelerator.distributed_type == DistributedType.FSDP: pass\n"
        "x = results['distributed_type']\nplugin = accelerator.state.deepspeed_plugin\n"
    )
    assert [s.split(": ")[1] for s in strategy_names(sample)] == [
        "deepspeed", ".distributed_type", "DistributedType", "'distributed_type'", ".deepspeed_plugin",
    ]  # fmt: skip
    assert strategy_names("strategy.runs_engine\nStrategy.of(accelerator).line\n") == []


def test_no_module_outside_the_strategy_rooms_names_a_strategy():
    outside = {
        name: found
        for name, path in _modules().items()
        if name.split(".")[1] not in STRATEGY_ROOMS and (found := strategy_names(path.read_text()))
    }
    named = {name: [where.split(": ")[1] for where in found] for name, found in outside.items()}
    assert named == READ_DEEPSPEED_FILES, "ask the Strategy value (distributed/strategy.py) instead"


def _imports(name: str, path: Path) -> set[str]:
    """The package modules `name` imports, at module level or inside functions."""
    package = name.rsplit(".", 1)[0] if path.name != "__init__.py" else name
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            out |= {base, *(f"{base}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_no_module_imports_one_that_imports_it_back():
    modules = _modules()
    graph = {name: {m for m in _imports(name, path) if m in modules and m != name} for name, path in modules.items()}
    # A package's __init__ is imported with each of its modules; only its own imports count as edges.
    circles = []

    def visit(node: str, trail: list[str]) -> None:
        for nxt in graph[node]:
            if nxt in trail:
                circles.append(" -> ".join([*trail[trail.index(nxt) :], nxt]))
            elif nxt not in done:
                visit(nxt, [*trail, nxt])
        done.add(node)

    done: set[str] = set()
    for name in graph:
        if name not in done:
            visit(name, [name])
    assert circles == []


# The house's limit on a function or method, counted as `function_lengths` says.
MAX_FUNCTION_LINES = 60
# Names Python gives a module's job itself: a package's (`__init__.py`) and `python -m`'s (`__main__.py`).
SHARED_BY_RULE = ("__init__.py", "__main__.py")


def function_lengths(source: str) -> dict[str, int]:
    """Each function's and method's length in `source`, by its qualified name: its lines from the `def`
    to the last line of its body, docstring, comments and blank lines inside included (the function
    as a reader reads it), its decorators not. A nested function counts in its own right and inside
    the one around it."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                lengths[f"{name}:{child.lineno}"] = (child.end_lineno or child.lineno) - child.lineno + 1
            elif isinstance(child, ast.ClassDef):
                name = f"{prefix}{child.name}"
            visit(child, f"{name}." if name != prefix else prefix)

    visit(ast.parse(source), "")
    return lengths


def test_the_length_counts_from_def_to_the_bodys_last_line():
    sample = (
        '@decorated\ndef f(\n    x,\n):\n    """Doc.\n\n    More."""\n\n    # why\n    return x\n\n\n'
        "class C:\n    def m(self):\n        def inner():\n            pass\n        return inner\n"
    )
    assert function_lengths(sample) == {"f:2": 9, "C.m:14": 4, "C.m.inner:15": 2}


def test_no_function_is_longer_than_the_house_limit():
    long = {
        f"{name}.{function}": lines
        for name, path in _modules().items()
        for function, lines in function_lengths(path.read_text()).items()
        if lines > MAX_FUNCTION_LINES
    }
    assert long == {}, f"over {MAX_FUNCTION_LINES} lines: move a stage into the component that owns it"


def test_no_two_modules_share_a_basename():
    # Two step.py or two watch.py make every mention of one ("see watch.py") a guess.
    by_name = defaultdict(list)
    for name, path in _modules().items():
        if path.name not in SHARED_BY_RULE:
            by_name[path.name].append(name)
    assert {base: names for base, names in by_name.items() if len(names) > 1} == {}


# The CLI's subcommand modules each offer `register(subparsers)`: one convention, read the same everywhere.
NAMES_BY_RULE = ("register",)


def test_no_two_modules_define_the_same_public_name():
    # Two build_optimizer (the torch one and the strategy's) make every call of one a guess at which.
    by_name = defaultdict(list)
    for name, path in _modules().items():
        for node in ast.parse(path.read_text()).body:
            defined = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            if defined and not node.name.startswith("_") and node.name not in NAMES_BY_RULE:
                by_name[node.name].append(name)
    assert {what: names for what, names in by_name.items() if len(names) > 1} == {}
