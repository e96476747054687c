# Agora: the worker. FROM scratch it can run only sub-agents whose command is itself a static binary copied into a derived image; for claude-code or shell sub-agents use worker-claude.Dockerfile.
# Built by deploy/images/build.sh from a static binary (CGO_ENABLED=0) in a
# tiny build context. No CA certificates: scratch has none, and Agora talks
# only to NATS (add them from a base image if you enable TLS to public CAs).
FROM scratch
COPY worker /worker
# The sandbox launcher every sub-agent starts through (docs/sandbox.md).
COPY agora-sandbox /agora-sandbox
# One workspace per dispatch under /workspace (the scratch image has no /tmp).
COPY --chown=65532:65532 workspace /workspace
ENV AGORA_WORKSPACE_ROOT=/workspace
USER 65532:65532
ENTRYPOINT ["/worker"]
