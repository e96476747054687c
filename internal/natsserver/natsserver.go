// Package natsserver runs an embedded NATS server with JetStream, for
// `agora dev` and for tests.
package natsserver

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Config says where the embedded server listens and stores data.
type Config struct {
	Host     string // default 127.0.0.1
	Port     int    // default 4222; -1 picks a free port
	StoreDir string // JetStream file store; required unless Memory
	Memory   bool   // keep JetStream data in memory only
	// MaxPayload raises the server's max message size (default 1 MB).
	MaxPayload int32
	// Logging turns on the server's own log lines.
	Logging bool
	// Token, when set, is required of every client (NATS token auth).
	Token string
	// StoreRestarted, when set, is called each time JetStream is
	// restarted after a store write error, once its filesystem had room
	// again (store.go).
	StoreRestarted func()
}

// Start starts the server and waits until it accepts connections. The
// caller owns it: call Shutdown and WaitForShutdown to stop it.
func Start(cfg Config) (*server.Server, error) {
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Port == 0 {
		cfg.Port = 4222
	}
	if cfg.StoreDir == "" && !cfg.Memory {
		return nil, errors.New("natsserver: StoreDir is required for a file store")
	}
	opts := &server.Options{
		ServerName:         "agora-embedded",
		Host:               cfg.Host,
		Port:               cfg.Port,
		JetStream:          true,
		StoreDir:           cfg.StoreDir,
		NoLog:              !cfg.Logging,
		NoSigs:             true,
		MaxPayload:         cfg.MaxPayload,
		JetStreamMaxMemory: -1,
		JetStreamMaxStore:  -1,
	}
	if cfg.Memory {
		opts.JetStreamMaxStore = 0
		if opts.StoreDir == "" {
			opts.StoreDir = "" // memory-only streams still need no dir
		}
	}
	opts.Authorization = cfg.Token
	// A port already taken is reported at once, not after the readiness
	// wait below.
	if cfg.Port > 0 {
		addr := net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("natsserver: %s is not free: %w", addr, err)
		}
		ln.Close()
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsserver: %w", err)
	}
	failed := new(atomic.Bool)
	var next server.Logger = quiet{}
	if cfg.Logging {
		s.ConfigureLogger()
		next = s.Logger()
	}
	s.SetLogger(&watchLogger{Logger: next, failed: failed}, false, false)
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("natsserver: not ready on %s within 10s (is the port %s in use?)",
			net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)), strconv.Itoa(cfg.Port))
	}
	if !cfg.Memory {
		// The configuration JetStream starts with (the server's own
		// restart after a reload makes the same).
		jsc := server.JetStreamConfig{StoreDir: opts.StoreDir, MaxStore: opts.JetStreamMaxStore, MaxMemory: opts.JetStreamMaxMemory,
			SyncInterval: opts.SyncInterval, SyncAlways: opts.SyncAlways, Strict: !opts.NoJetStreamStrict}
		go recoverStore(s, failed, cfg.StoreDir, jsc, cfg.StoreRestarted)
	}
	return s, nil
}
