// Package chaos is Agora's chaos audit (`agora chaos`, docs/chaos.md): a
// bounded soak that runs the dispatcher, the router, several workers and
// the A2A and MCP doors as separate processes on its own embedded
// JetStream, dispatches threads (some through each door)
// whose sub-agent sleeps, sometimes asks and sometimes leaves a daemon
// behind, answers every question with one to three concurrent answers,
// and meanwhile kills, pauses and restarts the processes. Then it audits
// the streams themselves and reports every anomaly.
package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/chain"
	"github.com/agora-dispatch/agora/internal/crashpoint"
	"github.com/agora-dispatch/agora/internal/natsserver"
	"github.com/agora-dispatch/agora/internal/proclist"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/stack"
)

// Config sizes a run. The zero value is the full form.
type Config struct {
	Threads    int           // threads dispatched (default 200)
	Workers    int           // worker processes (default 3)
	FaultEvery time.Duration // time between faults (default 2s)
	// FaultWindow is how long faults go on once every thread is
	// dispatched (default 30s); then the system must settle every thread.
	FaultWindow time.Duration
	Deadline    time.Duration // the whole run's bound (default 10m, or Soak plus 10m)
	// Soak, when set, keeps dispatching threads (one every Pace) and
	// injecting faults for this long, instead of dispatching Threads;
	// then faults go on for FaultWindow and every thread must end.
	Soak time.Duration
	// Pace is the time between two dispatches (default 20ms; 250ms in a
	// soak).
	Pace time.Duration
	// LongRun is how long one run in ten works before it ends (default
	// 6s): longer than every housekeeping interval of the soak's services
	// (docs/chaos.md, "Housekeeping"), so sweeps, the reconciler and the
	// router's scans cross live runs.
	LongRun time.Duration
	// Exe is the agora binary that runs the services (`agora service …`);
	// default the running executable.
	Exe string
}

func (c Config) withDefaults() Config {
	if c.Threads == 0 {
		c.Threads = 200
	}
	if c.Workers == 0 {
		c.Workers = 3
	}
	if c.FaultEvery == 0 {
		c.FaultEvery = 2 * time.Second
	}
	if c.FaultWindow == 0 {
		c.FaultWindow = 30 * time.Second
	}
	if c.Deadline == 0 {
		c.Deadline = c.Soak + 10*time.Minute
	}
	if c.Pace == 0 {
		c.Pace = 20 * time.Millisecond
		if c.Soak > 0 {
			c.Pace = 250 * time.Millisecond
		}
	}
	if c.LongRun == 0 {
		c.LongRun = 6 * time.Second
	}
	if c.Exe == "" {
		c.Exe, _ = os.Executable()
	}
	return c
}

// Report is what the audit found.
type Report struct {
	Threads    int `json:"threads"`
	Dispatches int `json:"dispatches"`
	Questions  int `json:"questions"`
	Answers    int `json:"answers_sent"`
	// AnswerErrors counts the answerer's failed listings of the asked
	// questions and its answers refused or not delivered, by error text
	// (clipped), those through a door by door and status: a soak whose
	// questions went unanswered says why.
	AnswerErrors map[string]int `json:"answer_errors,omitempty"`
	// ThreadsByDoor and AnswersByDoor count the threads dispatched and
	// the answers sent through each door (docs/chaos.md, "The doors"):
	// api (pkg/client and the router's answer API), a2a, mcp.
	ThreadsByDoor map[string]int `json:"threads_by_door"`
	AnswersByDoor map[string]int `json:"answers_by_door"`
	// DoorEnds counts the threads whose end their door reported as
	// completed with the thread's output.
	DoorEnds int `json:"door_ends_checked"`
	// DoorErrors counts the doors' failed dispatches and reads of a
	// task's end, by door and status.
	DoorErrors map[string]int `json:"door_errors,omitempty"`
	Events     int            `json:"events_audited"`
	Faults     map[string]int `json:"faults"`
	// Ask once (docs/router.md, "Ask once"): questions that joined one already
	// waiting, the groups they made (an asked question with threads
	// joined) and each group's size in threads, largest first; resumes is
	// how many re-dispatches the audit matched to an answered question.
	Coalesced  int   `json:"coalesced_questions"`
	Groups     int   `json:"coalesced_groups"`
	GroupSizes []int `json:"group_sizes"`
	// DedupeGroups are the groups whose questions' texts differ: joined by
	// their dedupe_key.
	DedupeGroups int `json:"dedupe_key_groups"`
	Resumes      int `json:"resumes_checked"`
	// Ends counts the dispatches' terminal events by kind and reason,
	// most first: what happened, whether or not it is an anomaly.
	Ends []End `json:"ends"`
	// WorkspacesSwept counts the workspaces left by workers the soak
	// killed that the soak's own sweep removed once every worker had
	// ended.
	WorkspacesSwept int      `json:"workspaces_swept"`
	Anomalies       []string `json:"anomalies"`
	DurationSec     float64  `json:"duration_s"`
}

// End is how many dispatches ended one way: a kind and, for failed, its
// reason (for cancelled, the reason the cancel gave).
type End struct {
	Kind   lifecycle.Kind `json:"kind"`
	Reason string         `json:"reason,omitempty"`
	Count  int            `json:"count"`
}

// OK reports whether the audit found nothing wrong.
func (r Report) OK() bool { return len(r.Anomalies) == 0 }

const ackWait = 2 * time.Second

// workspacesGo bounds the sweeps of the workspace root after the soak: a
// workspace goes once the launcher holding its lock has died with its
// worker.
const workspacesGo = 10 * time.Second

// maxFollowers bounds the threads followed at once (each is a consumer on
// the lifecycle stream): a soak dispatches thousands.
const maxFollowers = 256

// crashChance is the chance of a kill at each pass of a crash point.
const crashChance = "0.05"

// crashFaults names the faults the crash points make.
var crashFaults = map[string]string{
	crashpoint.DispatcherAccepted: "dispatcher killed at a crash point: accepted stored, work not published",
	crashpoint.WorkerPickup:       "worker killed at a crash point: delivery taken, started not sent",
	crashpoint.RouterJoined:       "router killed at a crash point: joined question written, not listed",
}

// countCrashPoints counts the crash points the services' log names as hit
// and returns how many were.
func countCrashPoints(log string, fault func(string)) (int, error) {
	b, err := os.ReadFile(log)
	if err != nil {
		return 0, fmt.Errorf("chaos: read the services' log: %w", err)
	}
	n := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		if name, ok := strings.CutPrefix(line, "agora crash point: "); ok {
			if f, known := crashFaults[name]; known {
				fault(f)
				n++
			}
		}
	}
	return n, nil
}

// answerAfter is how long a question waits before its answers go out.
const answerAfter = 1500 * time.Millisecond

// proc is one service process the soak kills and restarts.
type proc struct {
	name string
	args []string
	env  []string
	log  io.Writer
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has ended
	// restarting serialises restart: two faults on one process never
	// leave two of it running.
	restarting sync.Mutex
	// killing is the process the soak is killing itself; stopping is set
	// once the services are being stopped for good. A process that ends
	// otherwise ended by itself: killed at a crash point (SIGKILL), and
	// started again, or exited, which is reported.
	killing  *exec.Cmd
	stopping bool
	// exited is told of a process that ended by itself other than by
	// SIGKILL, or that could not be started again; killed of one that
	// ended by SIGKILL the soak did not send.
	exited func(name string, err error)
	killed func()
	// reachable, when set, blocks while the process could not reach NATS
	// (its blackhole is held): it is started again once it can, as a
	// supervisor restarts a service that exited for want of its server
	// (a service exits when its first connection does not come within
	// internal/svc's patience for a slow server).
	reachable func()
}

// restart SIGKILLs p and starts it again after down.
func (p *proc) restart(down time.Duration) {
	p.restarting.Lock()
	defer p.restarting.Unlock()
	p.mu.Lock()
	p.killing = p.cmd
	p.mu.Unlock()
	p.signal(syscall.SIGKILL)
	time.Sleep(down)
	p.startAgain()
}

// startAgain starts p after a kill; a failure is reported.
func (p *proc) startAgain() {
	if p.reachable != nil {
		p.reachable()
	}
	if err := p.start(); err != nil && p.exited != nil {
		p.exited(p.name, err)
	}
}

// stop ends p for good with s.
func (p *proc) stop(s syscall.Signal) {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	p.signal(syscall.SIGCONT)
	p.signal(s)
}

// end kills p for good and waits until it has ended: nothing starts it
// again once it is stopping.
func (p *proc) end() {
	p.stop(syscall.SIGKILL)
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done != nil {
		<-done
	}
}

func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping {
		return nil
	}
	cmd := exec.Command(p.args[0], p.args[1:]...)
	cmd.Env, cmd.Stdout, cmd.Stderr = p.env, p.log, p.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("chaos: start %s: %w", p.name, err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go p.wait(cmd, p.done)
	return nil
}

// wait waits for cmd to end, closes done and starts p again when it was
// killed at a crash point (docs/chaos.md, "Crash points").
func (p *proc) wait(cmd *exec.Cmd, done chan struct{}) {
	err := cmd.Wait()
	close(done)
	p.mu.Lock()
	byItself := p.cmd == cmd && p.killing != cmd && !p.stopping
	p.mu.Unlock()
	if !byItself {
		return
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		if p.exited != nil {
			p.exited(p.name, err)
		}
		return
	}
	if p.killed != nil {
		p.killed()
	}
	time.Sleep(300 * time.Millisecond)
	p.restarting.Lock()
	defer p.restarting.Unlock()
	p.mu.Lock()
	again := p.cmd == cmd
	p.mu.Unlock()
	if again {
		p.startAgain()
	}
}

func (p *proc) signal(s syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(s)
	}
}

// Run soaks and audits. progress receives a line per phase.
func Run(ctx context.Context, cfg Config, progress io.Writer) (Report, error) {
	cfg = cfg.withDefaults()
	start := time.Now()
	rep := Report{Faults: map[string]int{}, ThreadsByDoor: map[string]int{}, AnswersByDoor: map[string]int{}}
	var fmu sync.Mutex
	fault := func(name string) { fmu.Lock(); rep.Faults[name]++; fmu.Unlock() }
	say := func(f string, a ...any) { fmt.Fprintf(progress, f+"\n", a...) }
	ctx, cancel := context.WithTimeout(ctx, cfg.Deadline)
	defer cancel()

	dir, err := os.MkdirTemp("", "agora-chaos-")
	if err != nil {
		return rep, err
	}
	defer func() {
		// The services' log is what explains an anomaly: kept beside the
		// folder, which goes, when the audit found any.
		if len(rep.Anomalies) > 0 {
			kept := dir + ".log"
			if os.Rename(filepath.Join(dir, "services.log"), kept) == nil {
				say("the services' log is kept in %s", kept)
			}
		}
		os.RemoveAll(dir)
	}()
	// The sub-agent's side folder is a write_path: the run's own host user
	// (unprivileged under a root worker, docs/sandbox.md) must reach and
	// write it, nothing else of dir.
	side, ws := filepath.Join(dir, "side"), filepath.Join(dir, "ws")
	if err := os.Mkdir(side, 0o755); err != nil {
		return rep, err
	}
	if err := errors.Join(os.Chmod(dir, 0o711), os.Chmod(side, 0o1777)); err != nil {
		return rep, err
	}
	// The store on a filesystem of its own, which the soak fills up and
	// frees (docs/chaos.md, "A full store"); nil where none can be
	// mounted (not root), and that fault is left out.
	full, err := newFullStore(filepath.Join(dir, "nats"))
	if err != nil {
		say("the store-full fault is left out: %v", err)
	}
	if full != nil {
		defer full.close()
	}
	// The server only: the services run as processes of their own.
	st, err := stack.Start(ctx, stack.Options{Server: natsserver.Config{Port: -1, StoreDir: filepath.Join(dir, "nats"),
		StoreRestarted: func() { fault("JetStream restarted once the full store had room") }},
		Provision: &provision.Config{WorkAckWait: ackWait, WorkMaxDeliver: 20}})
	if err != nil {
		return rep, err
	}
	defer st.Close()
	url, js, c := st.URL(), st.JetStream(), st.Client()
	marker := "agora-chaos-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := define(ctx, c, marker, side, cfg.LongRun); err != nil {
		return rep, err
	}

	logf, err := os.Create(filepath.Join(dir, "services.log"))
	if err != nil {
		return rep, err
	}
	defer logf.Close()
	base := append(os.Environ(), "AGORA_NATS_URL="+url, "AGORA_LOG_LEVEL=warn")
	// tmu guards rep.Anomalies while the soak runs.
	var tmu sync.Mutex
	var selfKills atomic.Int64
	exited := func(name string, err error) {
		tmu.Lock()
		defer tmu.Unlock()
		rep.Anomalies = append(rep.Anomalies, fmt.Sprintf("%s ended by itself while the soak ran: %v", name, err))
	}
	mk := func(name string, extra ...string) *proc {
		return &proc{name: name, args: []string{cfg.Exe, "service", strings.SplitN(name, "-", 2)[0]}, env: append(append([]string{}, base...), extra...), log: logf,
			exited: exited, killed: func() { selfKills.Add(1) }}
	}
	// Crash points (docs/chaos.md): the dispatcher killed with a
	// dispatch's accepted event stored and its work not yet published, a
	// worker killed with a delivery taken and its `started` not yet sent.
	// Housekeeping (docs/chaos.md): every periodic pass runs often, so
	// the long runs outlive many of each.
	procs := []*proc{mk("dispatcher", "AGORA_DISPATCHER_RECONCILE_GRACE=2s", crashpoint.Env+"="+crashpoint.DispatcherAccepted+":"+crashChance),
		mk("router", "AGORA_ROUTER_TICK=500ms", "AGORA_ROUTER_CANCEL_SWEEP=1s", crashpoint.Env+"="+crashpoint.RouterJoined+":"+crashChance)}
	var workers []*proc
	// Each worker reaches NATS through a blackhole of its own, which the
	// soak holds past AckWait and releases.
	var holes []*blackhole
	defer func() {
		for _, h := range holes {
			h.close()
		}
	}()
	for i := range cfg.Workers {
		hole, err := newBlackhole(url)
		if err != nil {
			return rep, err
		}
		holes = append(holes, hole)
		w := mk(fmt.Sprintf("worker-%d", i+1), "AGORA_NATS_URL="+hole.URL(), "AGORA_WORKER_ID=chaos-w"+strconv.Itoa(i+1), "AGORA_WORKER_CONCURRENCY=2",
			"AGORA_WORKSPACE_ROOT="+ws, "AGORA_WORKER_PULL_EXPIRY=500ms", "AGORA_WORKER_KILL_GRACE=1s",
			"AGORA_WORKER_SWEEP_INTERVAL=1s", crashpoint.Env+"="+crashpoint.WorkerPickup+":"+crashChance)
		w.reachable = hole.waitOpen
		workers = append(workers, w)
		procs = append(procs, w)
	}
	// The doors, each a process of its own on a loopback port it keeps
	// across restarts, without tokens: their callers are the local
	// principal, an admin, as on agora dev.
	a2aAddr, err := freeAddr()
	if err != nil {
		return rep, err
	}
	mcpAddr, err := freeAddr()
	if err != nil {
		return rep, err
	}
	open := []string{"AGORA_API_TOKENS=", "AGORA_PRINCIPALS_FILE="}
	doorProcs := []*proc{mk("a2a", append([]string{"AGORA_A2A_HTTP_ADDR=" + a2aAddr}, open...)...),
		mk("mcp", append([]string{"AGORA_MCP_HTTP_ADDR=" + mcpAddr}, open...)...)}
	procs = append(procs, doorProcs...)
	a2aClient, err := newA2ADoor(ctx, "http://"+a2aAddr)
	if err != nil {
		return rep, err
	}
	defer a2aClient.close()
	doors := map[string]door{doorA2A: a2aClient, doorMCP: newMCPDoor("http://" + mcpAddr)}
	// dmu guards threadDoor (each door's thread and its door) and ids.
	var dmu sync.Mutex
	threadDoor := map[string]string{}
	doorErr := func(what string, err error) {
		dmu.Lock()
		defer dmu.Unlock()
		if rep.DoorErrors == nil {
			rep.DoorErrors = map[string]int{}
		}
		rep.DoorErrors[what+": "+errStatus(err)]++
	}
	// Once every service has ended (below), the workspaces that killed
	// workers left go: no worker sweeps the root after the soak.
	cleared := false
	defer func() {
		if !cleared {
			_, _, _ = clearWorkspaces(ws, workspacesGo)
		}
	}()
	for _, p := range procs {
		if err := p.start(); err != nil {
			return rep, err
		}
	}
	defer func() {
		for _, p := range procs {
			p.end()
		}
	}()

	// Faults, while the threads are dispatched and for a window after.
	soak, stopSoak := context.WithCancel(ctx)
	faultCtx, stopFaults := context.WithCancel(soak)
	var faults sync.WaitGroup
	faults.Go(func() { inject(faultCtx, cfg, procs, workers, doorProcs, holes, full, fault) })

	// Answers: every question gets one to three concurrent answers.
	var answering sync.WaitGroup
	var amu sync.Mutex
	answered := map[string]time.Time{} // when its answers were last sent
	answerErrText := func(what, text string) {
		amu.Lock()
		defer amu.Unlock()
		if rep.AnswerErrors == nil {
			rep.AnswerErrors = map[string]int{}
		}
		rep.AnswerErrors[what+": "+text]++
	}
	answerErr := func(what string, err error) { answerErrText(what, lifecycle.Clip(err.Error(), 160)) }
	answering.Go(func() {
		for soak.Err() == nil {
			qs, err := c.Questions(soak, client.QuestionFilter{Status: "asked"})
			if err != nil && soak.Err() == nil {
				answerErr("list the asked questions", err)
			}
			if err == nil {
				for _, q := range qs {
					// A person takes a moment: meanwhile threads asking the
					// same question join it.
					if time.Since(q.AskedAt) < answerAfter {
						continue
					}
					amu.Lock()
					// Still asked a while after its answers went out (the
					// router was down): answer again, as a person would.
					if t, ok := answered[q.QuestionID]; ok && time.Since(t) < 5*time.Second {
						amu.Unlock()
						continue
					}
					answered[q.QuestionID] = time.Now()
					n := 1 + rand.IntN(3)
					rep.Answers += n
					// Through the door of its thread, or else of the first
					// thread waiting on it that came through one: an answer
					// on a joined thread's task answers the question asked.
					dmu.Lock()
					through, task := threadDoor[q.ThreadID], q.ThreadID
					for _, w := range q.WaitingThreads {
						if through == "" {
							through, task = threadDoor[w.ThreadID], w.ThreadID
						}
					}
					dmu.Unlock()
					if through == "" {
						through = doorAPI
					}
					rep.AnswersByDoor[through] += n
					// One in three answers to a group, while faults go on,
					// SIGKILLs the router as the first answer is accepted:
					// in the middle of its fan-out to the joined threads.
					kill := len(q.WaitingThreads) > 1 && faultCtx.Err() == nil && rand.IntN(3) == 0
					if kill {
						fault("router SIGKILL during a fan-out")
					}
					amu.Unlock()
					var once sync.Once
					if d := doors[through]; d != nil {
						go answerThrough(soak, through, d, c, task, q, n, func(err error) {
							if kill && err == nil {
								once.Do(func() { procs[1].restart(300 * time.Millisecond) })
							}
						}, answerErrText, func(a string) {
							tmu.Lock()
							rep.Anomalies = append(rep.Anomalies, a)
							tmu.Unlock()
						})
						continue
					}
					for range n {
						go func() {
							_, err := c.Answer(soak, q.QuestionID, lifecycle.Answer{Answer: "yes", AnsweredBy: "chaos"})
							var ae *client.AnswerError
							switch {
							case errors.As(err, &ae) && ae.Reply.Status == client.AnswerAlreadyAnswered:
								// Another of its concurrent answers won.
							case errors.As(err, &ae):
								answerErr("answer", errors.New(string(ae.Reply.Status)))
							case err != nil && soak.Err() == nil:
								answerErr("answer", err)
							}
							if kill && err == nil {
								once.Do(func() { procs[1].restart(300 * time.Millisecond) })
							}
						}()
					}
				}
			}
			select {
			case <-soak.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	})

	if cfg.Soak > 0 {
		say("soaking for %s: a thread every %s to %d workers, a fault every %s", cfg.Soak, cfg.Pace, cfg.Workers, cfg.FaultEvery)
	} else {
		say("dispatching %d threads to %d workers, a fault every %s", cfg.Threads, cfg.Workers, cfg.FaultEvery)
	}
	var threads sync.WaitGroup
	var ids []string
	followers := make(chan struct{}, maxFollowers)
	more := func(i int) bool {
		if cfg.Soak > 0 {
			return time.Since(start) < cfg.Soak && ctx.Err() == nil
		}
		return i < cfg.Threads
	}
	lastSaid := time.Now()
	for i := 0; more(i); i++ {
		if cfg.Soak > 0 && time.Since(lastSaid) >= time.Minute {
			lastSaid = time.Now()
			fmu.Lock()
			nf := 0
			for _, k := range rep.Faults {
				nf += k
			}
			fmu.Unlock()
			say("%s: %d threads dispatched, %d faults", time.Since(start).Round(time.Second), i, nf)
		}
		through := doorOf(i)
		id := fmt.Sprintf("chaos%04d-%s", i, lifecycle.NewID())
		threads.Go(func() {
			var err error
			for ctx.Err() == nil {
				// Each attempt has its own bound: a dispatcher killed
				// after it took the request never answers it, and
				// Dispatch waits as long as its context lets it.
				if d := doors[through]; d != nil {
					// Through a door, which names the thread: a call
					// that failed may have started one all the same,
					// which the audit checks as any other.
					actx, cancel := context.WithTimeout(ctx, doorCall)
					var tid string
					tid, err = d.dispatch(actx)
					cancel()
					if err == nil {
						id = tid
						break
					}
					if ctx.Err() == nil {
						doorErr(through+" dispatch", err)
					}
				} else {
					actx, cancel := context.WithTimeout(ctx, 5*time.Second)
					_, err = c.Dispatch(actx, lifecycle.Request{DispatchID: id, Subagent: "chaos", Input: json.RawMessage(`{}`)})
					cancel()
					if err == nil {
						break
					}
				}
				time.Sleep(500 * time.Millisecond) // the dispatcher is being restarted
			}
			if err != nil {
				tmu.Lock()
				rep.Anomalies = append(rep.Anomalies, fmt.Sprintf("thread %s (through %s) was never accepted: its dispatch failed until the deadline, last with: %v", id, through, err))
				tmu.Unlock()
				return
			}
			dmu.Lock()
			ids = append(ids, id)
			rep.ThreadsByDoor[through]++
			if through != doorAPI {
				threadDoor[id] = through
			}
			dmu.Unlock()
			// A follower is a consumer on the lifecycle stream, and the
			// server bounds those: at most maxFollowers follow at once (a
			// follower reads its thread from its start, so a late one
			// still sees the end).
			select {
			case followers <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-followers }()
			if _, err := c.Follow(ctx, id, nil); err != nil {
				tmu.Lock()
				rep.Anomalies = append(rep.Anomalies, fmt.Sprintf("thread %s did not end: %v", id, err))
				tmu.Unlock()
			}
		})
		time.Sleep(cfg.Pace)
	}
	say("all dispatched; faults go on for %s, then every thread must end", cfg.FaultWindow)
	select {
	case <-time.After(cfg.FaultWindow):
	case <-ctx.Done():
	}
	stopFaults()
	faults.Wait()
	// A paused worker is resumed and killed ones run again.
	for _, p := range procs {
		p.signal(syscall.SIGCONT)
	}
	threads.Wait()
	stopSoak()
	answering.Wait()
	rep.Threads = len(ids)
	// Each door must report its threads' ends, read before the services
	// stop; the audit compares them with the threads' own.
	// On a context of their own: a thread that never ended used up the
	// run's, and the other threads' ends are read all the same, within
	// what is left of the run's deadline (at least one door call).
	say("reading the doors' tasks")
	within := endsWithin + doorCall
	if d, ok := ctx.Deadline(); ok {
		within = min(within, max(time.Until(d), doorCall))
	}
	rctx, rcancel := context.WithTimeout(context.Background(), within)
	doorEnds := readDoorEnds(rctx, doors, threadDoor, doorErr)
	rcancel()
	say("threads done; stopping the services")
	for _, p := range procs {
		p.stop(syscall.SIGTERM)
	}
	time.Sleep(3 * time.Second)
	hit, err := countCrashPoints(logf.Name(), fault)
	if err != nil {
		return rep, err
	}
	// Every SIGKILL the soak did not send must be a crash point's.
	if n := selfKills.Load(); n > int64(hit) {
		rep.Anomalies = append(rep.Anomalies, fmt.Sprintf("%d services were killed by SIGKILL, by neither the soak nor a crash point (%d crash points hit): the OOM killer?", n-int64(hit), hit))
	}

	say("auditing")
	actx, acancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer acancel()
	audit(actx, js, ids, side, marker, &rep)
	auditDoorEnds(actx, js, threadDoor, doorEnds, &rep)

	for _, p := range procs {
		p.end()
	}
	swept, left, err := clearWorkspaces(ws, workspacesGo)
	cleared = true
	rep.WorkspacesSwept = swept
	for _, m := range left {
		rep.Anomalies = append(rep.Anomalies, fmt.Sprintf("%s was still mounted once every worker had ended and the workspace root was swept for %s: detached by force", m, workspacesGo))
	}
	if err != nil {
		rep.Anomalies = append(rep.Anomalies, fmt.Sprintf("the workspace root could not be removed after the soak: %v", err))
	}
	rep.DurationSec = time.Since(start).Seconds()
	return rep, nil
}

// define registers the chaos sub-agent. It asks on half of its first
// rounds: a quarter of its questions are its thread's own, half one
// shared text and a quarter one dedupe_key under differing texts; threads
// asking while one of those waits join it (docs/router.md, "Ask once").
//
// One run in ten works for long (longRun) before it goes on: longer than
// every housekeeping interval of the soak's services.
func define(ctx context.Context, c *client.Client, marker, side string, longRun time.Duration) error {
	// The side folder is in the script itself: a thread dispatched
	// through a door carries no environment of its own.
	script := `SIDE='` + side + `'
n=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
if [ $((n % 10)) -eq 7 ]; then sleep ` + strconv.FormatFloat(longRun.Seconds(), 'f', 3, 64) + `; else sleep 0.$((n % 9 + 1)); fi
if [ $((n % 5)) -eq 0 ]; then setsid sh -c 'sleep 300; :' "` + marker + `" >/dev/null 2>&1 </dev/null & fi
if [ "$AGORA_ROUND" = 0 ] && [ $((n % 2)) -eq 0 ]; then
  case $((n / 2 % 4)) in
  0) printf '{"question":"go on with %s?","options":["yes","no"]}' "$AGORA_THREAD_ID" ;;
  3) printf '{"question":"go on? (%s)","options":["yes","no"],"dedupe_key":"chaos-shared"}' "$AGORA_THREAD_ID" ;;
  *) printf '{"question":"go on?","options":["yes","no"]}' ;;
  esac > "$AGORA_NEEDS_INPUT_FILE"; exit 0
fi
nonce="$AGORA_DISPATCH_ID-$AGORA_ATTEMPT-$n-$$"
printf '%s' "$nonce" > "$SIDE/$AGORA_DISPATCH_ID.$AGORA_ATTEMPT"
printf '{"nonce":"%s","attempt":%s}' "$nonce" "$AGORA_ATTEMPT" > "$AGORA_OUTPUT_FILE"`
	d := subagent.Definition{Name: "chaos", Runtime: subagent.RuntimeExec, Command: []string{"/bin/sh", "-c", script},
		Timeout: (longRun + time.Minute).String(), MaxRounds: 3}
	d.Sandbox.WritePaths = []string{side}
	_, err := c.ApplySubagent(ctx, d)
	return err
}

// storeFullHold is how long the store's filesystem stays full.
const storeFullHold = 3 * time.Second

// inject kills, pauses and restarts processes, blackholes workers'
// connections and fills the store's filesystem (when full is not nil),
// until ctx ends.
func inject(ctx context.Context, cfg Config, procs, workers, doors []*proc, holes []*blackhole, full *fullStore, fault func(name string)) {
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(cfg.FaultEvery):
		}
		// The third fault fills the store, so every soak has one; then
		// one in twelve.
		if full != nil && (n == 3 || rand.IntN(12) == 0) {
			full.fill(ctx, storeFullHold)
			fault("JetStream store's filesystem full")
			continue
		}
		kinds := 10
		if len(doors) > 0 {
			kinds = 11
		}
		switch f := rand.IntN(kinds); {
		case f < 4: // SIGKILL a worker mid-run, restart it
			workers[rand.IntN(len(workers))].restart(300 * time.Millisecond)
			fault("worker SIGKILL")
		case f < 6: // pause a worker past AckWait: its deliveries go to others
			w := workers[rand.IntN(len(workers))]
			w.signal(syscall.SIGSTOP)
			time.Sleep(ackWait + time.Second)
			w.signal(syscall.SIGCONT)
			fault("worker SIGSTOP past AckWait")
		case f < 7: // blackhole a worker's NATS connection past AckWait, then restore it
			h := holes[rand.IntN(len(holes))]
			h.hold()
			select {
			case <-ctx.Done():
			case <-time.After(2*ackWait + time.Second):
			}
			h.release()
			fault("worker's NATS connection blackholed past AckWait")
		case f < 8:
			procs[1].restart(300 * time.Millisecond)
			fault("router SIGKILL")
		case f < 10: // mid-intake: between a record and its queueing, often
			procs[0].restart(300 * time.Millisecond)
			fault("dispatcher SIGKILL")
		default: // a door, often with calls in flight
			d := doors[rand.IntN(len(doors))]
			d.restart(300 * time.Millisecond)
			fault(d.name + " door SIGKILL")
		}
	}
}

// audit reads the streams and the bucket and records every anomaly.
func audit(ctx context.Context, js jetstream.JetStream, threads []string, side, marker string, rep *Report) {
	bad := func(f string, a ...any) { rep.Anomalies = append(rep.Anomalies, fmt.Sprintf(f, a...)) }
	type disp struct {
		thread, parent string
		terminals      []lifecycle.Data
		started        *lifecycle.Started // the last attempt's
	}
	ds := map[string]*disp{}
	n := 0
	err := readAll(ctx, js, lifecycle.StreamLifecycle, func(d lifecycle.Data) {
		n++
		l, ok := d.(lifecycle.Lifecycle)
		if !ok {
			return
		}
		c := l.Base()
		x := ds[c.DispatchID]
		if x == nil {
			x = &disp{thread: c.ThreadID, parent: c.ParentID}
			ds[c.DispatchID] = x
		}
		if s, ok := d.(*lifecycle.Started); ok {
			x.started = s
		}
		if l.LifecycleKind().Terminal() {
			x.terminals = append(x.terminals, d)
		}
	})
	if err != nil {
		bad("cannot read %s: %v", lifecycle.StreamLifecycle, err)
	}
	rep.Events = n
	rep.Dispatches = len(ds)
	if rep.Threads == 0 || n == 0 {
		bad("nothing to audit: %d threads, %d events", rep.Threads, n)
	}
	children := map[string]int{}
	ended := map[string]bool{}
	ends := map[End]int{}
	for id, x := range ds {
		switch len(x.terminals) {
		case 0:
			last := "accepted only"
			if x.started != nil {
				last = fmt.Sprintf("started by worker %q, attempt %d", x.started.WorkerID, x.started.Attempt)
			}
			bad("dispatch %s (thread %s) has no terminal event; its last: %s", id, x.thread, last)
		case 1:
		default:
			var kinds []string
			for _, t := range x.terminals {
				kinds = append(kinds, string(t.(lifecycle.Lifecycle).LifecycleKind()))
			}
			bad("dispatch %s (thread %s) has %d terminal events: %s", id, x.thread, len(x.terminals), strings.Join(kinds, ", "))
		}
		if x.parent != "" {
			children[x.parent]++
		}
		for _, t := range x.terminals {
			ends[endOf(t)]++
			switch t.(type) {
			case *lifecycle.NeedsInput:
				rep.Questions++
			default:
				ended[x.thread] = true
			}
			checkEnd(id, x.thread, t, side, bad)
		}
	}
	for e, k := range ends {
		e.Count = k
		rep.Ends = append(rep.Ends, e)
	}
	slices.SortFunc(rep.Ends, func(a, b End) int {
		if a.Count != b.Count {
			return b.Count - a.Count
		}
		return strings.Compare(string(a.Kind)+" "+a.Reason, string(b.Kind)+" "+b.Reason)
	})
	resumed := map[string]int{} // thread → its dispatches that resume one
	for _, x := range ds {
		if x.parent != "" {
			resumed[x.thread]++
		}
	}
	for parent, k := range children {
		if k > 1 {
			bad("dispatch %s was resumed %d times, want once", parent, k)
		}
	}
	for t, k := range resumed {
		if k > 1 { // the sub-agent asks on round 0 only
			bad("thread %s was resumed %d times, want once", t, k)
		}
	}
	for _, t := range threads {
		if !ended[t] {
			bad("thread %s did not end", t)
		}
	}
	answeredEvents := map[string]int{}
	if err := readAll(ctx, js, lifecycle.StreamQuestions, func(d lifecycle.Data) {
		if q, ok := d.(*lifecycle.Question); ok && q.Event == lifecycle.QuestionAnswered {
			answeredEvents[q.QuestionID]++
		}
	}); err != nil {
		bad("cannot read %s: %v", lifecycle.StreamQuestions, err)
	}
	for q, k := range answeredEvents {
		if k > 1 {
			bad("question %s answered %d times", q, k)
		}
	}
	auditAskOnce(ctx, js, children, answeredEvents, rep, bad)
	chains, err := chain.NewReader(js)
	if err != nil {
		bad("cannot read chains: %v", err)
	} else {
		defer chains.Close()
	}
	if kv, err := js.KeyValue(ctx, lifecycle.BucketDispatches); err == nil && chains != nil {
		keys, _ := kv.ListKeys(ctx)
		for k := range keys.Keys() {
			if strings.HasPrefix(k, "thread.") {
				continue
			}
			e, err := kv.Get(ctx, k)
			if err != nil {
				continue
			}
			// An accepted dispatch whose chain never went past accepted
			// was never queued (nothing marks a record queued: the chain
			// says it), its status read as every door reads it.
			var r client.Record
			if json.Unmarshal(e.Value(), &r) != nil || r.Request == nil {
				continue
			}
			links, err := chains.Last(ctx, r.ThreadID, r.DispatchID)
			if err != nil {
				bad("cannot read the chain of %s: %v", k, err)
				continue
			}
			chain.Apply(&r, links...)
			if r.Status == lifecycle.KindAccepted {
				bad("dispatch %s never started: its acceptance was not completed", k)
			}
		}
	}
	if pids := proclist.WithMarker(marker); len(pids) > 0 {
		bad("%d sub-agent processes outlived their runs: %v", len(pids), pids)
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
}

// detailLen bounds a failure's detail in an anomaly.
const detailLen = 300

// endOf is the kind and reason of terminal event t, uncounted.
func endOf(t lifecycle.Data) End {
	e := End{Kind: t.(lifecycle.Lifecycle).LifecycleKind()}
	switch v := t.(type) {
	case *lifecycle.Failed:
		e.Reason = string(v.Reason)
	case *lifecycle.Cancelled:
		e.Reason = v.Reason
	}
	return e
}

// checkEnd reports terminal event t of dispatch id (of thread) unless the
// soak made it on purpose. The soak's sub-agent cannot fail, and the soak
// cancels nothing, gives no question a deadline and asks on round 0 only
// (its max_rounds is 3): a failed of any reason and any cancelled are
// anomalies. So is a finished whose output is not the nonce its own
// attempt wrote into side (a stale worker's result), a null one included.
func checkEnd(id, thread string, t lifecycle.Data, side string, bad func(string, ...any)) {
	switch v := t.(type) {
	case *lifecycle.NeedsInput: // the question audit follows it
	case *lifecycle.Failed:
		bad("dispatch %s (thread %s) failed %s on worker %q, attempt %d: %s", id, thread, v.Reason, v.WorkerID, v.Attempt, lifecycle.Clip(v.Detail, detailLen))
	case *lifecycle.Cancelled:
		bad("dispatch %s (thread %s) was cancelled by %q (%q) on worker %q, attempt %d; the soak cancels nothing", id, thread, v.By, v.Reason, v.WorkerID, v.Attempt)
	case *lifecycle.Finished:
		if len(v.Output) == 0 || string(v.Output) == "null" {
			dropped := ""
			if v.OutputDropped != "" {
				dropped = " (dropped: " + v.OutputDropped + ")"
			}
			bad("dispatch %s (thread %s) finished on worker %q, attempt %d, with a null output%s", id, thread, v.WorkerID, v.Attempt, dropped)
			return
		}
		var out struct {
			Nonce   string `json:"nonce"`
			Attempt int    `json:"attempt"`
		}
		_ = json.Unmarshal(v.Output, &out)
		wrote, err := os.ReadFile(filepath.Join(side, fmt.Sprintf("%s.%d", id, v.Attempt)))
		switch {
		case err != nil:
			bad("dispatch %s (thread %s) finished on worker %q by attempt %d, which wrote nothing: %s", id, thread, v.WorkerID, v.Attempt, lifecycle.Clip(string(v.Output), detailLen))
		case string(wrote) != out.Nonce || out.Attempt != v.Attempt:
			bad("dispatch %s (thread %s) finished on worker %q with output %s, but attempt %d wrote %q", id, thread, v.WorkerID, lifecycle.Clip(string(v.Output), detailLen), v.Attempt, wrote)
		}
	default:
		bad("dispatch %s (thread %s) ended with an event of type %T", id, thread, t)
	}
}

// auditAskOnce checks every question record against the re-dispatches
// (docs/router.md, "Ask once"): each answered question, asked or joined,
// resumed its own dispatch exactly once and has one answered event; none is
// left asked or joined; each group's asked question lists exactly the threads
// whose questions joined it, and every one of them was resumed once. children
// counts the dispatches resuming each dispatch, answered the answered events
// of each question.
func auditAskOnce(ctx context.Context, js jetstream.JetStream, children, answered map[string]int, rep *Report, bad func(string, ...any)) {
	c, err := client.New(js.Conn())
	if err != nil {
		bad("cannot read the question records: %v", err)
		return
	}
	qs, err := c.Questions(ctx, client.QuestionFilter{})
	if err != nil {
		bad("cannot read the question records: %v", err)
		return
	}
	byID := map[string]*lifecycle.Question{}
	members := map[string][]string{} // asked question → the questions that joined it
	for i := range qs {
		q := &qs[i]
		byID[q.QuestionID] = q
		if q.JoinedTo != "" {
			rep.Coalesced++
			members[q.JoinedTo] = append(members[q.JoinedTo], q.QuestionID)
		}
		if q.Status != "answered" {
			// No thread is cancelled and no route has deadlines here.
			bad("question %s (joined to %q) ended %s, want answered", q.QuestionID, q.JoinedTo, q.Status)
			continue
		}
		rep.Resumes++
		if k := children[q.DispatchID]; k != 1 {
			bad("question %s (joined to %q) was answered and its dispatch %s resumed %d times, want once", q.QuestionID, q.JoinedTo, q.DispatchID, k)
		}
		if k := answered[q.QuestionID]; k != 1 {
			bad("question %s (joined to %q) was answered with %d answered events, want 1", q.QuestionID, q.JoinedTo, k)
		}
	}
	for lid, ms := range members {
		l := byID[lid]
		if l == nil {
			bad("questions %v joined %s, which has no record", ms, lid)
			continue
		}
		if l.JoinedTo != "" {
			bad("questions %v joined %s, which itself joined %s", ms, lid, l.JoinedTo)
		}
		listed := map[string]bool{}
		once := 0
		for _, w := range l.WaitingThreads {
			if listed[w.QuestionID] {
				bad("question %s lists waiting question %s twice", lid, w.QuestionID)
			}
			listed[w.QuestionID] = true
			wq := byID[w.QuestionID]
			switch {
			case wq == nil:
				bad("question %s lists waiting question %s, which has no record", lid, w.QuestionID)
			case w.QuestionID != lid && wq.JoinedTo != lid:
				bad("question %s (answered at %s) lists waiting question %s, which joined %q and ended %s (its history: %s)",
					lid, stamp(l.AnsweredAt), w.QuestionID, wq.JoinedTo, wq.Status, history(ctx, js, w.QuestionID))
			case wq.DispatchID != w.DispatchID:
				bad("question %s lists dispatch %s for question %s, asked by dispatch %s", lid, w.DispatchID, w.QuestionID, wq.DispatchID)
			}
			if children[w.DispatchID] == 1 {
				once++
			}
		}
		if !listed[lid] {
			bad("question %s does not list its own thread among those waiting", lid)
		}
		byKey := false
		for _, m := range ms {
			if !listed[m] {
				bad("question %s joined %s, which does not list it among its waiting threads", m, lid)
			}
			byKey = byKey || byID[m].Question != l.Question
		}
		if byKey {
			rep.DedupeGroups++
		}
		if once != len(l.WaitingThreads) {
			bad("question %s: %d of its %d waiting threads resumed once", lid, once, len(l.WaitingThreads))
		}
		rep.Groups++
		rep.GroupSizes = append(rep.GroupSizes, len(l.WaitingThreads))
	}
	slices.SortFunc(rep.GroupSizes, func(a, b int) int { return b - a })
	// A thread listed on a question and then asked on its own was asked
	// twice: the router unlists it, and says so in the record's history.
	for i := range qs {
		if q := &qs[i]; len(q.WaitingThreads) > 0 {
			if h := history(ctx, js, q.QuestionID); strings.Contains(h, " join unlisted: ") {
				bad("question %s unlisted a thread that was asked on its own (its history: %s)", q.QuestionID, h)
			}
		}
	}
}

// stamp formats an optional time for an anomaly.
func stamp(t *time.Time) string {
	if t == nil {
		return "never"
	}
	return t.Format("15:04:05.000")
}

// history is the router's own history of question qid, read from its
// stored record, for an anomaly that needs it.
func history(ctx context.Context, js jetstream.JetStream, qid string) string {
	kv, err := js.KeyValue(ctx, lifecycle.BucketQuestions)
	if err != nil {
		return err.Error()
	}
	e, err := kv.Get(ctx, qid)
	if err != nil {
		return err.Error()
	}
	var r struct {
		AskedAt time.Time `json:"asked_at"`
		History []struct {
			At     time.Time `json:"at"`
			Via    string    `json:"via"`
			Result string    `json:"result"`
			Reason string    `json:"reason"`
		} `json:"history"`
	}
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return err.Error()
	}
	out := []string{"asked " + r.AskedAt.Format("15:04:05.000")}
	for _, h := range r.History {
		out = append(out, fmt.Sprintf("%s %s %s: %s", h.At.Format("15:04:05.000"), h.Via, h.Result, h.Reason))
	}
	return strings.Join(out, "; ")
}

// readAll reads a stream from its start.
func readAll(ctx context.Context, js jetstream.JetStream, stream string, f func(lifecycle.Data)) error {
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	for {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return err
		}
		got := 0
		var pending uint64
		for m := range batch.Messages() {
			got++
			if md, err := m.Metadata(); err == nil {
				pending = md.NumPending
			}
			if e, err := lifecycle.DecodeMsg(m); err == nil {
				if d, err := lifecycle.Parse(e); err == nil {
					f(d)
				}
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		if got == 0 || pending == 0 {
			return nil
		}
	}
}

// Print writes the report as a table.
func Print(w io.Writer, r Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "threads\t%d\n", r.Threads)
	fmt.Fprintf(tw, "dispatches\t%d\n", r.Dispatches)
	fmt.Fprintf(tw, "questions asked\t%d\n", r.Questions)
	for _, k := range slices.Sorted(maps.Keys(r.ThreadsByDoor)) {
		fmt.Fprintf(tw, "threads through %s\t%d\n", k, r.ThreadsByDoor[k])
	}
	fmt.Fprintf(tw, "answers sent (1-3 per question)\t%d\n", r.Answers)
	for _, k := range slices.Sorted(maps.Keys(r.AnswersByDoor)) {
		fmt.Fprintf(tw, "answers sent through %s\t%d\n", k, r.AnswersByDoor[k])
	}
	for _, k := range slices.Sorted(maps.Keys(r.AnswerErrors)) {
		fmt.Fprintf(tw, "answerer: %s\t%d\n", k, r.AnswerErrors[k])
	}
	for _, k := range slices.Sorted(maps.Keys(r.DoorErrors)) {
		fmt.Fprintf(tw, "door: %s\t%d\n", k, r.DoorErrors[k])
	}
	fmt.Fprintf(tw, "threads whose door reported their end\t%d\n", r.DoorEnds)
	fmt.Fprintf(tw, "events audited\t%d\n", r.Events)
	fmt.Fprintf(tw, "questions joined to one already asked\t%d\n", r.Coalesced)
	fmt.Fprintf(tw, "groups (threads waiting on each)\t%d %v\n", r.Groups, r.GroupSizes)
	fmt.Fprintf(tw, "groups joined by dedupe_key (texts differ)\t%d\n", r.DedupeGroups)
	fmt.Fprintf(tw, "answered questions matched to one re-dispatch\t%d\n", r.Resumes)
	for _, e := range r.Ends {
		how := string(e.Kind)
		if e.Reason != "" {
			how += " (" + e.Reason + ")"
		}
		fmt.Fprintf(tw, "ends: %s\t%d\n", how, e.Count)
	}
	for k, v := range r.Faults {
		fmt.Fprintf(tw, "fault: %s\t%d\n", k, v)
	}
	fmt.Fprintf(tw, "workspaces swept after the services ended\t%d\n", r.WorkspacesSwept)
	fmt.Fprintf(tw, "anomalies\t%d\n", len(r.Anomalies))
	fmt.Fprintf(tw, "duration\t%.1fs\n", r.DurationSec)
	tw.Flush()
	for _, a := range r.Anomalies {
		fmt.Fprintln(w, "ANOMALY:", a)
	}
}
