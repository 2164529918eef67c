"""The client's CPU per control message: this tree's ``_protocol`` (libstrap's encoders and reply
decoder through ``_speedups``) against a base revision's, loaded from git into the same process.

Each case is timed for both, alternating, best of ``--repeat`` runs of ``--number`` calls, so the
load of a shared machine weighs on both alike. The base must have a ``_protocol.py`` that runs
against this tree's package (any revision since the typed bodies, e.g. the parent of the switch).

Example:
    .venv/bin/python clients/python/benchmarks/protocol_cost.py --base 4b030aa
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from typing import Any, Callable, Dict

REPO = Path(__file__).resolve().parents[3]
PROTO = REPO / "testdata" / "protocol"


def load_base(rev: str) -> Any:
    """The base revision's ``_protocol`` module, as ``llm_instrumentation._protocol_base``."""
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:clients/python/src/llm_instrumentation/_protocol.py"],
                         check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "_protocol_base.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("llm_instrumentation._protocol_base", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def cases(P: Any) -> Dict[str, Callable[[], Any]]:
    """What ``Connection.send`` and ``Connection.recv`` do per message, without the socket."""
    release, opened = (PROTO / "release.bin").read_bytes(), (PROTO / "opened_ring_tokens.bin").read_bytes()
    if hasattr(P, "decode_reply"):
        recv = lambda d: P.decode(d)[1]  # noqa: E731
    else:  # the base: decode_message, then the dataclass checks (its Connection.recv)
        recv = lambda d: P.BODIES[P.decode_message(d)[1]].from_body(P.decode_message(d)[2])  # noqa: E731
    return {
        "PUBLISH encode": lambda: P.encode(P.Publish(head=123456789, seq=4321)),
        "TOKEN encode": lambda: P.encode(P.Token(seq=5, index=2, token_id=1234, text=" the", position=8, head=8192)),
        "RELEASE decode": lambda: recv(release),
        "OPENED decode": lambda: recv(opened),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision whose _protocol.py is the baseline")
    ap.add_argument("--number", type=int, default=100000)
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    from llm_instrumentation import _protocol as new

    old = load_base(a.base)
    for (name, fo), fn in zip(cases(old).items(), cases(new).values()):
        assert repr(fo()) == repr(fn()), name  # the same bytes, the same bodies
        bo = bn = float("inf")
        for _ in range(a.repeat):
            bo = min(bo, timeit.timeit(fo, number=a.number) / a.number * 1e9)
            bn = min(bn, timeit.timeit(fn, number=a.number) / a.number * 1e9)
        print(f"{name:15s} base {bo:7.0f} ns   this tree {bn:7.0f} ns   ({bo / bn:.1f}x)")


if __name__ == "__main__":
    main()
