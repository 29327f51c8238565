# Fanout: the two commands a newcomer runs are `make demo` and `make test`.
SHELL := /bin/bash
SWIFT ?= swift
# Packages the build needs (found through pkg-config) and the tools the interop and serve tests use.
BUILD_PACKAGES := libuv1-dev libnghttp2-dev libssl-dev libsqlite3-dev libhiredis-dev pkg-config
TEST_TOOLS := nghttp2-client nghttp2-server curl openssl python3 chromium redis-server tinyproxy
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEMO_DIR := .demo

.PHONY: deps deps-build deps-test deps-demo build release test demo gateway-example api-baseline docs soak fuzz sanitize sanitize-core lint format clean

## deps: install the C libraries and the test tools (h2load, nghttpd, curl, python3 for the Pushwoosh SDK
## script, chromium for the status page in a headless browser, redis-server for the Redis client's tests,
## tinyproxy for the proxy tests) when missing.
deps: deps-build deps-test

deps-build:
	@if ! pkg-config --exists libuv libnghttp2 openssl sqlite3 hiredis 2>/dev/null; then \
		echo "installing $(BUILD_PACKAGES)"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(BUILD_PACKAGES) >/dev/null; \
	fi

deps-test:
	@missing=""; \
	command -v h2load >/dev/null || missing="$$missing nghttp2-client"; \
	command -v nghttpd >/dev/null || missing="$$missing nghttp2-server"; \
	command -v curl >/dev/null || missing="$$missing curl"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	command -v python3 >/dev/null || missing="$$missing python3"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v tinyproxy >/dev/null || [ -x /usr/sbin/tinyproxy ] || missing="$$missing tinyproxy"; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

## deps-demo: what `make demo` runs besides the build (curl, for its part against `fanout serve`).
deps-demo:
	@if ! command -v curl >/dev/null; then \
		echo "installing curl"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq curl >/dev/null; \
	fi

build: deps-build
	$(SWIFT) build

release: deps-build
	$(SWIFT) build -c release

## test: the whole suite (what CI runs; two XCTest processes side by side, scripts/run-tests.sh), then
## fanout-bench --quick once so the benchmarks never rot (no speed is asserted), then the gateway example, built
## as a package of its own would be. `scripts/run-tests.sh --serial` runs the suite in one process.
test: deps
	$(SWIFT) build --build-tests
	@SWIFT=$(SWIFT) bash scripts/run-tests.sh
	"$$($(SWIFT) build --show-bin-path)/fanout-bench" --quick
	@SWIFT=$(SWIFT) bash scripts/gateway-example.sh

## gateway-example: examples/gateway (its own SwiftPM package on the Fanout library, its own .build) against two
## mock-apns: an alert, a 10,000-token Live Activity job, 6,000 concurrent sends, a 200 ms deadline.
gateway-example: deps-build
	@SWIFT=$(SWIFT) bash scripts/gateway-example.sh

## demo: mock-apns with fresh TLS material on a free port, examples/jobs.jsonl through `fanout send`.
demo: deps-demo release
	@bash scripts/demo.sh

## soak: the long fault matrix (1,000,000+ notifications under mixed faults), with its reliability table.
soak: deps release
	@bash scripts/soak.sh

## fuzz: libFuzzer targets for the job-line parser, the APNs response parser, mock-apns's validator and the HTTP/1.1 request parser.
fuzz: deps-build
	@bash scripts/fuzz.sh

## sanitize: the test suite under ThreadSanitizer and AddressSanitizer (and the ThreadSanitizer canary); writes its
## result to docs/RELIABILITY.md.
sanitize: deps
	@bash scripts/sanitize.sh

## sanitize-core: what CI runs: ThreadSanitizer over the tests of the concurrent core (FanoutCore, the engine, the
## transport, the policies), and the canary that shows the run catches a race. SimulatedHourTests is left out: it
## is single-threaded (an hour of rate-limit decisions on one thread), so TSan has nothing to check in it, and it
## is the slowest of them under TSan by far.
TSAN_CORE_TESTS := FanoutCoreTests|FanoutTests\.|FanoutPolicyTests|FanoutTransportTests|FanoutIntegrationTests\.(EngineTests|ResultsThreadTests|CallDeadlineTests|LifecycleTests|PendingSendsTests|PolicyTests|BroadcastTests|APNsIDAssignmentTests|TypedSendTests|MetricsTests|FaultMatrixTests)/
sanitize-core: deps
	@SANITIZERS=thread SANITIZE_SKIP=SimulatedHourTests bash scripts/sanitize.sh '$(TSAN_CORE_TESTS)'

## lint: formatting (swift format), the module graph docs/ARCHITECTURE.md draws against Package.swift, the README's
## figures against docs/BENCHMARKS.md, every lock a FanoutMutex (scripts/check-locks.sh), a build of every target
## with warnings as errors, import Fanout's public API against its baseline (api/Fanout.txt), and its DocC
## reference (make docs, on the same build).
lint: deps-build
	$(SWIFT) format lint --strict --recursive Sources Tools Benchmarks Tests Fuzz Package.swift examples/gateway/Sources
	python3 scripts/module-graph.py
	python3 scripts/check-readme-figures.py
	bash scripts/check-locks.sh
	SWIFT=$(SWIFT) bash scripts/check-warnings.sh
	python3 scripts/api-baseline.py --build-dir .build/lint/debug
	SWIFT=$(SWIFT) bash scripts/docs.sh --build-dir .build/lint/debug

## api-baseline: record a deliberate change of import Fanout's public API in api/Fanout.txt (make lint checks it).
api-baseline: build
	python3 scripts/api-baseline.py --build-dir "$$($(SWIFT) build --show-bin-path)" --update

## docs: the DocC reference of import Fanout (Sources/Fanout/Fanout.docc and the doc comments) into
## .build/docs/Fanout.doccarchive, with the toolchain's swift-symbolgraph-extract and docc (no plugin); a broken
## symbol link fails it.
docs: deps-build
	@SWIFT=$(SWIFT) bash scripts/docs.sh

format:
	$(SWIFT) format --in-place --recursive Sources Tools Benchmarks Tests Fuzz Package.swift examples/gateway/Sources

clean:
	rm -rf .build $(DEMO_DIR)
