"""No code outside the registry of model families compares a family or a Hugging Face
model_type with a name: it looks the family up (`t2t.models.families.get`,
`t2t.convert.pretrained.FORMS`) and asks it (docs/design.md, "How to add a model")."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "t2t"
SUBJECTS = {"family", "model_type"}     # variables and attributes that hold a family's name



def _names():
    from t2t.convert import pretrained
    from t2t.models import families
    return set(families.names()) | set(pretrained.SUPPORTED)


def _subject(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in SUBJECTS
    if isinstance(node, ast.Attribute):
        return node.attr in SUBJECTS
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
        return len(node.args) > 1 and getattr(node.args[1], "value", None) in SUBJECTS
    return False


def _strings(node: ast.AST):
    """The string literal(s) `node` is: "x", or a tuple, list or set of them; else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return [e.value for e in node.elts]
    return None


def switches(source: str, names) -> list:
    """Comparisons in `source` of a family or model_type with string literals, or of
    anything with a family's or model_type's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            literals = [_strings(o) for o in operands]
            named = {s for strings in literals if strings for s in strings} & names
            if named or (any(map(_subject, operands)) and any(literals)):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_family_is_compared_with_a_name():
    names, found = _names(), []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        found += [f"{rel}:{line}: {text}" for line, text in
                  switches(path.read_text("utf-8"), names)]
    assert not found, "\n".join(found)


def test_the_check_sees_each_form():
    source = ("a = model.family == 'gpt'\n"
              "b = family in ('encoder', 'decoder')\n"
              "c = getattr(m, 'family', None) != 't5'\n"
              "d = t == 'roberta'\n"
              "e = kind == 'lm'\n"
              "f = family == other\n")
    assert [line for line, _ in switches(source, _names())] == [1, 2, 3, 4]
