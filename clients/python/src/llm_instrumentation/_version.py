"""The client's version (a leaf: the modules that send it to strapd import it from here,
not from the package, whose ``__init__`` imports them)."""

__version__ = "0.1.0"
