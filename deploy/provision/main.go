// Command provision is the one-shot that creates Agora's streams,
// consumers, buckets and object store (internal/provision) on a cluster,
// with a replica count, and exits. Compose runs it as `init` and Kubernetes
// as a Job before the services start. It connects as the NATS admin user:
// no service user may create streams.
//
// Settings: AGORA_NATS_URL, AGORA_NATS_CREDS, AGORA_PROVISION_REPLICAS
// (default 1). It is a binary of its own, not an `agora` verb, so that the
// provisioning job's image holds nothing but what creates the streams;
// deploy/README.md shows how compose and Kubernetes run it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/provision"
)

// Config is read from AGORA_* variables.
type Config struct {
	NATSURL   string `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222"`
	NATSCreds string `envconfig:"NATS_CREDS"`
	// Replicas of every stream, bucket and consumer (1 to 5).
	Replicas int `envconfig:"PROVISION_REPLICAS" default:"1"`
	// Timeout bounds the whole run, including waiting for the cluster.
	Timeout time.Duration `envconfig:"PROVISION_TIMEOUT" default:"2m"`
	// Retention is how long finished work stays readable (the streams'
	// limits follow it; docs/storage.md, "Retention").
	Retention time.Duration `envconfig:"RETENTION" default:"168h"`
	// StreamMaxBytes bounds each history stream; -1: unlimited.
	StreamMaxBytes int64 `envconfig:"STREAM_MAX_BYTES" default:"-1"`
	// AuditMaxAge is how long the decision log is kept (docs/audit.md);
	// empty: 180 days, or the retention when longer.
	AuditMaxAge time.Duration `envconfig:"AUDIT_MAX_AGE"`
}

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log, lerr := logging.New(os.Stderr)
	if lerr != nil {
		fmt.Fprintln(os.Stderr, "provision:", lerr)
		return 1
	}
	var cfg Config
	if err := config.Load(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, "provision:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	opts := []nats.Option{nats.Name("agora-provision"), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1)}
	if cfg.NATSCreds != "" {
		opts = append(opts, nats.UserCredentials(cfg.NATSCreds))
	}
	nc, err := nats.Connect(cfg.NATSURL, opts...)
	if err != nil {
		log.Error("connect failed", "err", err)
		return 1
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Error("jetstream failed", "err", err)
		return 1
	}
	pc := provision.Config{Replicas: cfg.Replicas, Retention: cfg.Retention, MaxBytes: cfg.StreamMaxBytes,
		AuditMaxAge: cfg.AuditMaxAge, Changed: func(what string) { log.Info("provisioned: " + what) }}
	// A cluster that is still electing its meta leader refuses requests:
	// retry until the deadline.
	// Each attempt gets its own short deadline: a request sent before the
	// meta leader exists may never be answered.
	for {
		actx, acancel := context.WithTimeout(ctx, 15*time.Second)
		err = provision.Ensure(actx, js, pc)
		acancel()
		if err == nil {
			log.Info("provisioned", "replicas", cfg.Replicas)
			return 0
		}
		log.Warn("provisioning failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			log.Error("provisioning gave up", "err", err)
			return 1
		case <-time.After(2 * time.Second):
		}
	}
}
