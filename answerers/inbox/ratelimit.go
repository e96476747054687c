package inbox

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Failed sign-ins are limited per name and per client address
// (docs/inbox.md): after Config.LoginAttempts failures for one name, or
// four times as many from one address, within Config.LoginWindow, further
// attempts are refused without checking the password until the window
// ends. A success clears its name's count. The counts are this replica's.

// failures counts failed sign-ins per key in fixed windows.
type failures struct {
	max    int
	window time.Duration

	mu sync.Mutex
	m  map[string]*failWindow
}

type failWindow struct {
	n     int
	start time.Time
}

func newFailures(max int, window time.Duration) *failures {
	return &failures{max: max, window: window, m: map[string]*failWindow{}}
}

// blocked reports how long key must wait, if it has used up its failures.
func (f *failures) blocked(key string, now time.Time) (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.m[key]
	if !ok {
		return 0, false
	}
	if end := w.start.Add(f.window); !now.Before(end) {
		delete(f.m, key)
		return 0, false
	} else if w.n >= f.max {
		return end.Sub(now), true
	}
	return 0, false
}

// fail counts one failure of key.
func (f *failures) fail(key string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.m) > 100_000 { // forget finished windows before growing further
		for k, w := range f.m {
			if !now.Before(w.start.Add(f.window)) {
				delete(f.m, k)
			}
		}
	}
	w, ok := f.m[key]
	if !ok || !now.Before(w.start.Add(f.window)) {
		w = &failWindow{start: now}
		f.m[key] = w
	}
	w.n++
}

// clear forgets key's failures.
func (f *failures) clear(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, key)
}

// limiter is the sign-in limit: one count per name, one per address.
type limiter struct {
	names, addrs *failures
	trustProxy   bool
}

func newLimiter(attempts int, window time.Duration, trustProxy bool) *limiter {
	return &limiter{names: newFailures(attempts, window), addrs: newFailures(4*attempts, window), trustProxy: trustProxy}
}

// clientAddr is the address a request came from: the connection's, or,
// behind a trusted proxy, the last address it added to X-Forwarded-For.
func (l *limiter) clientAddr(r *http.Request) string {
	if l.trustProxy {
		if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
			parts := strings.Split(xff[len(xff)-1], ",")
			if a := strings.TrimSpace(parts[len(parts)-1]); a != "" {
				return a
			}
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// check says whether a sign-in as name from r may be tried now; when not,
// why, and how long to wait.
func (l *limiter) check(r *http.Request, name string, now time.Time) (wait time.Duration, why string, ok bool) {
	if d, blocked := l.addrs.blocked(l.clientAddr(r), now); blocked {
		return d, "Too many failed sign-ins from your address.", false
	}
	if name != "" {
		if d, blocked := l.names.blocked(name, now); blocked {
			return d, "Too many failed sign-ins for this name.", false
		}
	}
	return 0, "", true
}

// result records the outcome of a sign-in attempt.
func (l *limiter) result(r *http.Request, name string, ok bool, now time.Time) {
	if ok {
		if name != "" {
			l.names.clear(name)
		}
		return
	}
	l.addrs.fail(l.clientAddr(r), now)
	if name != "" {
		l.names.fail(name, now)
	}
}

// waitText says how long to wait, for people.
func waitText(d time.Duration) string {
	switch m := int((d + time.Minute - 1) / time.Minute); {
	case d < time.Minute:
		return "Try again in a minute."
	case m == 1:
		return "Try again in 1 minute."
	default:
		return "Try again in " + strconv.Itoa(m) + " minutes."
	}
}
