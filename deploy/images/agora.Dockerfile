# Agora: the agora CLI (client verbs; agora dev is for one machine).
# Built by deploy/images/build.sh from a static binary (CGO_ENABLED=0) in a
# tiny build context. No CA certificates: scratch has none, and Agora talks
# only to NATS (add them from a base image if you enable TLS to public CAs).
FROM scratch
COPY agora /agora
# The sandbox launcher of `agora dev`'s worker (docs/sandbox.md).
COPY agora-sandbox /agora-sandbox
USER 65532:65532
ENTRYPOINT ["/agora"]
