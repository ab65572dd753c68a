"""Documentation markup -> plain prose, for pretraining text (the `micro` corpus).

Each function takes one source file's text and returns its prose as paragraphs joined by
"\\n" (one line per paragraph, whitespace collapsed): headings, list items and admonitions
are kept as paragraphs; code (literal blocks, doctests, verbatim POD, roff ``.nf``/``.EX``
blocks, HTML ``<pre>``), tables, comments and navigation are dropped; inline markup is
reduced to its text (``:func:`json.dumps``` -> "json.dumps", ``L<perlre|x>`` -> "perlre").
Stdlib only; the rules are heuristics good enough for language-model text, not renderers.
"""
from __future__ import annotations

import html
import html.parser
import re

# ----------------------------------------------------------------------------- common


def _paragraphs(parts: list[str]) -> str:
    """Paragraphs with whitespace collapsed, empty ones dropped, joined by newlines."""
    return "\n".join(p for p in (" ".join(x.split()) for x in parts) if p)


# ----------------------------------------------------------------------------- reST (Sphinx)

# Directives whose body is code, data or navigation: dropped with their body. Any other
# directive (note, warning, function, class, versionchanged, ...) keeps its body as prose.
RST_DROP = frozenset({
    "code-block", "code", "sourcecode", "literalinclude", "highlight", "highlightlang",
    "doctest", "testcode", "testoutput", "testsetup", "testcleanup", "toctree", "index",
    "image", "figure", "productionlist", "raw", "csv-table", "list-table", "table", "math",
    "include", "module", "currentmodule", "moduleauthor", "sectionauthor", "codeauthor",
    "tabularcolumns", "audit-event", "autosummary", "graphviz", "contents", "literal",
    "parsed-literal", "opcode", "program", "default-domain", "c:namespace", "cpp:namespace",
    "role", "only", "limited-api-list", "stable-api-list", "miscnews",
})
# Directives whose argument Sphinx renders as a sentence before the body.
RST_LABELS = {"versionadded": "New in version {}.", "versionchanged": "Changed in version {}:",
              "deprecated": "Deprecated since version {}:",
              "deprecated-removed": "Deprecated since version {}:"}
_RST_ADORNMENT = re.compile(r"^([=\-~^\"'`#*+:.<>_!$%&,/;?@\\|])\1{2,}\s*$")
_RST_DIRECTIVE = re.compile(r"^\.\.\s+([\w:.-]+)::(?:\s+(.*))?$")
_RST_OPTION = re.compile(r"^:[\w -]+:(\s|$)")
_RST_BULLET = re.compile(r"^(?:[-*+\u2022]|#\.|\d+\.|\(?[a-zA-Z0-9]\))\s+")
_RST_ROLE = re.compile(r":([\w:.+-]+):`([^`]+)`")
_RST_LITERAL = re.compile(r"``(.+?)``")
_RST_LINK = re.compile(r"`([^`<]*?)\s*(?:<[^`>]*>)?`_{0,2}")
_RST_STRONG = re.compile(r"\*\*(\S.*?)\*\*")
_RST_EMPHASIS = re.compile(r"(?<![\w*])\*(?![\s*])(.+?)(?<!\s)\*(?![\w*])")
_RST_FOOTNOTE = re.compile(r"\s?\[(?:#[\w-]*|\d+|\*)\]_")
_RST_SUBSTITUTION = re.compile(r"\|([\w -]+)\|_{0,2}")


def _rst_role_text(role: str, content: str) -> str:
    """The text a role shows: ``~a.b`` -> "b", ``text <target>`` -> "text", ``:pep:`8``` ->
    "PEP 8"."""
    if role in ("rfc", "pep") and content.isdigit():
        return f"{role.upper()} {content}"
    m = re.fullmatch(r"(.*?)\s*<[^<>]+>", content, re.S)
    if m and m.group(1):
        return m.group(1)
    content = content.lstrip("!")
    return content.rsplit(".", 1)[-1] if content.startswith("~") else content


def rst_inline(s: str) -> str:
    """reST inline markup reduced to its text (roles, literals, links, emphasis, refs)."""
    s = _RST_ROLE.sub(lambda m: _rst_role_text(m.group(1), m.group(2)).lstrip("~"), s)
    s = _RST_LITERAL.sub(r"\1", s)
    s = _RST_FOOTNOTE.sub("", s)
    s = _RST_LINK.sub(r"\1", s)
    s = _RST_STRONG.sub(r"\1", s)
    s = _RST_EMPHASIS.sub(r"\1", s)
    s = _RST_SUBSTITUTION.sub(r"\1", s)
    return re.sub(r"\\([\\*_`|:])", r"\1", s.replace("\\ ", ""))


def rst_to_text(source: str) -> str:
    """A reST file (Sphinx ``_sources/*.rst.txt``) as prose paragraphs (module docstring)."""
    out: list[str] = []
    para: list[str] = []
    skip_indent: int | None = None  # skip blank lines and lines indented more than this
    in_doctest = after_directive = continued = False

    def flush() -> None:
        if para:
            out.append(rst_inline(" ".join(para)))
            para.clear()

    for line in source.expandtabs(8).splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if skip_indent is not None:
            if not stripped or indent > skip_indent:
                continue
            skip_indent = None
        if in_doctest:
            in_doctest = bool(stripped)
            continue
        if continued:  # a directive's argument continued by a trailing backslash
            continued = stripped.endswith("\\")
            continue
        if not stripped:
            flush()
            after_directive = False
            continue
        if after_directive and _RST_OPTION.match(stripped):
            continue  # a directive's :option: lines
        after_directive = False
        if _RST_ADORNMENT.match(stripped):  # section over/underline, transition
            flush()
            continue
        directive = _RST_DIRECTIVE.match(stripped)
        if directive:
            flush()
            name, argument = directive.group(1), (directive.group(2) or "").strip()
            if name in RST_DROP or name.startswith(("c:", "cpp:")) and name.endswith("var"):
                skip_indent = indent
            elif name in RST_LABELS and argument:
                para.append(RST_LABELS[name].format(argument.split()[0].rstrip(",")))
            elif name in ("rubric", "topic", "admonition", "sidebar", "seealso") and argument:
                out.append(rst_inline(argument))
            after_directive, continued = True, argument.endswith("\\")
            continue
        if stripped.startswith(".."):  # comment, target, footnote, substitution definition
            flush()
            skip_indent = indent
            continue
        if stripped.startswith(">>>"):
            flush()
            in_doctest = True
            continue
        if stripped.startswith(("+-", "+=")) or (stripped.startswith("|")
                                                 and stripped.endswith("|")):
            flush()  # grid table
            continue
        bullet = _RST_BULLET.match(stripped)
        if bullet and stripped[bullet.end():]:
            flush()
            stripped = stripped[bullet.end():]
        if stripped.endswith("::"):  # a literal block follows
            text = stripped[:-2].rstrip()
            if text:
                para.append(text + ":")
            flush()
            skip_indent = indent
            continue
        para.append(stripped)
    flush()
    return _paragraphs(out)


# ----------------------------------------------------------------------------- POD (Perl)

_POD_ENTITIES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "quot": '"', "amp": "&"}
_POD_MULTI = re.compile(r"([A-Z])<{2,}\s+(.*?)\s+>{2,}", re.S)
_POD_SIMPLE = re.compile(r"([A-Z])<([^<>]*)>")


def _pod_code(code: str, content: str) -> str:
    if code == "E":
        name = content.strip()
        if name.isdigit():
            return chr(int(name))
        return _POD_ENTITIES.get(name, html.unescape(f"&{name};"))
    if code in ("X", "Z"):
        return ""
    if code == "L":
        text = content.split("|", 1)[0] if "|" in content else content
        return text.strip('"').replace('/"', " ").replace("/", " ")
    return content


def pod_inline(s: str) -> str:
    """POD formatting codes (B<> I<> C<> F<> L<> E<> S<> X<> Z<>, nested, ``C<< >>``) -> text."""
    s = _POD_MULTI.sub(lambda m: _pod_code(m.group(1), m.group(2)), s)
    while True:
        new = _POD_SIMPLE.sub(lambda m: _pod_code(m.group(1), m.group(2)), s)
        if new == s:
            return s
        s = new


def pod_to_text(source: str) -> str:
    """A POD document as prose: headings and items kept, verbatim (indented) blocks and
    ``=begin``/``=for`` regions dropped."""
    out: list[str] = []
    skipping = None  # the =begin format being skipped
    in_pod = True
    for block in re.split(r"\n[ \t]*\n", source.replace("\r\n", "\n")):
        if not block.strip():
            continue
        if block.startswith("="):
            command, _, rest = block[1:].partition(" ")
            command = command.split("\n", 1)[0]
            rest = block[len(command) + 1:].strip()
            if command == "cut":
                in_pod = False
            elif command == "pod" or command.startswith("head") or command == "item":
                in_pod = True
                if skipping is None and command != "pod":
                    out.append(pod_inline(rest.lstrip("*").strip()))
            elif command == "begin":
                skipping = rest.split()[0] if rest else ""
            elif command == "end":
                skipping = None
            continue  # =over =back =encoding =for ...
        if not in_pod or skipping is not None or block[0] in " \t":
            continue  # code outside POD, a =begin region, a verbatim paragraph
        out.append(pod_inline(block))
    return _paragraphs(out)


# ----------------------------------------------------------------------------- roff (man)

_ROFF_NAMED = {"em": "\u2014", "en": "\u2013", "bu": "\u2022", "aq": "'", "dq": '"',
               "lq": "\u201c", "rq": "\u201d", "oq": "\u2018", "cq": "\u2019", "co": "\u00a9",
               "rg": "\u00ae", "mu": "\u00d7", "de": "\u00b0", "ti": "~", "ha": "^",
               "rs": "\\", "hy": "-", "mi": "-", "pl": "+", "eq": "=", "ga": "`", "ul": "_",
               "tm": "\u2122", "<=": "\u2264", ">=": "\u2265", "!=": "\u2260", "->": "\u2192"}
_ROFF_ESCAPE = re.compile(
    r"\\(?:\((?P<two>..)|\[(?P<long>[^\]]*)\]|\*(?:\(..|\[[^\]]*\]|.)|f(?:\(..|\[[^\]]*\]|.)"
    r"|s[+-]?\d+|[kmnzgV](?:\(..|\[[^\]]*\]|.)|[hvwbolLDxX]'[^']*'|(?P<char>.))")
_ROFF_CHARS = {"-": "-", "e": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", "|": "", "^": "",
               "&": "", "c": "", ".": ".", "'": "'", "`": "`", "%": "", ":": "", "t": " "}
_ROFF_FONT_MACROS = {"B", "I", "BR", "RB", "BI", "IB", "IR", "RI", "SM", "SB", "UR", "MT"}
_ROFF_BREAK_MACROS = {"PP", "P", "LP", "TP", "TQ", "IP", "HP", "RS", "RE", "br", "sp", "SH",
                      "SS", "in", "ti", "ne", "bp"}
_ROFF_ARG = re.compile(r'"((?:[^"]|"")*)"?|(\S+)')


def roff_inline(s: str) -> str:
    """groff escapes -> text: fonts dropped, ``\\(em`` -> an em dash, ``\\-`` -> "-"."""
    def sub(m: re.Match) -> str:
        if m.group("two") is not None:
            return _ROFF_NAMED.get(m.group("two"), "")
        if m.group("long") is not None:
            name = m.group("long")
            return _ROFF_NAMED.get(name, chr(int(name[1:], 16)) if re.fullmatch(
                r"u[0-9A-F]{4,6}", name) else "")
        if m.group("char") is not None:
            return _ROFF_CHARS.get(m.group("char"), m.group("char"))
        return ""
    return _ROFF_ESCAPE.sub(sub, s)


def roff_to_text(source: str) -> str:
    """A man page (man/mdoc-free roff) as prose: ``.SH`` headings kept, ``.nf``/``.EX``
    and ``.TS`` blocks, comments and unknown requests dropped, font macros joined."""
    out: list[str] = []
    para: list[str] = []
    skip_until: str | None = None

    def flush() -> None:
        if para:
            out.append(roff_inline(" ".join(para)))
            para.clear()

    for line in source.replace("\r\n", "\n").split("\n"):
        if skip_until:
            if line.startswith(("." + skip_until, "'" + skip_until)):
                skip_until = None
            continue
        if line.startswith(('.\\"', "'\\\"", '\\"')) or line.startswith(".\\#"):
            continue
        if line.startswith((".", "'")):
            request, _, args = line[1:].strip().partition(" ")
            args = args.strip()
            if request in ("nf", "EX", "TS", "EQ", "de", "ig"):
                flush()
                skip_until = {"nf": "fi", "EX": "EE", "TS": "TE", "EQ": "EN", "de": ".",
                              "ig": "."}[request]
            elif request in _ROFF_FONT_MACROS:
                words = [m.group(1) if m.group(1) is not None else m.group(2)
                         for m in _ROFF_ARG.finditer(args)]
                if request in ("B", "I", "SM", "SB"):
                    para.append(" ".join(w.replace('""', '"') for w in words))
                elif request not in ("UR", "MT"):
                    para.append("".join(w.replace('""', '"') for w in words))
            elif request in _ROFF_BREAK_MACROS:
                flush()
                if request in ("SH", "SS") and args:
                    out.append(roff_inline(args.strip('"')).capitalize()
                               if args.isupper() else roff_inline(args.strip('"')))
            continue  # .TH .so .ad .hy .PD ... and unknown requests
        if line.strip():
            para.append(line.strip())
        else:
            flush()
    flush()
    return _paragraphs(out)


# ----------------------------------------------------------------------------- HTML

_HTML_BLOCKS = frozenset({"p", "div", "li", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6",
                          "blockquote", "section", "article", "td", "th", "tr", "br", "table",
                          "ul", "ol", "dl", "figcaption", "caption", "title", "body", "hr"})
_HTML_SKIP = frozenset({"pre", "script", "style", "head", "nav", "code-block", "svg",
                        "noscript", "textarea", "form", "select"})
# DocBook/Sphinx chrome whose text is navigation, not prose.
HTML_SKIP_CLASSES = frozenset({"navheader", "navfooter", "toc", "sphinxsidebar", "related",
                               "footer", "header", "breadcrumbs", "list-of-tables",
                               "list-of-figures", "list-of-examples", "navigation",
                               "highlight", "programlisting", "screen", "synopsis",
                               "cmdsynopsis", "funcsynopsis", "literallayout"})


class _HtmlProse(html.parser.HTMLParser):
    def __init__(self, skip_classes: frozenset[str]):
        super().__init__(convert_charrefs=True)
        self.skip_classes = skip_classes
        self.paragraphs: list[str] = []
        self.buffer: list[str] = []
        self.stack: list[tuple[str, bool]] = []  # (tag, opened a skipped region)
        self.skipping = 0

    def flush(self) -> None:
        if self.buffer:
            self.paragraphs.append("".join(self.buffer))
            self.buffer.clear()

    def handle_starttag(self, tag, attrs):
        classes = set((dict(attrs).get("class") or "").split())
        if tag in ("br", "hr", "img", "meta", "link", "input", "wbr"):
            if tag in ("br", "hr"):
                self.flush()
            return
        skip = tag in _HTML_SKIP or bool(classes & self.skip_classes)
        self.stack.append((tag, skip))
        self.skipping += skip
        if tag in _HTML_BLOCKS and not self.skipping:
            self.flush()

    def handle_endtag(self, tag):
        if not any(t == tag for t, _ in self.stack):
            return  # a stray end tag
        while self.stack:
            t, skip = self.stack.pop()
            self.skipping -= skip
            if t == tag:
                break
        if tag in _HTML_BLOCKS and not self.skipping:
            self.flush()

    def handle_data(self, data):
        if not self.skipping:
            self.buffer.append(data)


def html_to_text(source: str, skip_classes: frozenset[str] = HTML_SKIP_CLASSES) -> str:
    """An HTML page as prose: the text of its block elements, one paragraph each; ``<pre>``,
    scripts, the ``<head>`` and elements of the `HTML_SKIP_CLASSES` classes dropped."""
    parser = _HtmlProse(skip_classes)
    parser.feed(source)
    parser.close()
    parser.flush()
    return _paragraphs(parser.paragraphs)


# ----------------------------------------------------------------------------- Texinfo (info)

_INFO_UNDERLINE = re.compile(r"^\s*([*=\-.])\1{2,}\s*$")
_INFO_XREF = re.compile(r"\*[Nn]ote\s+(?:\([^)]*\))?([^:]*?)::|\*[Nn]ote\s+([^:]*?):[^.,]*[.,]?",
                        re.S)
_INFO_FOOTNOTE_REF = re.compile(r"(?<=\w)\(\d+\)")


def _info_prose(block: str) -> bool:
    """A paragraph worth keeping: not a menu, not an example (indented 5+ columns, not
    ending like a sentence)."""
    lines = [l for l in block.split("\n") if l.strip()]
    if lines[0].strip() in ("* Menu:", "---------- Footnotes ----------") or all(
            l.lstrip().startswith("* ") and "::" in l or l.startswith(" " * 10) for l in lines):
        return False  # a menu and its continuation lines
    if all(l.startswith("     ") for l in lines):
        text = " ".join(block.split())
        return len(text.split()) >= 4 and text[-1] in ".:;!?)"
    return True


def info_to_text(source: str) -> str:
    """A GNU info file (makeinfo output) as prose: each node's text without its header,
    menus, examples and section underlines; index and license nodes dropped; ``*note X::``
    -> "X"."""
    out: list[str] = []
    for chunk in source.split("\x1f")[1:]:  # before the first node: the info-dir preamble
        header, _, body = chunk.lstrip("\n").partition("\n")
        node = re.search(r"Node:\s*([^,\n]*)", header)
        if not node or re.search(r"index|licen[cs]e|copying", node.group(1), re.I):
            continue  # Tag Table, Indirect, an index node, the manual's license text
        for block in re.split(r"\n[ \t]*\n", body):
            block = "\n".join(l for l in block.split("\n") if not _INFO_UNDERLINE.match(l))
            if block.strip() and _info_prose(block):
                text = _INFO_XREF.sub(lambda m: m.group(1) or m.group(2), block)
                out.append(_INFO_FOOTNOTE_REF.sub("", text))
    return _paragraphs(out)
