# A worker image for real use: a shell, git and the claude CLI next to the
# static worker binary. Documented only, not built in CI: it needs a base
# image and npm from the network, which our build machines do not have.
#
# Build it where a registry is reachable:
#   make build   # or: CGO_ENABLED=0 go build -o bin/ ./services/worker/cmd/worker ./cmd/agora-sandbox
#   docker build -f deploy/images/worker-claude.Dockerfile -t agora/worker-claude:dev bin/
# Run it with ANTHROPIC_API_KEY in the environment and the sub-agent
# definition allowing it (env_allow: [ANTHROPIC_API_KEY]).
FROM node:22-bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates git \
 && rm -rf /var/lib/apt/lists/* \
 && npm install -g @anthropic-ai/claude-code \
 && useradd --create-home --uid 10001 agora \
 && mkdir /workspace && chown agora:agora /workspace
COPY worker /usr/local/bin/worker
COPY agora-sandbox /usr/local/bin/agora-sandbox
USER agora
ENV AGORA_WORKSPACE_ROOT=/workspace \
    AGORA_WORKER_CLAUDE_BIN=claude
ENTRYPOINT ["/usr/local/bin/worker"]
