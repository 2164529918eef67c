"""Read a stream written by a libstrap test with the Python reader (open_stream) and compare it
with what the test says it wrote: tensors bit for bit, then its tokens and DROP packets.

Usage: readback.py STREAM EXPECT_DIR
EXPECT_DIR/manifest.jsonl has one line per event the test sent, in order:
  {"kind":"tensor","name":..,"dtype":..,"shape":[..],"step":..,"forward":..,"meta":{..},"file":"N.bin"}
  {"kind":"token","index":..,"token_id":..,"text":..}
  {"kind":"drop","name":..,"bytes":..}
Exit 0 when everything matches; else prints the first difference and exits 1.
"""
import json
import sys
from pathlib import Path

from llm_instrumentation import open_stream


def main() -> int:
    stream, exp = sys.argv[1], Path(sys.argv[2])
    want = [json.loads(line) for line in (exp / "manifest.jsonl").read_text().splitlines() if line]
    with open_stream(stream) as r:
        return compare(r, exp, want)


def compare(r, exp: Path, want: list) -> int:
    tensors = list(r)
    packets = list(r.packets())
    end = r.end()
    got_tensors = iter(tensors)
    tokens = [p for p in packets if p.type_name == "TOKEN"]
    drops = [p for p in packets if p.type_name == "DROP"]
    n_t = n_tok = n_drop = 0
    for w in want:
        if w["kind"] == "tensor":
            t = next(got_tensors, None)
            if t is None:
                print(f"tensor {n_t} ({w['name']}) missing from the stream")
                return 1
            raw = (exp / w["file"]).read_bytes()
            checks = [("name", t.name, w["name"]), ("dtype", t.dtype, w["dtype"]),
                      ("shape", list(t.shape), w["shape"]), ("step", t.step, w["step"]),
                      ("forward", t.forward, w["forward"]), ("meta", t.meta or {}, w.get("meta") or {}),
                      ("bytes", t.raw() == raw, True)]
            for what, g, e in checks:
                if g != e:
                    print(f"tensor {n_t} ({w['name']}): {what} {g!r} != {e!r}")
                    return 1
            if len(t.packets) != w.get("parts", 1):
                print(f"tensor {n_t} ({w['name']}): {len(t.packets)} packets, expected {w.get('parts', 1)}")
                return 1
            n_t += 1
        elif w["kind"] == "token":
            p = tokens[n_tok] if n_tok < len(tokens) else None
            if p is None or p.step != w["index"] or p.meta.get("token_id") != w["token_id"] \
                    or p.meta.get("text") != w["text"]:
                print(f"token {n_tok}: {p and (p.step, p.meta)} != {w}")
                return 1
            n_tok += 1
        elif w["kind"] == "drop":
            p = drops[n_drop] if n_drop < len(drops) else None
            if p is None or p.name != w["name"] or p.tensor_len != w["bytes"]:
                print(f"drop {n_drop}: {p and (p.name, p.tensor_len)} != {w}")
                return 1
            n_drop += 1
    extra = next(got_tensors, None)
    if extra is not None or n_tok != len(tokens) or n_drop != len(drops):
        print(f"stream holds more than the test wrote: tensor {extra}, {len(tokens)} tokens, {len(drops)} drops")
        return 1
    if end is None or end.meta.get("status") != "complete":
        print(f"END packet: {end and end.meta}")
        return 1
    print(f"readback: {n_t} tensors, {n_tok} tokens, {n_drop} drops match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
