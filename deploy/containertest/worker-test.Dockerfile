# The worker image of the container tests: deploy/images/worker.Dockerfile
# plus static sub-agents — the agora binary (its hidden demo-agent verb) and
# testagent (sleeps; scratch has no sleep). Built by the tests from a tiny
# context (the three binaries and an empty workspace directory).
FROM scratch
COPY worker /worker
COPY agora /agora
COPY agora-sandbox /agora-sandbox
COPY testagent /testagent
COPY --chown=65532:65532 workspace /workspace
ENV AGORA_WORKSPACE_ROOT=/workspace
USER 65532:65532
ENTRYPOINT ["/worker"]
