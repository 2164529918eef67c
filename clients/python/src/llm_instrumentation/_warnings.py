"""Warnings that point at the caller's code, not at this package's insides.

A warning raised deep in a capture (opening the stream, choosing modules) would otherwise be
reported at a line of this package, and Python's default filter shows one warning per such
line only once per process: a notebook cell run again would stay silent.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
import warnings
from typing import Optional, Type

_SKIP = (os.path.dirname(os.path.abspath(__file__)) + os.sep, os.path.dirname(contextlib.__file__) + os.sep + "contextlib.py")


def warn_caller(message: str, category: Type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the first frame outside this package (and contextlib).

    Args:
        message: the warning's text.
        category: its class.
    """
    level = 1
    f: Optional[types.FrameType] = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_SKIP):
        f = f.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level + 1)
