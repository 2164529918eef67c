"""The golden capture sets (testdata/capture-set): real two-rank sets the client wrote through
strapd, with the facts every reader must find in each rank's stream (expect.json). strapd's
reader (internal/captureset TestGoldenFacts, TestGoldenBadManifests) checks the same files
against the same facts, so the two computations of a rank's manifest entry cannot drift apart
unseen."""

from __future__ import annotations

import json
import re

import pytest

from conftest import REPO
from llm_instrumentation import CaptureSetError, capture_set, open_stream

GOLDEN = REPO / "testdata" / "capture-set"
EXPECT = json.loads((GOLDEN / "expect.json").read_text(encoding="utf-8"))
assert EXPECT["version"] == 1


@pytest.mark.parametrize("name", sorted(EXPECT["sets"]))
def test_facts(name):
    want = EXPECT["sets"][name]
    d = GOLDEN / name
    assert sorted(p.name for p in d.glob("*.strap")) == sorted(want["ranks"])
    m = capture_set.load(d / want["manifest"])
    assert (m["world_size"], m["layout"], m["job_id"]) == (want["world_size"], want["layout"], want["job_id"])
    for e in m["ranks"]:
        with open_stream(d / e["stream"]) as r:
            got = capture_set.rank_entry(r, e["stream"])
        assert got.pop("stream") == e["stream"]
        assert got == want["ranks"][e["stream"]]
    # The manifest built from the streams alone is the one rank 0 wrote.
    built = capture_set.build(str(d / "cap.rank*-of-*.strap"), manifest=d / want["manifest"])
    assert {**built, "created": 0} == {**m, "created": 0}


@pytest.mark.parametrize("name", sorted(EXPECT["bad"]))
def test_bad_manifests(name):
    want = EXPECT["bad"][name]
    # Python quotes each name of a compound key: 'tp_rank'/'pp_stage'/'dp_rank'.
    key = "/".join(f"'{k}'" for k in want["key"].split("/"))
    where = f"rank {want['rank']}: key {key}" if want["rank"] is not None else f"key {key}"
    with pytest.raises(CaptureSetError, match=re.escape(where)):
        capture_set.load(GOLDEN / name)
