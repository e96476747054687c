# Agora: the provisioning one-shot (deploy/provision). Runs as the NATS
# admin user, creates streams, consumers and buckets, and exits.
# Built by deploy/images/build.sh from a static binary (CGO_ENABLED=0).
FROM scratch
COPY provision /provision
USER 65532:65532
ENTRYPOINT ["/provision"]
