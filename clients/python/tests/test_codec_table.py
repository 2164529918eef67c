"""The client's codec table against the golden one (testdata/codec-table/codecs.json), which Go
(internal/codec TestCodecTable) and libstrap (clients/c/tests/test_codec_table.c) check too:
the names a config accepts, each codec's level range and lossy modes, and the numbers the
stream readers decode by."""

from __future__ import annotations

import json

import pytest

from conftest import REPO
from llm_instrumentation import _activation_codecs as ac
from llm_instrumentation import config as C
from llm_instrumentation import stream as S

TABLE = json.loads((REPO / "testdata" / "codec-table" / "codecs.json").read_text(encoding="utf-8"))
assert TABLE["version"] == 1
CODECS = {c["name"]: c for c in TABLE["codecs"]}

#: The readers' number for each codec name.
READER_IDS = {"none": S.CODEC_NONE, "lz4": S.CODEC_LZ4, "zstd": S.CODEC_ZSTD, "shuffle": ac.SHUFFLE,
              "quant": ac.QUANT, "fp16": ac.FP16, "fp8": ac.FP8, "transform": ac.TRANSFORM}


def test_names():
    assert sorted(C.SUPPORTED_CODECS) == sorted(CODECS)
    assert sorted(C.LOSSY_CODECS) == sorted(n for n, c in CODECS.items() if c["lossy_modes"])
    assert sorted(C.CODEC_LEVELS) == sorted(CODECS)
    assert sorted(C.LOSSY_MODES) == sorted(C.LOSSY_CODECS)
    assert C.DEFAULT_CODEC in CODECS


def test_reader_ids():
    assert sorted(READER_IDS) == sorted(CODECS)
    assert {n: CODECS[n]["id"] for n in CODECS} == READER_IDS


@pytest.mark.parametrize("name", sorted(CODECS))
def test_levels_and_modes(name):
    c = CODECS[name]
    lo, hi = c["levels"]
    assert C.CODEC_LEVELS[name] == (lo, hi)
    assert tuple(C.LOSSY_MODES.get(name, ())) == tuple(c["lossy_modes"])
    # The config's own check: every level in range taken, the ones beside it refused.
    lossy = {"mode": c["lossy_modes"][0], "value": 0.01} if c["lossy_modes"] else None
    for lvl in range(lo, hi + 1):
        cfg = C.InstrumentationConfig(compression_algorithm=name, compression_level=lvl, lossy=lossy)
        assert cfg.compression_level == lvl
    for lvl in (lo - 1, hi + 1):
        with pytest.raises(ValueError, match="out of range"):
            C.InstrumentationConfig(compression_algorithm=name, compression_level=lvl, lossy=lossy)
