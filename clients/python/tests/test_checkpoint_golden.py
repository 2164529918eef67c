"""Golden checkpoint files (testdata/checkpoint): each client's, 1.3.1's and invalid ones, with
the facts every reader must parse from them (expect.json). The Go reader (internal/checkpoint
TestGolden) and libstrap's (clients/c/tests/test_checkpoint_golden.c) check the same file
against the same facts, so the three readers cannot drift apart unseen."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import REPO
from llm_instrumentation import checkpoint as ckpt
from llm_instrumentation.checkpoint import CheckpointError

GOLDEN = REPO / "testdata" / "checkpoint"
EXPECT = json.loads((GOLDEN / "expect.json").read_text(encoding="utf-8"))["files"]


def test_every_file_has_its_facts():
    assert sorted(p.name for p in GOLDEN.glob("*.ckpt.json")) == sorted(EXPECT)


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_golden(name):
    want = EXPECT[name]
    path = GOLDEN / name
    if not want["valid"]:
        with pytest.raises(CheckpointError):
            ckpt.load(path)
        legacy = want.get("legacy_131")
        got = ckpt.load_131(path)
        if legacy is None:
            assert got is None
        else:
            assert got is not None
            assert [t["token_id"] for t in got.tokens] == legacy["token_ids"]
            assert [t["position"] for t in got.tokens] == legacy["positions"]
            assert [t["token_index"] for t in got.tokens] == list(range(len(legacy["token_ids"])))
            assert got.metadata["resume_count"] == legacy["resume_count"]
            assert got.metadata["start_time"] == legacy["start_time"]
        return
    c = ckpt.load(path)
    assert ckpt.load_131(path) is None  # ours, never taken for 1.3.1's
    got = {"valid": True, "stream": c.stream, "fingerprint": c.fingerprint, "stream_offset": c.stream_offset,
           "packets": c.packets, "drops": c.drops, "last_seq": c.last_seq, "last_packet_offset": c.last_packet_offset,
           "last_packet_crc": c.last_packet_crc, "token_count": c.token_count, "forward_count": c.forward_count,
           "listed_tokens": -1 if c.tokens is None else len(c.tokens),
           "token_log": None if c.token_log is None else {"bytes": c.token_log.bytes, "crc32c": c.token_log.crc32c,
                                                          "tokens": c.token_log.tokens}}
    if "token_log_ids" in want:
        got["token_log_ids"] = [t["token_id"] for t in ckpt.read_token_log(c, str(path))]
    assert got == want


def test_written_again_parses_to_the_same(tmp_path):
    """Our writer (Checkpoint.to_json) round-trips every valid golden file's facts, token log
    and 1.3.1 list included."""
    for name, want in EXPECT.items():
        if not want["valid"]:
            continue
        c = ckpt.load(GOLDEN / name)
        again = ckpt.Checkpoint.parse(c.to_json([ckpt.encode_token(t) for t in c.tokens] if c.tokens else None))
        assert (again.token_log, again.tokens, again.stream_offset, again.last_packet_crc, again.extra) == \
               (c.token_log, c.tokens, c.stream_offset, c.last_packet_crc, c.extra), name


def test_token_log_damage_is_named(tmp_path):
    name = "python-token-log.ckpt.json"
    shutil.copy(GOLDEN / name, tmp_path / name)
    log = (GOLDEN / (name + ckpt.TOKEN_LOG_SUFFIX)).read_bytes()
    c = ckpt.load(tmp_path / name)
    dst = Path(ckpt.token_log_path(tmp_path / name))
    with pytest.raises(CheckpointError, match="token log"):
        ckpt.read_token_log(c, "s")  # no log beside the copy
    dst.write_bytes(log + b'{"token_index": 3, "token_id": 0, "token_text": "", "position": 3}\n')
    assert [t["token_index"] for t in ckpt.read_token_log(c, "s")] == [0, 1, 2]  # tokens past it: not read
    dst.write_bytes(log[:-1])
    with pytest.raises(CheckpointError, match="vouches for"):
        ckpt.read_token_log(c, "s")
    dst.write_bytes(log.replace(b'"token_id": 8', b'"token_id": 9'))
    with pytest.raises(CheckpointError, match="CRC32C"):
        ckpt.read_token_log(c, "s")


def test_token_log_writer_appends_and_rewrites(tmp_path):
    """The writer appends only what is new (O(tokens since the last checkpoint)) and its
    extent is the log's; a capture's first call (or fewer tokens) rewrites the log whole."""
    p = tmp_path / "x.ckpt.json.tokens.jsonl"
    w = ckpt.TokenLogWriter(str(p))
    toks = [ckpt.encode_token({"token_index": i, "token_id": i, "token_text": f"t{i}", "position": i}) for i in range(5)]
    assert w.sync(toks[:2]) == ckpt.token_log_extent(toks[:2])
    assert w.sync(toks) == ckpt.token_log_extent(toks)
    assert p.read_bytes() == "".join(t + "\n" for t in toks).encode()
    w.close()
    w2 = ckpt.TokenLogWriter(str(p))
    assert w2.sync(toks[:3]) == ckpt.token_log_extent(toks[:3])  # a resumed capture: whole, 3 tokens
    assert p.read_bytes() == "".join(t + "\n" for t in toks[:3]).encode()
    w2.close()


@pytest.mark.parametrize("name", ["libstrap.ckpt.json", "client-131form.ckpt.json"])
def test_written_again_byte_for_byte(name):
    """Both clients write checkpoints with one encoder (clients/c/common/strap_checkpoint.c):
    libstrap's file from a real capture and the encoder's with every key it writes come out
    again byte for byte from what was parsed of them."""
    data = (GOLDEN / name).read_bytes()
    c = ckpt.Checkpoint.parse(data)
    assert c.to_json([ckpt.encode_token(t) for t in c.tokens] if c.tokens is not None else None) == data


def test_writer_refuses_what_no_reader_takes(tmp_path):
    c = ckpt.load(GOLDEN / "libstrap.ckpt.json")
    c.last_packet_offset = c.stream_offset
    with pytest.raises(CheckpointError, match="last_packet_offset"):
        c.to_json()
    c = ckpt.load(GOLDEN / "libstrap.ckpt.json")
    c.extra["last_checkpoint_time"] = float("nan")
    with pytest.raises(CheckpointError, match="last_checkpoint_time"):
        c.to_json()


@pytest.mark.parametrize("name, says", [
    ("bad-crc-range.ckpt.json", "last_packet_crc is 4294967296, expected a non-negative integer below 2**32"),
    ("bad-drops.ckpt.json", "inconsistent numbers: drops 7 / token_count 3 exceed 6 packets"),
    ("bad-fingerprint-type.ckpt.json", "fingerprint is 7, expected a string"),
    ("bad-missing-token-count.ckpt.json", "missing field 'token_count'"),
    ("bad-minus-zero.ckpt.json", "drops is -0, expected a non-negative integer"),
    ("bad-surrogate.ckpt.json", "not JSON: unpaired high surrogate escape at byte 62"),
    ("bad-token-log-fields.ckpt.json", "its crc32c is not a non-negative integer"),
    ("bad-version.ckpt.json", "version is 2"),
])
def test_refusals_name_the_file_field_and_value(name, says):
    """The C parser's reasons, with the file's path in front (CheckpointError)."""
    with pytest.raises(CheckpointError) as e:
        ckpt.load(GOLDEN / name)
    assert str(e.value).startswith(f"{GOLDEN / name}: ") and says in str(e.value)
