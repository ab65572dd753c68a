"""No module of t2t uses another module's private names (`from m import _name`, `m._name`):
what one module shares with another is public, and a leading underscore means "only here"."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "t2t"


def _module(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p) for p in PACKAGE.rglob("*.py")}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(node: ast.AST):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id] + parts[::-1]
    return None


def _uses(here: str, source: str, package: bool = False):
    """(line, "module.name") of each private name of another t2t module that the module
    `here` (a package's `__init__` when `package`), whose text is `source`, uses."""
    tree = ast.parse(source)
    aliases = {}                              # local name -> the t2t module it is
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "t2t":
                    aliases[a.asname or "t2t"] = a.name if a.asname else "t2t"
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:                    # relative to the package of `here`
                parts = here.split(".") if package else here.split(".")[:-1]
                base = ".".join(parts[:len(parts) - node.level + 1] + [node.module])
            if base.split(".")[0] != "t2t":
                continue
            for a in node.names:
                if f"{base}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
                elif _private(a.name) and base != here:
                    yield node.lineno, f"{base}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            dotted = _dotted(node.value)
            if dotted and dotted[0] in aliases:
                module = ".".join([aliases[dotted[0]]] + dotted[1:])
                if module in MODULES and module != here:
                    yield node.lineno, f"{module}.{node.attr}"


def test_no_module_uses_another_modules_private_names():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        uses = _uses(_module(path), path.read_text("utf-8"), path.name == "__init__.py")
        found += [f"{rel}:{line} uses {name}" for line, name in uses]
    assert not found, "\n".join(found)


def test_the_check_sees_each_form():
    """`from m import _x`, `m._x` after `from pkg import m`, `import a.b as m` and
    `import a.b` are each found; a module's own private names and dunders are not."""
    source = ("from t2t.convert.hf_files import _secret, read_json\n"
              "from t2t.convert import rules\n"
              "import t2t.convert.rules as r\n"
              "import t2t.convert.rules\n"
              "from .hf_common import _shared\n"
              "rules._a, r._b, t2t.convert.rules._c, rules.__doc__, _own = 1, 2, 3, 4, 5\n")
    assert [name for _, name in _uses("t2t.convert.probe", source)] == [
        "t2t.convert.hf_files._secret", "t2t.convert.hf_common._shared",
        "t2t.convert.rules._a", "t2t.convert.rules._b", "t2t.convert.rules._c"]
