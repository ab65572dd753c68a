"""Write docs/troubleshooting.md from the errors t2t raises (`--check`: is it up to date?).

    python tools/errors_page.py            # (re)write docs/troubleshooting.md
    python tools/errors_page.py --check    # exit 1, with one line, if the page is stale

The page lists every error the `t2t` command line prints as one line: it walks t2t/ with
`ast` and takes each `raise X(...)` where X is a *one-line error class*, with its message
template (an f-string's fields shown as `{name}`), class, exit code and location (file and
function, no line numbers, so that the page changes only when an error does).

The one-line classes, from the `except` clauses at the end of `t2t.cli.main`:

- `t2t.errors.UserError` and every class derived from it anywhere in t2t/ (ConfigError,
  CheckpointMismatchError, InputFileError, BuildError, ...), found by following the class
  definitions and imports of each module, so that a same-named class that is not a
  UserError (t2t.convert.rules.CheckpointMismatchError, a plain ValueError) is left out;
- `FileNotFoundError`, which `main` reports as one line too.

Not listed: `main` also turns gin's own ValueError/RuntimeError/TypeError about a config into
one line (`t2t.run.gin_utils.error_summary`); those messages come from gin, not from a
`raise` in t2t, and the page's hand-written intro describes them. Every other exception
(a plain ValueError raised by t2t included) is an internal error: one line
`internal error: TYPE: message`, the traceback in the error log, exit 1.
"""
from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
PAGE = "docs/troubleshooting.md"
COMMAND = "python tools/errors_page.py"
BASE = "t2t.errors.UserError"
BUILTIN_ONE_LINE = ("FileNotFoundError",)      # caught next to UserError in t2t.cli.main
RUNTIME = "(message built at runtime)"
MAX_FIELD = 40                                 # a longer formatted field is shown as {...}
# Section order: the commands' own modules first, then the rest alphabetically.
ORDER = ("cli", "run", "train", "data", "models", "nn", "convert", "ablations")
# Where a class's errors exit with something other than EXIT_USAGE.
EXIT_CODES = {"BuildError": "2 (1 from `t2t data build`)", "DiskFullError": "74"}


@dataclass(frozen=True, order=True)
class Raise:
    subsystem: str
    path: str            # t2t/nn/config.py
    function: str        # TransformerConfig.__post_init__, or <module>
    message: str         # the template, one line
    cls: str             # the class name as defined


# ----------------------------------------------------------------------- names and classes
def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _bindings(tree: ast.Module, module: str) -> Dict[str, str]:
    """{local name: dotted name it stands for} for the module's imports and classes."""
    names: Dict[str, str] = {}
    for node in ast.walk(tree):                 # function-local imports count too
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                names[a.asname or top] = a.name if a.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in tree.body:                      # a module's own classes win over imports
        if isinstance(node, ast.ClassDef):
            names[node.name] = f"{module}.{node.name}"
    return names


def _dotted(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


class Package:
    """The parsed modules of a package and what their names refer to."""

    def __init__(self, root: Path, package: str = "t2t"):
        self.root = root
        self.trees: Dict[str, Tuple[str, ast.Module]] = {}
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            self.trees[module_name(path, root)] = (rel, ast.parse(path.read_text("utf-8")))
        self.names = {m: _bindings(tree, m) for m, (_, tree) in self.trees.items()}
        self.one_line = self._one_line_classes()

    def resolve(self, module: str, expr: ast.AST) -> Optional[str]:
        """The dotted name `expr` refers to in `module`, re-exports followed."""
        dotted = _dotted(expr)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        name = self.names[module].get(head, head) + (f".{rest}" if rest else "")
        for _ in range(10):                     # t2t.convert.X -> t2t.convert.rules.X
            mod, _, attr = name.rpartition(".")
            target = self.names.get(mod, {}).get(attr)
            if target is None or target == name:
                break
            name = target
        return name

    def _one_line_classes(self) -> Set[str]:
        found = {BASE}
        classes = [(m, c) for m, (_, tree) in self.trees.items() for c in tree.body
                   if isinstance(c, ast.ClassDef)]
        while True:
            new = {f"{m}.{c.name}" for m, c in classes
                   if any(self.resolve(m, b) in found for b in c.bases)} - found
            if not new:
                return found | set(BUILTIN_ONE_LINE)
            found |= new

    def raises(self) -> Iterator[Raise]:
        for module, (path, tree) in self.trees.items():
            yield from _Walker(self, module, path).run(tree)


# ----------------------------------------------------------------------- messages
def _field(expr: ast.AST) -> str:
    text = ast.unparse(expr)
    return "{" + (text if len(text) <= MAX_FIELD else "...") + "}"


def template(node: ast.AST) -> Optional[str]:
    """The message `node` builds, with `{...}` for what is known only at runtime; None if
    nothing of it is static."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else _field(v.value)
                       for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = template(node.left), template(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else _field(node.left)) + \
            (right if right is not None else _field(node.right))
    if isinstance(node, ast.IfExp):             # `... + (" and more" if more else "")`
        body, orelse = template(node.body), template(node.orelse)
        if orelse == "" or body == "":
            return body or orelse
        return None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        owner = template(node.func.value)
        if node.func.attr == "join" and owner is not None and node.args and \
                isinstance(node.args[0], (ast.GeneratorExp, ast.ListComp)):
            item = template(node.args[0].elt)
            return None if item is None else f"{item}{owner}..."
        if node.func.attr == "format" and owner is not None:
            return owner
    return None


def _returns(function: ast.AST) -> Iterator[ast.AST]:
    """What `function` returns, not counting functions nested in it."""
    for node in ast.iter_child_nodes(function):
        if isinstance(node, ast.Return) and node.value is not None:
            yield node.value
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _returns(node)


def subsystem(path: str) -> str:
    """t2t/nn/config.py -> nn; t2t/cli.py -> cli; the other top-level modules -> t2t."""
    parts = path.split("/")
    return parts[1] if len(parts) > 2 else "cli" if parts[1] == "cli.py" else "t2t"


def _one_line(text: str) -> str:
    return " ".join(text.split())


class _Walker(ast.NodeVisitor):
    """The one-line raises of one module, with the function each is in."""

    def __init__(self, package: Package, module: str, path: str):
        self.package, self.module, self.path = package, module, path
        self.scope: List[ast.AST] = []
        self.found: List[Raise] = []
        tree = package.trees[module][1]
        self.helpers = {f.name: f for f in tree.body
                        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def run(self, tree: ast.Module) -> List[Raise]:
        self.visit(tree)
        return self.found

    def _scoped(self, node):
        self.scope.append(node)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Raise(self, node: ast.Raise):
        call = node.exc
        if isinstance(call, ast.Call):
            cls = self.package.resolve(self.module, call.func)
            if cls in self.package.one_line:
                where = ".".join(s.name for s in self.scope) or "<module>"
                name = cls.rpartition(".")[2]
                for message in self.messages(call, node):
                    self.found.append(Raise(subsystem(self.path), self.path, where,
                                            _one_line(message), name))
        self.generic_visit(node)

    def messages(self, call: ast.Call, at: ast.AST) -> List[str]:
        arg = call.args[0] if call.args else next(
            (k.value for k in call.keywords if k.arg in ("summary", "msg")), None)
        if arg is None:
            return [RUNTIME]
        if isinstance(arg, ast.Name):           # msg = ...; raise ConfigError(msg)
            assigned = [n.value for s in self.scope[-1:] for n in ast.walk(s)
                        if isinstance(n, ast.Assign) and n.lineno < at.lineno
                        and any(isinstance(t, ast.Name) and t.id == arg.id for t in n.targets)]
            arg = assigned[-1] if assigned else arg
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and \
                arg.func.id in self.helpers:    # raise ConfigError(_message(...)): its returns
            returns = [template(r) for r in _returns(self.helpers[arg.func.id])]
            if returns and None not in returns:
                return returns
        text = template(arg)
        return [text if text else RUNTIME]


# ----------------------------------------------------------------------- the page
def code(text: str) -> str:
    """`text` as inline code, whatever backticks it holds."""
    ticks, run = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        ticks = max(ticks, run)
    fence, pad = "`" * (ticks + 1), " " if ticks else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def exit_code(cls: str) -> str:
    return EXIT_CODES.get(cls, "2")


def render(raises: List[Raise], intro: str) -> str:
    groups: Dict[str, List[Raise]] = {}
    for r in sorted(set(raises)):
        groups.setdefault(r.subsystem, []).append(r)
    order = sorted(groups, key=lambda s: (ORDER.index(s) if s in ORDER else len(ORDER), s))
    lines = [intro.rstrip(), "", "## Every error, by subsystem", "",
             f"Generated from the `raise` statements in t2t/ by `{COMMAND}`; "
             f"`tests/test_troubleshooting.py` fails when this part is stale. "
             f"{len(set(raises))} messages; `{{...}}` is filled in at runtime.", ""]
    for subsystem in order:
        title = "t2t (top-level modules)" if subsystem == "t2t" else f"t2t {subsystem}"
        lines += [f"### {title}", ""]
        for r in groups[subsystem]:
            lines += [f"- {code(r.message)}", "",
                      f"  {r.cls}, exit {exit_code(r.cls)}: `{r.path}: {r.function}`", ""]
    return "\n".join(lines).rstrip() + "\n"


INTRO_MARK = "<!-- generated below: python tools/errors_page.py -->"


def generate(root: Path = ROOT) -> str:
    """The page: the hand-written intro of the current page (up to INTRO_MARK), then the
    generated list."""
    page = (root / PAGE).read_text("utf-8") if (root / PAGE).exists() else ""
    intro = page.split(INTRO_MARK)[0].rstrip() if INTRO_MARK in page else "# Troubleshooting"
    return render(list(Package(root).raises()), f"{intro}\n\n{INTRO_MARK}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the page differs from what would be written")
    args = parser.parse_args(argv)
    page, text = ROOT / PAGE, generate()
    if args.check:
        if not page.exists() or page.read_text("utf-8") != text:
            print(f"{PAGE} is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    page.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
