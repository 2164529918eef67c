"""The ``strapd`` console script: runs the daemon bundled in a platform wheel, so
``pip install strap-llm`` puts a working ``strapd`` on the venv's PATH."""

from __future__ import annotations

import os
import sys

from ._daemon import find_strapd_binary


def main() -> None:
    """Replace this process with strapd, passing the arguments through.

    The binary is the one the client itself would start (:func:`find_strapd_binary`:
    ``$STRAPD_BIN``, the bundled daemon, ...); this shim is never its own answer. Exits 127
    with a message when there is none (a source install without a built daemon).
    """
    binary = find_strapd_binary()
    if binary is None:
        sys.stderr.write(
            "strapd: this strap-llm install carries no strapd binary (a source or editable install); "
            "install the platform wheel (`make wheel`), set STRAPD_BIN, or build one with `make build`\n"
        )
        sys.exit(127)
    try:
        os.execv(binary, [binary, *sys.argv[1:]])
    except OSError as e:
        sys.stderr.write(f"strapd: cannot run {binary}: {e}\n")
        sys.exit(126)
