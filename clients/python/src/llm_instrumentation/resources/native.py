"""The resource monitor's C paths (``_native.c``): the CPU timing wrapper of a module
(``TimedForward``) and the writer's filling of templates (``render``).

Optional: where the extension is not built both are None and the Python paths, which write
the same bytes, run. Where it is built it must have been compiled from this ``records.py``:
at import it compares the schema it was compiled with (``_records.h``) against
:func:`records.schema_items` and raises ``RuntimeError`` naming the first field that differs
— a drift fails loudly instead of sending every record to the Python paths.
"""

from __future__ import annotations

import glob
import logging
import os
from typing import Any, Optional

from . import records

__all__ = ["TimedForward", "available", "extension", "render"]

#: The loaded extension module (None where it is not built).
extension: Any
try:
    from . import _native as extension
except ImportError as e:  # pragma: no cover - exercised by the wheel-less tests
    extension = None
    # Not built: the Python paths, quietly. Built but not loadable: said once, not hidden.
    built = glob.glob(os.path.join(os.path.dirname(__file__), "_native*.so"))
    if built:
        logging.getLogger("llm_instrumentation").warning(
            "llm_instrumentation: %s does not load (%s); the resource monitor takes its Python paths", built[0], e)

if extension is not None:
    extension.register(records.schema_items(), records.UNREAD)

#: The C timing wrapper (None without the extension). The tests set these to None to run the
#: Python paths; the wrappers and the writer read them here at the time they need them.
TimedForward: Optional[Any] = extension.TimedForward if extension is not None else None
#: The C writer of templated records (None without the extension).
render: Optional[Any] = extension.render if extension is not None else None


def available() -> bool:
    """Whether the extension is built (whatever the tests switched off)."""
    return extension is not None
