"""Sphinx configuration of the t2t docs site: MyST markdown pages, the executed notebooks
rendered without running them, and an API reference from the docstrings.

Build: `.venv/bin/sphinx-build -W --keep-going -b html docs /tmp/docs_html`
(tests/test_docs.py builds it the same way)."""
import pathlib
import sys

from docutils import nodes
from sphinx import addnodes

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))          # autodoc imports t2t from this checkout

project = "t2t"
author = "t2t contributors"
copyright = "t2t contributors"

extensions = [
    "myst_nb",                  # MyST markdown pages and .ipynb notebooks (myst_parser included)
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",      # the docstrings' "Args:" / "Returns:" sections
]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"

# Files under docs/ that are not pages of the site, each with why. Every .md and .ipynb
# under docs/ is a page (the plots in docs/ablations/ are the images its tables embed).
exclude_patterns = [
    "_build",       # a local build's output, if one is made inside docs/
]

myst_enable_extensions = ["colon_fence", "deflist"]
# Anchors for headings down to ####, as GitHub makes them, so `page.md#a-heading` links
# work on GitHub and in the site alike.
myst_heading_anchors = 4

# The notebooks are committed executed (notebooks/execute.py; tests/test_notebooks.py runs
# them): the site shows their saved outputs and runs nothing.
nb_execution_mode = "off"

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = "t2t"
pygments_style = "sphinx"


# The ablation_results notebook displays markdown and plots read from docs/ablations/, so
# the relative links and images in its outputs are relative to that folder.
SHOWS_ABLATIONS = "notebooks/ablation_results"


def _pages_by_file(env):
    """Each page's file with symlinks resolved -> its docname (the notebooks under
    docs/notebooks/ are links to notebooks/*.ipynb)."""
    return {pathlib.Path(env.doc2path(d)).resolve(): d for d in env.found_docs}


def _repository_links(app, doctree):
    """Links a page makes as GitHub reads them, resolved for the site:

    - to a page through the file it links to (`../notebooks/quickstart.ipynb` is the
      notebook page `notebooks/quickstart`);
    - to a file of the repository outside docs/ (benchmarks/RESULTS.md, launch/README.md, a
      config): a download of that file;
    - in the ablation_results notebook's outputs: relative to docs/ablations/.

    Anything else that does not resolve is left to MyST, which warns (the build fails under
    -W): a link to a missing file or heading stays an error."""
    env = app.env
    docname = env.docname
    pages = _pages_by_file(env)
    if docname == SHOWS_ABLATIONS:
        for image in doctree.findall(nodes.image):
            uri = image["uri"]
            if "/" not in uri and (DOCS / "ablations" / uri).is_file():
                image["uri"] = "/ablations/" + uri          # "/" is docs/ for Sphinx
    for node in list(doctree.findall(addnodes.pending_xref)):
        if node.get("reftype") != "myst":
            continue
        target = node.get("reftarget", "")
        if docname == SHOWS_ABLATIONS and node.get("refdomain") is None:
            path, _, anchor = target.partition("#")
            page = "ablations/" + (path[:-3] if path.endswith(".md") else "README")
            if page in env.found_docs and (not path or path.endswith(".md")):
                node["refdomain"], node["reftarget"] = "doc", page
                node["reftargetid"] = anchor or None
            continue
        if node.get("refdomain") != "doc" or target in env.found_docs:
            continue
        base = pathlib.Path(target)                 # MyST's absolute path, suffix dropped
        if not base.is_absolute():
            continue
        for suffix in (".md", ".ipynb"):
            if base.with_name(base.name + suffix).resolve() in pages:
                node["reftarget"] = pages[base.with_name(base.name + suffix).resolve()]
                break
        else:
            path = base.with_name(base.name + ".md")
            if ROOT in path.parents and path.is_file():
                download = addnodes.download_reference(
                    "", "", refdoc=docname, refexplicit=True,
                    # "/" is docs/ for Sphinx: "/../benchmarks/RESULTS.md" is the repository's
                    reftarget="/../" + path.relative_to(ROOT).as_posix())
                download += node.children or [nodes.literal(text=path.name)]
                node.replace_self(download)


def setup(app):
    # before Sphinx's collectors (priority 500) record the images and downloads
    app.connect("doctree-read", _repository_links, priority=400)
