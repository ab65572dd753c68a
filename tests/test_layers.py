"""The import layers of docs/design.md hold: a subpackage imports only its own layer and the
layers below it (function-level imports included), so the library has no cycles."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "t2t"

# Bottom to top. A module may import from its own layer and any layer below.
LAYERS = (
    ("errors", "storage", "platforms", "precision"),   # plain Python and device facts
    ("nn", "evaluation"),                   # flax layers; dependency-free metrics
    ("data",),                              # text -> packed numpy batches (no model code)
    ("models",),                            # a wrapper per family around t2t.nn
    ("convert",),                           # Hugging Face weights in and out
    ("train", "launch"),                    # trainer, partitioning; Cloud TPU launcher
    ("run",),                               # gin at the edge: configurables, builders
    ("ablations", "cli"),                   # grids and the command line
)
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def _top(module: str) -> str:
    return module.split(".")[1]


def _imports(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            if node.module == "t2t":
                yield from (f"t2t.{a.name}" for a in node.names)


def test_every_subpackage_has_a_layer():
    names = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
             if not p.name.startswith("__")
             and (p.suffix == ".py" or (p / "__init__.py").is_file())}   # configs/: data
    assert names <= set(LAYER), sorted(names - set(LAYER))


def test_no_import_reaches_up():
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if len(parts) < 2 or parts[1] == "__init__":
            continue
        source = parts[1]
        for module in _imports(path):
            if module.startswith("t2t.") and LAYER[_top(module)] > LAYER[source]:
                upward.append(f"{'/'.join(parts)}.py imports {module}")
    assert not upward, "\n".join(upward)
