# condfs: see README.md. Every target works on a fresh machine after .ci/run's installs.
GO      ?= go
BIN     := bin/condfs
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# The tests that prove no stale authority survives a switch or a reload.
NOSTALE := TestContextFlips|TestViewBinaryStaleBind|TestRenameIntoRule|TestHeldFileReadersNeverSeeWritesAfterMoveIntoRule|TestSwitchDuringListings|TestRuledListingCached|TestCwdInHiddenDirectory|TestRevocation|TestHotReload|TestDirectoryHandleListsByCurrentContext|TestHandleRenamedUnderRuleIsRevoked|TestModelRandom|TestHiddenAbsenceCached|KeepsItsNameForItsCwd|LeavesItsCwdNowhere|TestCwdNameHolds|TestChangesRollbackIsInForceWhenItAnswers|TestStagedFileUnderHiddenPathGoesWithSwitch
# The integration packages (integration/*) run one at a time (-p 1): they
# share host state (/dev/fuse's mode, pids cgroups, network namespaces,
# fusermount3) and time their waits on a daemon that is not starved.
ITEST   := $(GO) test -race -count=1 -p 1

.PHONY: all build test test-unprivileged test-clients lint demo bench bench-clients fuzz clean

all: build

build:
	# The client without cgo (net and os/user in pure Go, so a static binary):
	# it starts for every run and hook call, and the dynamic loader and cgo's
	# start were a quarter of a run's cost (docs/performance.md).
	CGO_ENABLED=0 $(GO) build -o bin/ ./cmd/condfs
	$(GO) build -o bin/ ./cmd/condfsd

# The whole test suite. Integration tests need root and /dev/fuse; in CI
# (CI=true) they must run, elsewhere they skip with a reason.
test:
	# The unit packages one at a time, and beside them the integration
	# packages one at a time: the two processes of the single integration
	# package's days, whose build cache they share.
	$(GO) test -race -count=1 -p 1 -timeout 45m $$($(GO) list ./... | grep -v /integration/) & u=$$!; \
	$(ITEST) -timeout 45m ./integration/...; i=$$?; wait $$u; u=$$?; [ $$i = 0 ] && [ $$u = 0 ]
	# The model test on a fresh seed, for at most 40 s. -v prints the seed;
	# a failure says how to replay it, and the seed joins modelCases.
	CONDFS_MODEL_SEED=random CONDFS_MODEL_STEPS=3000 CONDFS_MODEL_TIME=40s $(ITEST) -v -run 'TestModelRandom$$' ./integration/views/
	# The no-stale tests again on the per-entry invalidation path that
	# kernels before 6.16 (no FUSE_NOTIFY_INC_EPOCH) use. (The model test
	# with seeds 1-3 only in these passes: its other fixed cases are
	# regressions that do not depend on the invalidation path.)
	CONDFS_MODEL_SEED=1,2,3 CONDFS_INVALIDATION=entries $(ITEST) -run '$(NOSTALE)' ./integration/...
	# And on a connection per session (a daemon that is not root, or
	# --connections=per-session), where the epoch is per view.
	CONDFS_MODEL_SEED=1,2,3 CONDFS_TEST_CONNECTIONS=per-session $(ITEST) -run '$(NOSTALE)' ./integration/...
	# A working directory's name on the per-entry path without
	# FUSE_EXPIRE_ONLY, as kernels before 6.2 invalidate.
	CONDFS_INVALIDATION=entries-drop $(ITEST) -run 'KeepsItsNameForItsCwd|LeavesItsCwdNowhere|TestCwdNameHolds|TestCwdInHiddenDirectory' ./integration/views/
	# The backing-change tests without the fanotify link watch, as a
	# daemon that is not root runs (a space with rules listed by the daemon every time).
	CONDFS_MODEL_SEED=1,2,3 CONDFS_TEST_NO_FANOTIFY=1 $(ITEST) -run 'TestListingCache|TestRuledListingCached|TestBackingChangesSeen|TestWalkWhileTreeChanges|TestModelRandom' ./integration/views/
	# The egress tests again on the netstack capture (a veth pair and
	# gVisor's stack), which runs where the kernel has no nftables NAT; the
	# HTTPS inspection tests too.
	CONDFS_TEST_EGRESS_CAPTURE=netstack $(ITEST) -timeout 30m -run 'Egress|TestInspect' ./integration/egress/

# The views' core must be testable without root: as root, run fsys's unit
# tests again as uid 65534 (a copy of the tree and of the module download
# cache it can read, no network), with /dev/fuse open to it for the time
# (as distributions ship it), so that it mounts views through fusermount3.
# UNPRIV_FLAGS=-cover reports the coverage without root.
test-unprivileged:
	@u=$$(mktemp -d /tmp/condfs-unpriv.XXXXXX) && chmod 755 $$u && \
	cp -r . $$u/repo && mkdir -p $$u/mod && cp -r $$($(GO) env GOMODCACHE)/cache $$u/mod/ && \
	chown -R 65534:65534 $$u && cd $$u/repo && \
	m=$$(stat -c %a /dev/fuse 2>/dev/null) && chmod 0666 /dev/fuse; \
	setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=$$u GOCACHE=$$u/cache GOMODCACHE=$$u/mod GOPROXY=off GOFLAGS= \
		CI="$$CI" PATH="$$PATH" $(GO) test -count=1 $(UNPRIV_FLAGS) ./fsys/ ; rc=$$?; [ -n "$$m" ] && chmod $$m /dev/fuse; rm -rf $$u; exit $$rc

# The client libraries' tests alone (make test runs them too): the schema
# against the daemon, and clients/python and clients/typescript against a
# real daemon (root; python3, node and npm).
test-clients:
	$(GO) test -count=1 -run 'TestControlSchema' ./daemon/
	$(GO) test -count=1 -v -run 'TestPythonClient|TestNodeClient|TestControlResultsMatchSchema' ./integration/daemon/

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: $$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	# The test environment is for tests and bench/ only: never in a binary.
	@if $(GO) list -deps ./cmd/... | grep -q internal/testenv; then echo "internal/testenv is in a binary's imports"; exit 1; fi

demo: build
	./examples/demo.sh $(BIN)

# Engine, socket and FUSE benchmarks; every figure has its baseline in the
# same run (see docs/performance.md). The FUSE ones need root.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./constraints/ ./acl/ ./daemon/
	cd bench && $(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./...

# One command from a runtime's own process: the Python client's
# session.run, condfs run and bubblewrap (root; bubblewrap installed).
bench-clients: build
	./bench/clients/bench.sh

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 60s -fuzzminimizetime 200x ./constraints/internal/expr/
	$(GO) test -run '^$$' -fuzz FuzzParsePolicy -fuzztime 60s ./constraints/
	$(GO) test -run '^$$' -fuzz FuzzParseConditions -fuzztime 60s ./acl/
	CI=true CONDFS_MODEL_SEED=random CONDFS_MODEL_STEPS=20000 $(GO) test -count=1 -v -run 'TestModelRandom$$' -timeout 30m ./integration/views/

clean:
	rm -rf bin
