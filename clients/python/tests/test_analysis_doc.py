"""docs/ANALYSIS.md's code runs as written: its python blocks in order in one namespace, its
`python -m ...` shell lines as commands, against the real strapd."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "ANALYSIS.md"


def blocks():
    return re.findall(r"```(python|sh)\n(.*?)```", DOC.read_text(), flags=re.S)


def test_doc_blocks_run(real_strapd, tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STRAPD_SOCKET", real_strapd.socket)
    env = {**os.environ, "PYTHONPATH": str(REPO / "clients" / "python" / "src"), "STRAPD_SOCKET": real_strapd.socket}
    ns: dict = {"__name__": "analysis_doc"}
    ran = {"python": 0, "sh": 0}
    for lang, code in blocks():
        if lang == "python":
            exec(compile(code, f"{DOC}:block{ran['python']}", "exec"), ns)
            ran["python"] += 1
            continue
        for line in code.splitlines():
            line = line.split("#")[0].strip()
            if not line.startswith("python "):
                continue  # setup lines (make build, pip install) are the reader's, not ours
            argv = shlex.split(line)
            res = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, env=env, timeout=300)
            assert res.returncode == 0, (line, res.stdout, res.stderr)
            ran["sh"] += 1
    assert ran["python"] >= 7 and ran["sh"] == 3
    assert (tmp_path / "graph.png").stat().st_size > 0
    assert ns["report"].explained_variance > 0
    assert ns["index"]["rows"] == 12 * 768  # model.layers.* : 4 blocks, their attention and MLP
