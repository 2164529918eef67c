"""Command-line tools shipped with strap-llm (``llm-prof``)."""
