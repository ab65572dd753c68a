"""docs/troubleshooting.md lists every one-line error t2t raises (tools/errors_page.py)."""
import ast
import importlib.util
import re
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("errors_page", ROOT / "tools" / "errors_page.py")
errors_page = sys.modules["errors_page"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(errors_page)


@pytest.fixture(scope="module")
def package():
    return errors_page.Package(ROOT)


def _intro() -> str:
    return (ROOT / errors_page.PAGE).read_text("utf-8").split(errors_page.INTRO_MARK)[0]


def test_page_is_up_to_date():
    page = (ROOT / errors_page.PAGE).read_text("utf-8")
    assert errors_page.INTRO_MARK in page, f"{errors_page.PAGE} lost its generated-part marker"
    assert page == errors_page.generate(ROOT), \
        f"{errors_page.PAGE} is stale: run `{errors_page.COMMAND}` and commit the page"


def test_extractor_on_a_synthetic_package(tmp_path):
    files = {
        "t2t/__init__.py": "",
        "t2t/errors.py": """
            class UserError(Exception):
                pass

            class ConfigError(UserError, ValueError):
                pass
            """,
        "t2t/sub/__init__.py": "",
        "t2t/sub/mod.py": """
            from t2t import errors
            from t2t.errors import ConfigError


            class LocalError(errors.UserError):
                pass


            def _message(x):
                def inner():
                    return 1
                return f"bad {x}"


            def f_string(name, n):
                raise ConfigError(f"unknown {name!r}: {n:d} left")


            def concatenated(path):
                raise ConfigError("cannot read " "the file "
                                  + f"{path}; fix it") from None


            def nested(names):
                raise LocalError(f"choose one of {', '.join(sorted(names))}")


            def via_helper(x):
                raise ConfigError(_message(x))


            class Thing:
                def method(self):
                    raise errors.ConfigError(str(self))


            def ignored(x):
                raise ValueError(f"an internal error {x}")
            """,
        "t2t/other.py": """
            class ConfigError(ValueError):      # same name, not a UserError
                pass


            def shadowed():
                raise ConfigError("not listed")
            """,
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    found = {(r.subsystem, r.path, r.function, r.message, r.cls)
             for r in errors_page.Package(tmp_path).raises()}
    path = "t2t/sub/mod.py"
    assert found == {
        ("sub", path, "f_string", "unknown {name}: {n} left", "ConfigError"),
        ("sub", path, "concatenated", "cannot read the file {path}; fix it", "ConfigError"),
        ("sub", path, "nested", "choose one of {', '.join(sorted(names))}", "LocalError"),
        ("sub", path, "via_helper", "bad {x}", "ConfigError"),
        ("sub", path, "Thing.method", errors_page.RUNTIME, "ConfigError"),
    }


def _one_line_in_cli() -> set:
    """The exception names t2t.cli.main catches and turns into EXIT_USAGE."""
    tree = ast.parse((ROOT / "t2t" / "cli.py").read_text("utf-8"))
    main = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "main")
    names = set()
    for handler in (h for n in ast.walk(main) if isinstance(n, ast.Try) for h in n.handlers):
        usage = any(isinstance(n, ast.Return) and isinstance(n.value, ast.Name)
                    and n.value.id == "EXIT_USAGE" for n in ast.walk(handler))
        if usage:
            types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            names |= {ast.unparse(t) for t in types}
    return names


def test_intro_names_every_one_line_class(package):
    caught = _one_line_in_cli()
    assert {"UserError", "FileNotFoundError"} <= caught
    classes = caught | {c.rpartition(".")[2] for c in package.one_line}
    intro = _intro()
    missing = sorted(c for c in classes if f"`{c}`" not in intro)
    assert not missing, f"add {missing} to the classes table of {errors_page.PAGE}"


def test_common_causes_quote_real_messages(package):
    """Each `text` block of the hand-written intro quotes messages t2t raises (or the one-line
    summaries t2t.run.gin_utils makes of gin's errors); `...` stands for an elided part."""
    gin_utils = package.trees["t2t.run.gin_utils"][1]
    known = [r.message for r in package.raises()] + [
        errors_page.template(v) or "" for f in gin_utils.body if isinstance(f, ast.FunctionDef)
        for v in errors_page._returns(f)]
    quotes = [line for block in re.findall(r"```text\n(.*?)```", _intro(), re.S)
              for line in block.splitlines()]
    assert len(quotes) >= 10
    for quote in quotes:
        pieces = [p.strip() for p in quote.split("...") if p.strip()]
        assert any(all(p in m for p in pieces) for m in known), f"no such message: {quote}"
