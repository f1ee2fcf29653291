# condfs: see README.md. Every target works on a fresh machine after .ci/run's installs.
GO      ?= go
BIN     := bin/condfs
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all build test lint demo bench fuzz clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/condfs

# The whole test suite. Integration tests need root and /dev/fuse; in CI
# (CI=true) they must run, elsewhere they skip with a reason.
test:
	$(GO) test -race -count=1 ./...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: $$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

demo: build
	./examples/demo.sh $(BIN)

# Engine, socket and FUSE benchmarks; every figure has its baseline in the
# same run (see docs/performance.md). The FUSE ones need root.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./constraints/ ./acl/ ./daemon/
	cd bench && $(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./...

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 60s -fuzzminimizetime 200x ./constraints/internal/expr/
	$(GO) test -run '^$$' -fuzz FuzzParsePolicy -fuzztime 60s ./constraints/
	$(GO) test -run '^$$' -fuzz FuzzParseConditions -fuzztime 60s ./acl/
	CI=true CONDFS_MODEL_STEPS=20000 $(GO) test -count=1 -run TestModelRandom -timeout 30m ./integration/

clean:
	rm -rf bin
