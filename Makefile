# conch: common tasks. `make help` lists them.
CARGO ?= cargo
CLUSTER_DIR ?= $(CURDIR)/.cluster

PREVIOUS_RELEASE ?= 0.1.0

.PHONY: help build release dist dist-test dist-clean-test check test test-doc test-slow test-all nextest-installed test-deps test-unit test-upgrade upgrade-fixtures run cluster cluster-secure cluster-stop docs fmt lint bench bench-build bench-etcd jepsen sim proptest clean

help:
	@echo "make run           start a single-node conchd on 127.0.0.1:7001 (data in ./conch-data)"
	@echo "make cluster       start a local 3-node cluster on 127.0.0.1:7001-7003 in the background"
	@echo "make cluster-secure  the same with TLS, client certificates, peer mutual TLS and access control"
	@echo "make cluster-stop  stop the nodes started by make cluster(-secure)"
	@echo "make check         fmt, clippy (warnings are errors), unit and property tests: < 2 min after a one-line change"
	@echo "make test          CI's command: build, simulator seeds, every test but the slow tier: <= 15 min from a clean clone"
	@echo "make test-all      test + the doc tests + the slow tier (bug searches, long Jepsen runs, browser, etcd) + dist-test + dist-clean-test + test-upgrade + docs"
	@echo "make test-doc      the doc tests alone (the API examples of the crates' docs)"
	@echo "make test-slow     the slow tier alone"
	@echo "make bench         benchmarks W1-W5 against a 3-node cluster of the shipped (dist) conchd (BENCHMARKS.md)"
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

# The test tiers (README, Development; .config/nextest.toml says which test is in which):
# - check: the lint, unit tests and the state machine's property tests at a few cases each;
#   the loop after a change.
# - test: CI's and the README's command. Builds everything, runs the simulator's fixed seeds and
#   every unit, property and process-level test but the slow ones. The doc tests (about two
#   minutes, nearly all of it linking one test program per crate) run in test-all.
# - test-all: test, plus the doc tests, the slow tier (the simulator's bug searches, the long
#   Jepsen runs, the browser test, the etcd baseline), the release artifacts' check and the rolling upgrade from
#   the previous release. It must pass before a change that touches those is called done.
# A failing test's replay command is printed after the runner's summary.

# Property test cases per property in `make check` (`make test` runs 256, `make proptest` more).
CHECK_CASES ?= 32

check: lint nextest-installed
	PROPTEST_CASES=$(CHECK_CASES) $(NEXTEST) --workspace --lib --bins --no-fail-fast \
		|| { scripts/replay-failures.sh default; exit 1; }

# Process-level tests start the conchd/conch binaries, so build them first, and the clock tests
# preload libfaketime (test-deps installs it when missing).
# The simulator's fixed budget: seeds 1..=SIM_SEEDS (about two minutes on two cores).
SIM_SEEDS ?= 30
NEXTEST = $(CARGO) nextest run

test: test-deps nextest-installed
	$(CARGO) build --workspace --bins
	target/debug/conch-sim --seeds $(SIM_SEEDS) --first-seed 1 --jobs 2
	$(NEXTEST) --workspace --no-fail-fast || { scripts/replay-failures.sh default; exit 1; }

# The slow tier alone (`make test` does not run it).
test-slow: test-deps nextest-installed
	$(CARGO) build --workspace --bins
	$(NEXTEST) --workspace --profile slow --no-fail-fast || { scripts/replay-failures.sh slow; exit 1; }

# The examples in the crates' docs (the embedder's API among them) compile and run.
test-doc:
	$(CARGO) test --workspace --doc

test-all: test test-doc test-slow dist-test dist-clean-test test-upgrade docs

nextest-installed:
	@$(CARGO) nextest --version >/dev/null 2>&1 || { \
		echo "the tests run under cargo-nextest (one process per test): install it with" >&2; \
		echo "  cargo install cargo-nextest --locked   (or see https://nexte.st)" >&2; \
		exit 1; }

# A rolling upgrade from the previous release (RELEASES.toml), whose binaries are built from git
# once and cached under target/releases/: the upgrade test (node by node under load, a step
# back, finalize), then the Jepsen checker through an upgrade with faults on 3 and 5 nodes.
test-upgrade:
	$(CARGO) build --workspace --bins
	@bin=$$(scripts/release-binaries.sh $(PREVIOUS_RELEASE)) && \
	CONCH_PREVIOUS_CONCHD=$$bin/conchd $(NEXTEST) -p cluster-tests --test it \
		--ignore-default-filter -E 'test(/^upgrade::/) & test(previous_release)' && \
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

# The benchmarks measure the conchd users run: the one `make dist` ships, built in the dist
# profile (LTO) without the simulator's hooks (`tokio_unstable`, .cargo/config.toml), into
# target/dist/ as `make dist` builds it. conch-bench and the release conchd beside it (which
# `target/release/conch-bench` uses when CONCHD_BIN is not set) are the release build.
BENCH_CONCHD = target/dist/conchd

bench-build:
	$(CARGO) build --release -p conchd -p cluster-tests --bins
	CARGO_ENCODED_RUSTFLAGS= $(CARGO) build --profile dist -p conchd --bin conchd

bench: bench-build
	CONCHD_BIN=$(BENCH_CONCHD) target/release/conch-bench $(if $(TLS),--tls) $(if $(AUTH),--auth)

bench-etcd: bench-build
	@scripts/install-bench-deps.sh
	CONCHD_BIN=$(BENCH_CONCHD) target/release/conch-bench --baseline etcd $(if $(DURATION),--duration-s $(DURATION))

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
