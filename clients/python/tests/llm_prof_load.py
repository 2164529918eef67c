"""Workload for the llm-prof test: disk writes with fsync, syscalls, futex waits, page
faults, sleeps and loopback TCP, until killed. Prints "ready" once its first round is done."""

import mmap
import os
import socket
import sys
import threading
import time

path = sys.argv[1]
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
cli = socket.create_connection(srv.getsockname())
peer, _ = srv.accept()
ev = threading.Event()
first = True
while True:
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
    with open("/dev/zero", "rb", buffering=0) as z:
        for _ in range(200):
            z.read(64)
    ev.wait(0.02)
    # A fresh anonymous mapping each round: malloc would keep the pages after the first.
    m = mmap.mmap(-1, 16 << 20)
    for i in range(0, len(m), 4096):
        m[i] = 1
    m.close()
    cli.sendall(b"x" * 65536)
    got = 0
    while got < 65536:
        got += len(peer.recv(65536))
    time.sleep(0.05)
    if first:
        print("ready", flush=True)
        first = False
