#!/bin/sh
# Build Agora's container images from static binaries (issue 8).
#
#   deploy/images/build.sh [TAG]      # default tag: dev
#
# Each image gets a tiny build context (the binary and little else), so
# the classic builder sends kilobytes, not the repository. Images are FROM
# scratch: nothing is pulled. worker-claude.Dockerfile is not built here.
set -eu

tag=${1:-dev}
repo=${AGORA_IMAGE_REPO:-agora}
root=$(cd "$(dirname "$0")/../.." && pwd)
images="$root/deploy/images"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

export CGO_ENABLED=0
cd "$root"

build() { # name package
	mkdir -p "$work/$1"
	go build -trimpath -ldflags='-s -w' -o "$work/$1/$1" "$2"
}

build dispatcher ./services/dispatcher/cmd/dispatcher
build worker ./services/worker/cmd/worker
go build -trimpath -ldflags='-s -w' -o "$work/worker/agora-sandbox" ./cmd/agora-sandbox
build router ./services/router/cmd/router
build inbox ./answerers/inbox/cmd/inbox
build agora ./cmd/agora
cp "$work/worker/agora-sandbox" "$work/agora/agora-sandbox"
build sqldb-answerer ./answerers/sqldb/cmd/sqldb-answerer
build agent-answerer ./answerers/agent/cmd/agent-answerer
build provision ./deploy/provision
build nats-server github.com/nats-io/nats-server/v2

mkdir -p "$work/worker/workspace" "$work/nats-server/data" "$work/nats-server/nats"
cp deploy/nats/agora.conf deploy/nats/cluster.conf deploy/nats/local.conf deploy/nats/permissions.conf "$work/nats-server/nats/"

for name in dispatcher worker router inbox agora sqldb-answerer agent-answerer provision nats-server; do
	echo "==> $repo/$name:$tag"
	docker build -q -f "$images/$name.Dockerfile" -t "$repo/$name:$tag" "$work/$name"
done
