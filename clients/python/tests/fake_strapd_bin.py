"""Stand-in for the strapd binary in autostart tests: ``fake_strapd_bin.py serve --socket P``
serves the spec-checking fake daemon until SIGTERM. With ``--fail`` it exits at once."""

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--fail" in os.environ.get("FAKE_STRAPD_MODE", ""):
        print("fake strapd: cannot start: permission denied", flush=True)
        sys.exit(3)
    assert args[0] == "serve" and args[1] == "--socket", args
    from strapfake import FakeStrapd

    d = FakeStrapd(args[2])
    print(f"fake strapd serving on {args[2]}", flush=True)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    while True:
        time.sleep(1)
