# Agora's front door. Each target is a thin wrapper: the raw command is
# visible here.
GO      ?= go
BIN     ?= bin
PKGS    ?= ./...

.PHONY: run test bench chaos lint images build fuzz clean

## run: start everything on an embedded NATS server (agora dev)
run:
	@test -x $(BIN)/agora || echo "make run: building agora and its sandbox launcher into $(BIN)/ — the first build downloads and compiles every dependency (a few minutes on a fresh machine); later builds take seconds"
	$(GO) build -o $(BIN)/ ./cmd/agora ./cmd/agora-sandbox
	$(BIN)/agora dev

## test: the whole test suite against real in-process JetStream servers
test:
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

## bench: Agora against a raw JetStream baseline, measured in the same run
bench:
	$(GO) build -o $(BIN)/ ./cmd/agora ./cmd/agora-sandbox
	$(BIN)/agora bench

## chaos: the chaos audit, full form (kills, pauses, restarts; then audits the streams)
chaos:
	$(GO) build -o $(BIN)/ ./cmd/agora ./cmd/agora-sandbox
	$(BIN)/agora chaos

## lint: formatting, vet, and go.mod/go.sum kept tidy
lint:
	test -z "$$(gofmt -l .)" || (gofmt -l . && exit 1)
	$(GO) vet $(PKGS)
	$(GO) mod tidy -diff

## build: static binaries into ./bin
build:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/agora ./cmd/agora-sandbox ./services/worker/cmd/worker ./services/dispatcher/cmd/dispatcher ./services/router/cmd/router ./answerers/agent/cmd/agent-answerer ./answerers/sqldb/cmd/sqldb-answerer ./answerers/inbox/cmd/inbox ./answerers/slack/cmd/slack-answerer ./answerers/webhook/cmd/webhook-answerer ./deploy/provision

## images: container images FROM scratch with static binaries (deploy/images)
images:
	deploy/images/build.sh $(or $(TAG),dev)

## fuzz: a short fuzzing pass over the sentinel parser
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzParse -fuzztime=30s ./pkg/sentinel

clean:
	rm -rf $(BIN)
