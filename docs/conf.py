"""Sphinx configuration of the pymc_dp documentation (MyST Markdown, PyData theme).

Build: ``sphinx-build -W -b html docs docs/_build/html`` (warnings are errors).
"""

from importlib.metadata import version as _version

project = "pymc_dp"
author = "pymc_dp developers"
copyright = "2026, pymc_dp developers"
release = _version("pymc-dp")

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
exclude_patterns = ["_build", "scripts", "reproduction/*.csv", "gallery/*.txt"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_rtype = False

html_theme = "pydata_sphinx_theme"
html_title = "pymc_dp"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}
