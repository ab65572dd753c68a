"""Parsing gin files and bindings with the package's `t2t/configs/` (also `configs/` at the top of a
checkout) on the search path."""
from __future__ import annotations

import ast
import contextlib
import difflib
import importlib.abc
import importlib.machinery
import inspect
import logging
import pathlib
import re
import sys
from typing import Dict, Optional, Sequence, Tuple

import gin

from t2t.errors import ConfigError

CONFIG_DIR = pathlib.Path(__file__).resolve().parent.parent / "configs"   # shipped in t2t


def register_configurables() -> None:
    """Import the run layer, which registers every configurable a gin file may bind."""
    import t2t.run.experiment  # noqa: F401
    import t2t.run.finetune  # noqa: F401  (imports configurables and user_data too)
    import t2t.run.gpt_format  # noqa: F401  gpt_format_experiment (GPT-1 fine-tuning)


class _NoNamespacePackages(importlib.abc.MetaPathFinder):
    """gin also looks for an include such as 'runs/finetune.gin' inside an importable
    package `runs`; a plain `runs/` directory on the Python path (a MODEL_DIR parent) is a
    namespace package without a file, on which gin's check crashes (TypeError) instead of
    answering "not there". While parsing, such a directory is not a package."""

    def find_spec(self, name, path=None, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.origin is None and spec.submodule_search_locations:
            raise ModuleNotFoundError(f"{name} is a namespace package", name=name)
        return None   # let the usual finders answer


@contextlib.contextmanager
def _without_namespace_packages():
    finder = _NoNamespacePackages()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


# {resolved gin files: gin's bindings and imports after parsing them}, inside
# `reuse_file_parses` (None outside it).
_FILE_PARSES: Optional[Dict[Tuple[str, ...], Tuple[Dict, set]]] = None


@contextlib.contextmanager
def reuse_file_parses():
    """Within this block `parse(files, bindings)` reads each distinct list of files once:
    a later call with the same files restores gin's state after them and parses only its
    bindings. The result is the same; an ablation grid's plan parses the same few file lists
    for each of its hundreds of stages. Files edited inside the block are not re-read."""
    global _FILE_PARSES
    outer = _FILE_PARSES
    _FILE_PARSES = {} if outer is None else outer
    try:
        yield
    finally:
        _FILE_PARSES = outer


def _gin_state() -> Tuple[Dict, set]:
    """gin's bindings and imports (values are not copied: gin deep-copies them per call)."""
    return ({key: dict(values) for key, values in gin.config._CONFIG.items()},
            set(gin.config._IMPORTS))


def _restore_gin_state(state: Tuple[Dict, set]) -> None:
    gin.clear_config()
    config, imports = state
    gin.config._CONFIG.update({key: dict(values) for key, values in config.items()})
    gin.config._IMPORTS.update(imports)


def parse(gin_files: Sequence[str] = (), bindings: Sequence[str] = (),
          clear: bool = True) -> None:
    """Parse gin files (paths, or relative to `configs/`) and bindings.

    A misspelt configurable or parameter fails here, before anything compiles, with
    gin's file and line plus the nearest valid names.
    """
    register_configurables()
    if clear:
        gin.clear_config()
    for path in (CONFIG_DIR, pathlib.Path.cwd()):
        gin.add_config_file_search_path(str(path))
    try:
        with _quiet_search(), _without_namespace_packages():
            files = [_resolve(f) for f in gin_files]
            for f in files:
                _check_text(f)
            if clear and _FILE_PARSES is not None:
                key = tuple(files)
                if key in _FILE_PARSES:
                    _restore_gin_state(_FILE_PARSES[key])
                else:
                    gin.parse_config_files_and_bindings(files, [], finalize_config=False)
                    _FILE_PARSES[key] = _gin_state()     # copies: the bindings below
                files = []                               # do not change the kept state
            gin.parse_config_files_and_bindings(files, list(bindings), finalize_config=False)
    except ValueError as e:
        hint = _suggest(str(e))
        if hint:
            raise ValueError(f"{e}\n  {hint}") from None
        raise
    except SyntaxError as e:      # gin's parser: a value it cannot read, in a file or --gin
        raise ConfigError(_syntax_error(e)) from e
    except UnicodeDecodeError as e:   # an included file that is not text
        raise ConfigError(f"a gin file (or one it includes) is not UTF-8 text ({e.reason} "
                          f"at byte {e.start}); a gin file is text") from e


def _check_text(path: str) -> None:
    """A gin file that is not UTF-8 text (binary, compressed) is one ConfigError naming it
    and the line, not gin's UnicodeDecodeError."""
    from t2t.data.sources import GZIP_MAGIC
    with open(path, "rb") as f:
        data = f.read()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        what = "gzip-compressed" if data[:2] == GZIP_MAGIC else "not UTF-8 text"
        raise ConfigError(f"gin file {path}, line {line}: {what} (byte 0x{data[e.start]:02x}); "
                          "a gin file is text: bindings such as NAME = value") from None


def _syntax_error(error: SyntaxError) -> str:
    """One line for gin's SyntaxError: where (the --gin binding, or file and line) and what."""
    what = str(error.msg).strip().splitlines()[-1].strip().rstrip(".") if error.msg else \
        "a syntax error"
    if error.filename in (None, "<string>"):
        return (f"--gin {(error.text or '').strip()}: {what}; a string needs quotes "
                "(--gin.NAME=\"'text'\"), other values are numbers, True/False/None, lists, "
                "dicts, %MACROS or @references")
    text = (error.text or "").strip()
    text = text if len(text) <= 80 else text[:77] + "..."     # a huge line: its start
    return f"{error.filename}, line {error.lineno}: {what}: {text}"


def _suggest(message: str) -> Optional[str]:
    """'Did you mean ...' for gin's unknown-configurable and unknown-parameter errors."""
    from t2t.run.configurables import REGISTERED
    m = re.search(r"No configurable matching '([^']+)'", message)
    if m:
        close = difflib.get_close_matches(m.group(1).split(".")[-1], sorted(REGISTERED), n=3)
        return f"Did you mean: {', '.join(close)}?" if close else None
    m = re.search(r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'", message)
    if m and m.group(1).split(".")[-1] in REGISTERED:
        fn = REGISTERED[m.group(1).split(".")[-1]]
        params = list(inspect.signature(fn).parameters)
        close = difflib.get_close_matches(m.group(2), params, n=3)
        valid = f"Valid parameters: {', '.join(params)}."
        return (f"Did you mean: {', '.join(close)}? " if close else "") + valid
    return None


_MACRO_BINDING = re.compile(r"^\s*([A-Za-z_]\w*)\s*=")
_MACRO_REFERENCE = re.compile(r"%([A-Za-z_][\w.]*)")
# Macros the code reads itself (gin_utils.query_macro) rather than through a binding.
CODE_MACROS = ("MODEL_FAMILY", "TPU_TOPOLOGY", "TPU_NUM_SLICES")
# What a required macro is for, said when it is missing.
_REQUIRED_HINTS = {
    "MODEL_DIR": "the run's directory for checkpoints, metrics and config.gin, e.g. "
                 "--gin.MODEL_DIR=runs/my_run",
    "INITIAL_CHECKPOINT": "the pretrained model to start from: a t2t MODEL_DIR or a Hugging "
                          "Face directory, e.g. --gin.INITIAL_CHECKPOINT=runs/t5_tiny",
}


def macros(config_str: str) -> tuple[dict, set]:
    """({macro: its value's text}, {names referenced with %}) of a gin config string."""
    defined, referenced = {}, set(_MACRO_REFERENCE.findall(config_str))
    for line in config_str.splitlines():
        m = _MACRO_BINDING.match(line)
        if m:
            defined[m.group(1)] = line.split("=", 1)[1].strip()
    return defined, referenced


def check_bindings(bindings: Sequence[str], required: Sequence[str] = ("MODEL_DIR",)) -> None:
    """After `parse`: every macro set in `bindings` (the command line) is used by the parsed
    config, and each `required` macro it references is bound; else one ConfigError naming
    the nearest valid macro names or what to add."""
    defined, referenced = macros(gin.config_str())
    known = sorted(referenced | set(CODE_MACROS))
    for binding in bindings:
        m = _MACRO_BINDING.match(binding)
        if not m or m.group(1) in known:
            continue
        name = m.group(1)
        close = difflib.get_close_matches(name, known, n=3)
        hint = (f"did you mean {', '.join(close)}?" if close
                else f"this config's macros are {', '.join(known)}")
        raise ConfigError(f"--gin.{name} is not used by this config (a typo would be "
                          f"silently ignored): {hint}")
    for name, value in sorted(defined.items()):
        if value == "%gin.REQUIRED" and name in referenced and name in required:
            what = _REQUIRED_HINTS.get(name, f"bind it with --gin.{name}=VALUE")
            raise ConfigError(f"{name} is required and not set: {what}")


def macro_binding(name: str, value: str) -> str:
    """`--gin.NAME=value` -> a gin binding; bare words and paths become strings, so
    `--gin.MODEL_DIR=/tmp/run` needs no shell-escaped quotes."""
    value = value.strip()
    if value[:1] in "@%" or value in ("True", "False", "None"):
        return f"{name} = {value}"
    try:
        ast.literal_eval(value)
        return f"{name} = {value}"
    except (ValueError, SyntaxError):
        return f"{name} = {value!r}"


@contextlib.contextmanager
def _quiet_search():
    """gin logs an ERROR for every search path an include is *not* found in; a missing
    include still raises, so those lines are noise."""
    logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _resolve(path: str) -> str:
    p = pathlib.Path(path)
    if p.exists():
        return str(p)
    for base in (CONFIG_DIR, CONFIG_DIR.parent):
        if (base / path).exists():
            return str(base / path)
    near = difflib.get_close_matches(path.removeprefix("configs/"), list(_shipped_configs()),
                                     n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise FileNotFoundError(f"gin file {path!r} not found (looked in ., {CONFIG_DIR}){hint}")


def query_macro(name: str, default: Optional[str] = None):
    """The value of a gin macro such as MODEL_FAMILY, or `default` when unbound."""
    try:
        return gin.query_parameter(f"%{name}")
    except ValueError:
        return default


# gin's error when a config reads %NAME and nothing binds NAME: its `macro` configurable is
# called without a value (a TypeError, raised where the macro is first used).
_UNBOUND_MACRO = re.compile(r"In call to configurable 'macro' \(.*?\) in scope '([\w.]+)'")


def unbound_macro(error: BaseException) -> Optional[str]:
    """One line for gin's unbound-macro error, naming shipped configs that bind the macro;
    None for any other error."""
    found = _UNBOUND_MACRO.search(str(error))
    if not found:
        return None
    name = found.group(1)
    binds = re.compile(rf"^{re.escape(name)}\s*=", re.MULTILINE)
    files = sorted(rel for rel, path in _shipped_configs().items()
                   if binds.search(path.read_text(encoding="utf-8")))
    hint = (f" (it is bound in {', '.join(files[:3])}{', ...' if len(files) > 3 else ''})"
            if files else "")
    return (f"the config uses %{name} but nothing binds it: add a --gin_file that does{hint} "
            f"or --gin {name}=...")


def _shipped_configs() -> dict:
    """{path relative to configs/: path} of every gin file t2t ships."""
    return {str(p.relative_to(CONFIG_DIR)): p for p in CONFIG_DIR.rglob("*.gin")}


def required_bindings(error: BaseException) -> Optional[str]:
    """One line for gin's "Required bindings for `fn` not provided in config: [...]"; a
    fine-tuning experiment's INITIAL_CHECKPOINT says which configs have one."""
    found = re.search(r"Required bindings for `(\w+)` not provided in config: \[([^]]*)\]",
                      str(error))
    if not found:
        return None
    fn, names = found.group(1), found.group(2).replace("'", "")
    if fn == "finetune_experiment" and "initial_checkpoint" in names:
        return ("this is not a fine-tuning config (nothing binds INITIAL_CHECKPOINT): `t2t "
                "finetune`, `eval` and `infer` take one, such as configs/experiments/"
                "finetune_t5_from_files.gin, or add --gin.INITIAL_CHECKPOINT=<run or Hugging "
                "Face dir>")
    return (f"this config does not bind {fn}'s {names}: add --gin.{fn}.<name>=... for each, "
            "or a --gin_file that binds them")


# gin raises plain ValueErrors for unknown configurables/parameters and bad syntax.
_GIN_VALUE_ERRORS = ("No configurable matching", "doesn't have a parameter", "In file",
                     "Unknown reference", "Could not parse")


def error_summary(error: BaseException) -> Optional[str]:
    """One line for an error gin raised about the config: a misspelt name or bad syntax
    (ValueError, with gin's file, line and hint), a required parameter left unbound
    (RuntimeError), a %MACRO nothing binds (TypeError); None for any other error."""
    if isinstance(error, ValueError):
        text = str(error)
        return " ".join(text.split()) if any(s in text for s in _GIN_VALUE_ERRORS) else None
    if isinstance(error, RuntimeError):
        return required_bindings(error)
    if isinstance(error, TypeError):
        return unbound_macro(error)
    return None
