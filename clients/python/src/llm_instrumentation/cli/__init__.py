"""Command-line tools shipped with strap-llm (``llm-prof``).

``llm_prof_main`` is 1.3.1's name for the ``llm-prof`` entry point, kept importable from here.
"""

from .llm_prof import main as llm_prof_main

__all__ = ["llm_prof_main"]
