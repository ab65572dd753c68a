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


def test_only_the_catalogue_registers_tasks():
    """Importing the data mechanism (every `t2t.data` module outside `catalog/`) registers
    no task; the first lookup imports the catalogue, which registers them."""
    import subprocess
    import sys
    mechanism = sorted(p.stem for p in (ROOT / "data").glob("*.py") if p.stem != "__init__")
    code = (f"import importlib, sys\n"
            f"for m in {mechanism!r}: importlib.import_module('t2t.data.' + m)\n"
            "from t2t.data import tasks\n"
            "assert not tasks._REGISTRY, sorted(tasks._REGISTRY)[:5]\n"
            "assert 't2t.data.catalog' not in sys.modules\n"
            "assert 'bible_web_span_corruption' in tasks.registered_tasks()\n")
    subprocess.run([sys.executable, "-c", code], check=True)


LIGHT_CHECK = r"""
import importlib, pkgutil, re, sys
from importlib import metadata
import flax.linen, jax.numpy, optax
baseline = {m.split(".")[0] for m in sys.modules}   # what they import themselves
import t2t.nn
for info in pkgutil.iter_modules(t2t.nn.__path__):
    importlib.import_module("t2t.nn." + info.name)

def closure(names):
    seen, todo = set(), list(names)
    while todo:
        name = re.split(r"[ ;<>=!~\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [r for r in requires if "extra ==" not in r]
    return seen

allowed = closure(["jax", "jaxlib", "flax", "optax"]) | {"t2t"}
owners = metadata.packages_distributions()
imported = ({m.split(".")[0] for m in sys.modules} - baseline
            - set(sys.stdlib_module_names))
extra = sorted({d.lower().replace("_", "-") for m in imported for d in owners.get(m, [])}
               - allowed)
assert not extra, f"import t2t.nn pulls in {extra}"
"""


def test_nn_needs_only_jax_flax_optax():
    """The core layers import nothing beyond jax, flax, optax and what they depend on."""
    import subprocess
    import sys
    subprocess.run([sys.executable, "-c", LIGHT_CHECK], check=True)


def test_gin_only_at_the_edge():
    """gin is imported by the run layer, the ablation grids and the CLI, never the library."""
    edge = {"run", "ablations", "cli"}
    offenders = [str(path.relative_to(ROOT.parent)) for path in sorted(ROOT.rglob("*.py"))
                 if path.relative_to(ROOT).parts[0].removesuffix(".py") not in edge
                 and any(m == "gin" or m.startswith("gin.") for m in _imports(path))]
    assert not offenders, offenders
