# nats-server built from the Go module in go.mod (CGO_ENABLED=0), with
# Agora's configuration in /etc/nats. Default: one node (agora.conf); the
# cluster runs it with `-c /etc/nats/cluster.conf` and NATS_SERVER_NAME set.
# Passwords come from NATS_PASS_* variables (see deploy/nats/agora.conf).
FROM scratch
COPY nats-server /nats-server
COPY nats/ /etc/nats/
COPY --chown=65532:65532 data /data
USER 65532:65532
EXPOSE 4222 6222 8222
ENTRYPOINT ["/nats-server"]
CMD ["-c", "/etc/nats/agora.conf"]
