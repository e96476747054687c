// Package crashpoint kills this process at a named point of the message
// path when the environment asks it to: the chaos audit's way to crash a
// service exactly inside a window between two writes, where a kill from
// outside lands only by chance (docs/chaos.md, "Crash points").
//
// AGORA_CRASH_POINTS lists points with the probability of a kill at each
// pass, comma separated: "worker.pickup:0.05,dispatcher.accepted:0.05".
// Unset — every deployment — Here returns at once. A point that is hit
// writes "agora crash point: <name>" to stderr and sends the process
// SIGKILL: nothing deferred runs, as in a real crash.
package crashpoint

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// The points the services pass.
const (
	// DispatcherAccepted is passed once a dispatch's accepted event is
	// stored and before its work message is published.
	DispatcherAccepted = "dispatcher.accepted"
	// WorkerPickup is passed once a worker has decoded a delivery and
	// before it learns the fence or publishes `started`.
	WorkerPickup = "worker.pickup"
	// RouterJoined is passed once a joined question's record is written
	// and before its thread is listed on the question it joined.
	RouterJoined = "router.joined"
)

// Names lists every point.
var Names = []string{DispatcherAccepted, WorkerPickup, RouterJoined}

// Env is the variable that arms points.
const Env = "AGORA_CRASH_POINTS"

// Parse reads a value of Env: name:probability pairs, comma separated,
// every name one of Names and every probability in (0, 1].
func Parse(s string) (map[string]float64, error) {
	out := map[string]float64{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, p, ok := strings.Cut(item, ":")
		if !ok {
			return nil, fmt.Errorf("%s: %q: want name:probability, e.g. %s:0.05", Env, item, WorkerPickup)
		}
		if !slices.Contains(Names, name) {
			return nil, fmt.Errorf("%s: unknown point %q: the points are %s", Env, name, strings.Join(Names, ", "))
		}
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f <= 0 || f > 1 {
			return nil, fmt.Errorf("%s: %s: probability %q: want a number in (0, 1]", Env, name, p)
		}
		out[name] = f
	}
	return out, nil
}

var armed = sync.OnceValue(func() map[string]float64 {
	v := os.Getenv(Env)
	if v == "" {
		return nil
	}
	m, err := Parse(v)
	if err != nil {
		// A test hook set wrong must not pass unnoticed as a run
		// without crashes: the process stops here, saying why.
		fmt.Fprintln(os.Stderr, "agora:", err)
		os.Exit(2)
	}
	return m
})

// Check reports an invalid Env, for a service to refuse to start with.
func Check() error {
	if v := os.Getenv(Env); v != "" {
		_, err := Parse(v)
		return err
	}
	return nil
}

// Here kills the process with the probability Env gives name.
func Here(name string) {
	p, ok := armed()[name]
	if !ok || rand.Float64() >= p {
		return
	}
	fmt.Fprintln(os.Stderr, "agora crash point:", name)
	self, err := os.FindProcess(os.Getpid())
	if err == nil {
		_ = self.Kill()
	}
	select {} // the signal is on its way
}
