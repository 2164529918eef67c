"""The resource monitor's C paths (``_native.c``): the CPU timing wrapper of a module
(``TimedForward``) and the writer's filling of templates (``render``).

Optional: where the extension is not built both are None and the Python paths, which write
the same bytes, run. Where it is built it must have been compiled from this ``records.py``:
at import it compares the schema it was compiled with (``_records.h``) against
:func:`records.schema_items` and raises ``RuntimeError`` naming the first field that differs
— a drift fails loudly instead of sending every record to the Python paths.
"""

from __future__ import annotations

from typing import Any, Optional

from . import records

__all__ = ["TimedForward", "render", "available"]

_ext: Any
try:
    from . import _native as _ext
except ImportError:  # pragma: no cover - exercised by the wheel-less tests
    _ext = None

if _ext is not None:
    _ext.register(records.schema_items(), records.UNREAD)

#: The C timing wrapper (None without the extension). The tests set these to None to run the
#: Python paths; the wrappers and the writer read them here at the time they need them.
TimedForward: Optional[Any] = _ext.TimedForward if _ext is not None else None
#: The C writer of templated records (None without the extension).
render: Optional[Any] = _ext.render if _ext is not None else None


def available() -> bool:
    """Whether the extension is built (whatever the tests switched off)."""
    return _ext is not None
