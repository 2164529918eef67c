#!/usr/bin/env python3
"""Write clients/c/common/_records.h from records.py (``make generate``): the header libstrap
and the resource extension (``resources/_native*.c``) both compile.

records.py is loaded by its path: it imports only the standard library, so the header can be
made without torch or the package's other modules. ``--check`` writes nothing and exits 1
when the committed header differs from what records.py makes now.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
RECORDS = HERE / "src" / "llm_instrumentation" / "resources" / "records.py"
HEADER = HERE.parent / "c" / "common" / "_records.h"


def load_records() -> Any:
    spec = importlib.util.spec_from_file_location("_strap_resource_records", RECORDS)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses and enums look their module up
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 if the header is stale; write nothing")
    args = ap.parse_args()
    text = load_records().c_header()
    if args.check:
        if not HEADER.exists() or HEADER.read_text() != text:
            print(f"{HEADER.relative_to(HERE.parent.parent)} is stale: run make generate", file=sys.stderr)
            return 1
        return 0
    HEADER.write_text(text)
    print(f"wrote {HEADER.relative_to(HERE.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
