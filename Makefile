# conch: common tasks. `make help` lists them.
CARGO ?= cargo
CLUSTER_DIR ?= $(CURDIR)/.cluster

PREVIOUS_RELEASE ?= 0.1.0

.PHONY: help build release dist dist-test dist-clean-test test test-deps test-unit test-upgrade upgrade-fixtures run cluster cluster-secure cluster-stop docs fmt lint bench bench-etcd jepsen sim proptest clean

help:
	@echo "make run           start a single-node conchd on 127.0.0.1:7001 (data in ./conch-data)"
	@echo "make cluster       start a local 3-node cluster on 127.0.0.1:7001-7003 in the background"
	@echo "make cluster-secure  the same with TLS, client certificates, peer mutual TLS and access control"
	@echo "make cluster-stop  stop the nodes started by make cluster(-secure)"
	@echo "make test          build everything and run every test (unit, property, process-level)"
	@echo "make bench         benchmarks W1-W5 against a 3-node release cluster (BENCHMARKS.md)"
	@echo "make jepsen DURATION=60 NODES=3   fault injection soak with the safety checker"
	@echo "make sim SEEDS=500 NODES=3        deterministic simulation: seeds of faults, each replayable"
	@echo "make bench TLS=1 / make jepsen TLS=1   the same with TLS + peer mutual TLS"
	@echo "make bench-etcd    W1, W1b, W2, W3 on etcd and on conch in the same run, both client placements, ratios"
	@echo "make proptest CASES=5000           longer property runs of the state machine"
	@echo "make test-upgrade  a rolling upgrade from the previous release (built from git) under load and under the Jepsen checker"
	@echo "make upgrade-fixtures  rewrite cluster-tests/fixtures/$(PREVIOUS_RELEASE) from that release's binaries"
	@echo "make dist          release tarballs, debug info, .deb and SHA256SUMS in target/artifacts"
	@echo "make dist-test     build the artifacts from the dev build and check them (PROFILE=dist: the real one)"
	@echo "make docs          the book (docs/) into target/book, after checking its CLI reference and links"
	@echo "make dist-clean-test  make dist from a clean clone of HEAD (slow: builds everything from nothing)"
	@echo "make build|release|fmt|lint"

build:
	$(CARGO) build --workspace --all-targets

release:
	$(CARGO) build --workspace --release --bins

# Release artifacts (packaging/dist.sh): the binaries in the dist profile (LTO), stripped, with
# their debug info in a separate tarball; man pages, completions, the systemd unit and example
# config; the Debian package. PROFILE=… and OUT=… override the profile and output directory.
dist:
	@packaging/dist.sh

# The same artifacts from the dev build (PROFILE=dist for the real one), checked: file lists,
# checksums, versions, man pages, the .deb's control data and an install into a scratch root.
dist-test:
	@packaging/dist-test.sh

# `make dist` from a clean clone of HEAD in a target directory of its own (slow tier): the
# release command builds on its own, without the features a workspace build would unify.
dist-clean-test:
	@packaging/dist-clean-test.sh

# Process-level tests start the conchd/conch binaries, so build them first, and the clock tests
# preload libfaketime (test-deps installs it when missing).
# Doc tests and the release artifacts' check first, so the test runner's summary is the last
# thing printed.
# The simulator's fixed budget: seeds 1..=SIM_SEEDS (about two minutes on two cores).
SIM_SEEDS ?= 30

test: test-deps
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace --doc
	@packaging/dist-test.sh
	target/debug/conch-sim --seeds $(SIM_SEEDS) --first-seed 1 --jobs 2
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
		$(CARGO) nextest run --workspace --no-fail-fast; \
	else \
		$(CARGO) test --workspace --no-fail-fast; \
	fi

# A rolling upgrade from the previous release (RELEASES.toml), whose binaries are built from git
# once and cached under target/releases/: the upgrade test (node by node under load, a step
# back, finalize), then the Jepsen checker through an upgrade with faults on 3 and 5 nodes.
test-upgrade:
	$(CARGO) build --workspace --bins
	@bin=$$(scripts/release-binaries.sh $(PREVIOUS_RELEASE)) && \
	CONCH_PREVIOUS_CONCHD=$$bin/conchd $(CARGO) nextest run -p cluster-tests --test upgrade \
		--ignore-default-filter -E 'test(previous_release)' && \
	target/debug/conch-jepsen --duration 40 --nodes 3 --upgrade-from $$bin/conchd && \
	target/debug/conch-jepsen --duration 40 --nodes 5 --upgrade-from $$bin/conchd

# The data directories and backup of the previous release that `make test` opens.
upgrade-fixtures:
	@scripts/upgrade-fixtures.sh $(PREVIOUS_RELEASE)

test-deps:
	@scripts/install-test-deps.sh
	@scripts/install-bench-deps.sh

test-unit:
	$(CARGO) test --workspace --lib

run:
	$(CARGO) run --release -p conchd --bin conchd

cluster: release
	@scripts/cluster.sh start "$(CLUSTER_DIR)"

cluster-secure: release
	@scripts/cluster.sh start-secure "$(CLUSTER_DIR)"

cluster-stop:
	@scripts/cluster.sh stop "$(CLUSTER_DIR)"

# The book: docs/src, built by mdBook into target/book. mdbook from the PATH, or this pinned
# version installed from crates.io into target/tools the first time. The generated CLI
# reference and the links are checked first (the same checks run in `make test`, without mdBook).
MDBOOK_VERSION ?= 0.5.4

docs:
	$(CARGO) run -q -p xtask -- cli-docs --check
	$(CARGO) run -q -p xtask -- doc-links
	@mdbook=$$(command -v mdbook || echo target/tools/bin/mdbook); \
	if [ ! -x "$$mdbook" ]; then \
		echo "docs: installing mdbook $(MDBOOK_VERSION) into target/tools"; \
		$(CARGO) install mdbook --locked --version $(MDBOOK_VERSION) \
			--no-default-features --features search --root target/tools || exit 1; \
	fi; \
	"$$mdbook" build docs && echo "docs: the book is in target/book/index.html"

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

bench:
	$(CARGO) build --release -p conchd -p cluster-tests --bins
	target/release/conch-bench $(if $(TLS),--tls) $(if $(AUTH),--auth)

bench-etcd:
	@scripts/install-bench-deps.sh
	$(CARGO) build --release -p conchd -p cluster-tests --bins
	target/release/conch-bench --baseline etcd $(if $(DURATION),--duration-s $(DURATION))

jepsen:
	$(CARGO) build -p conchd -p conch-client -p cluster-tests --bins
	target/debug/conch-jepsen --duration $(or $(DURATION),60) --nodes $(or $(NODES),3) $(if $(TLS),--tls) $(if $(AUTH),--auth)

# The deterministic simulation in a release build: SEEDS seeds from a random first one (printed;
# FIRST=… repeats a run), or TIME=10m for as many as fit. A failing seed prints its replay command.
sim:
	$(CARGO) build --release -p conch-sim
	target/release/conch-sim $(if $(TIME),--time-budget $(TIME),--seeds $(or $(SEEDS),200)) --nodes $(or $(NODES),3) $(if $(FIRST),--first-seed $(FIRST))

# Longer property runs of the state machine: random command histories, invalid input included.
proptest:
	PROPTEST_CASES=$(or $(CASES),5000) $(CARGO) test --release -p conchd --lib state::proptests

clean:
	$(CARGO) clean
