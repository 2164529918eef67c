"""llm_instrumentation 1.3.1's own test suite, run unmodified against this package and the
real strapd.

The suite comes from the 1.3.1 sdist on PyPI: ``make compat131-upstream`` (run by ``make
test-python``) fetches it into ``build/compat131/upstream``, never into the repository;
``testdata/compat131/upstream/README.md`` says where from and holds each file's digest. It runs
in a subprocess pytest on a copy of that directory, with this package importable as ``llm_instrumentation`` and ``STRAPD_SOCKET``
naming a real strapd. The tests that exercise only 1.3.1 internals are left out by name
(``INTERNAL``, each with its reason; clients/python/README.md lists the same names); every
other test must pass — a test that is skipped or goes missing fails this one too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import REPO, TESTDATA

#: the fetched suite (``make compat131-upstream``); STRAP_COMPAT131_UPSTREAM names another copy
UPSTREAM = Path(os.environ.get("STRAP_COMPAT131_UPSTREAM") or REPO / "build" / "compat131" / "upstream")
#: the digests of its files
MANIFEST = TESTDATA / "compat131" / "upstream" / "README.md"


def _need_upstream() -> None:
    if not (UPSTREAM / "tests").is_dir():
        pytest.skip(f"1.3.1's test suite is not at {UPSTREAM}: run `make compat131-upstream` (it downloads the "
                    f"1.3.1 sdist from PyPI; make test-python does it first)")

# Test (or whole module, when it cannot even be imported) -> why it is not run.
INTERNAL = {
    "tests/unit/test_profiling.py": "imports llm_instrumentation.core.profiling, a 1.3.1 helper outside its "
                                    "documented API whose monitoring thread sampled nothing",
    "tests/unit/test_ring_buffer.py": "imports llm_instrumentation.memory.ring_buffer, 1.3.1's in-process byte ring, "
                                      "replaced by strapd's shared-memory ring",
    "tests/unit/test_hooks.py::test_should_instrument": "calls the private OptimizedHookManager._should_instrument",
    "tests/unit/test_hooks.py::test_hook_asynchronous_processing": "patches the private "
                                                                   "OptimizedHookManager._enqueue_async_processing",
}

# Every other test of the suite: each must pass.
PUBLIC = {
    "tests/test_token_tracking.py::" + t for t in (
        "test_token_tracking_disabled_by_default", "test_token_tracking_enabled", "test_tracker_auto_position",
        "test_checkpoint_interval_creates_persistent_snapshot", "test_resume_from_checkpoint_restores_previous_tokens",
        "test_checkpoint_requires_token_tracking")
} | {
    "tests/unit/test_hooks.py::test_attach_and_detach_hooks",
    "tests/unit/test_hooks.py::test_hook_synchronous_processing",
    "tests/unit/test_packet_analysis.py::test_packet_analysis_pipeline",
} | {
    "tests/unit/test_streaming.py::" + t for t in (
        "test_streaming_start_stop", "test_enqueue_tensor_and_write", "test_multiple_tensors",
        "test_stop_streaming_waits_for_queue")
}


def _junit_ids(xml_path: Path) -> dict:
    """``{nodeid: outcome}`` from a junit XML report (outcome: passed, failed, error, skipped)."""
    out = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        # classname is "tests.unit.test_hooks" for tests/unit/test_hooks.py
        nodeid = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
        kinds = {child.tag for child in case}
        outcome = "passed"
        for k in ("failure", "error", "skipped"):
            if k in kinds:
                outcome = {"failure": "failed"}.get(k, k)
        out[nodeid] = outcome
    return out


@pytest.mark.integration
def test_upstream_131_suite_passes(real_strapd, tmp_path):
    _need_upstream()
    work = tmp_path / "upstream"
    shutil.copytree(UPSTREAM, work, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    env = {**os.environ, "STRAPD_SOCKET": real_strapd.socket, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    # The suite must test this package, not some other llm_instrumentation on the path.
    where = subprocess.run([sys.executable, "-c", "import llm_instrumentation; print(llm_instrumentation.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).resolve().is_relative_to(REPO / "clients" / "python" / "src"), where
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests",
            "-o", "asyncio_default_fixture_loop_scope=function", f"--junitxml={tmp_path / 'junit.xml'}"]
    for name in INTERNAL:
        args.append(f"--deselect={name}" if "::" in name else f"--ignore={name}")
    proc = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    results = _junit_ids(tmp_path / "junit.xml")
    report = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    assert {k: v for k, v in results.items() if v != "passed"} == {}, report
    assert set(results) == PUBLIC, f"ran {sorted(results)}\n{report}"


def test_readme_lists_the_internal_tests():
    """clients/python/README.md names each test left out, as this runner does."""
    text = (REPO / "clients" / "python" / "README.md").read_text()
    section = text[text.index("## Migrating from 1.3.1"):]
    listed = set(re.findall(r"`(tests/unit/[\w/]+\.py(?:::\w+)?)`", section))
    assert listed == set(INTERNAL)


def test_fetched_suite_is_unmodified():
    """The fetched files are the sdist's as recorded, byte for byte (sha256 in the manifest)."""
    import hashlib

    _need_upstream()
    readme = MANIFEST.read_text()
    want = dict(re.findall(r"^\| `([\w/.]+)` \| `([0-9a-f]{64})` \|", readme, re.M))
    files = sorted(str(p.relative_to(UPSTREAM)) for p in UPSTREAM.rglob("*.py"))
    assert sorted(want) == files
    for rel, digest in want.items():
        assert hashlib.sha256((UPSTREAM / rel).read_bytes()).hexdigest() == digest, rel
