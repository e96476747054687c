package natsserver

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/sys/unix"
)

// When the store's filesystem fills up, a file store keeps its write error
// for good: the stream it failed on takes no message again until
// JetStream reloads it, even once space returns (docs/chaos.md, "A full
// store"). The embedded server watches its own log for that error and,
// once the store's filesystem has StoreRoom free again, restarts
// JetStream, which reloads every stream and consumer from disk: what was
// stored stays, and the services, which retry, go on.

// StoreRoom is the free space the store's filesystem must have again
// before JetStream is restarted after a write error.
const StoreRoom = 64 << 20

// storeCheckEvery is how often a store that failed a write is checked
// for room.
const storeCheckEvery = time.Second

// watchLogger passes the server's log lines on and notes a store write
// error.
type watchLogger struct {
	server.Logger
	failed *atomic.Bool
}

func (l *watchLogger) Errorf(f string, v ...any) {
	if strings.Contains(f, "write error") || strings.Contains(f, "failed to store") {
		l.failed.Store(true)
	}
	l.Logger.Errorf(f, v...)
}

// quiet is the logger of a server started without Logging.
type quiet struct{}

func (quiet) Noticef(string, ...any) {}
func (quiet) Warnf(string, ...any)   {}
func (quiet) Fatalf(string, ...any)  {}
func (quiet) Errorf(string, ...any)  {}
func (quiet) Debugf(string, ...any)  {}
func (quiet) Tracef(string, ...any)  {}

// recoverStore restarts JetStream on s whenever a store write failed and
// dir's filesystem has StoreRoom free, until s shuts down. jsc is the
// configuration JetStream started with; restarted, when set, is told of
// each restart.
func recoverStore(s *server.Server, failed *atomic.Bool, dir string, jsc server.JetStreamConfig, restarted func()) {
	// Every restart keeps the store's size as JetStream took it at its
	// start. Measured again at a restart, it would be three quarters of
	// what is free at that moment (more may be filling again), and every
	// write past it would be refused as insufficient resources — no write
	// error, so no restart would ever mend it.
	if cur := s.JetStreamConfig(); jsc.MaxStore <= 0 && cur != nil && cur.MaxStore > 0 {
		jsc.MaxStore = cur.MaxStore
	}
	tick := time.NewTicker(storeCheckEvery)
	defer tick.Stop()
	for range tick.C {
		if !s.Running() {
			return
		}
		if !failed.Load() || free(dir) < StoreRoom {
			continue
		}
		failed.Store(false)
		s.Warnf("JetStream store at %s has room again after a write error: restarting JetStream", dir)
		if s.JetStreamEnabled() {
			if err := s.ShutdownJetStream(); err != nil {
				s.Errorf("JetStream store recovery: shutdown: %v", err)
			}
		}
		cfg := jsc
		if err := s.EnableJetStream(&cfg); err != nil {
			s.Errorf("JetStream store recovery: restart: %v", err)
			failed.Store(true) // try again on the next tick
			continue
		}
		if restarted != nil {
			restarted()
		}
	}
}

// free is the space free to unprivileged writers on dir's filesystem.
func free(dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0
	}
	return int64(st.Bavail) * int64(st.Bsize) // Bsize is int64 on Linux, uint32 on the BSDs
}
