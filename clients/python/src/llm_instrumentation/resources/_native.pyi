"""The resource monitor's C paths (``_native.c``); ``native.py`` loads and registers them."""

from typing import Any, Callable, List, Optional, Sequence, Tuple

def register(schema_items: List[Tuple[str, str, int, str]], unread: object) -> None:
    """Compare ``records.schema_items()`` with the compiled-in schema; RuntimeError names
    the first row that differs."""

def render(state: Any, records: List[Tuple[Any, ...]], start: int, lines: List[bytes], deadline_ns: int) -> int:
    """Render the templated records from ``start``; the index of the first not written."""

def template_key(record: Tuple[Any, ...], memory: Optional[Any] = ...) -> Tuple[Any, ...]:
    """The template key ``render`` looks ``record`` up by (``records.KEYS``)."""

class TimedForward:
    """The CPU timing wrapper of a module's forward (``wrappers.fast_forward``)."""

    def __init__(self, recorder: Any, orig: Callable[..., Any], general: Callable[..., Any],
                 finish: Callable[..., Any], hand_off: Callable[[], None], records: List[Tuple[Any, ...]], site: Any,
                 tag: int, tensor: type, longest: List[Any], active: List[bool], derived: bool,
                 alloc_min: int) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
