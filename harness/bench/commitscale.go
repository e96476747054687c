package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natsserver"
)

// CommitConfig sizes `agora bench --scale commit`.
type CommitConfig struct {
	Serial      int // default 1000 (200 with Quick)
	Throughput  int // default 5000 (1000 with Quick)
	Concurrency int // default 16
	Quick       bool
	// Deadline bounds the whole scenario; default 5 minutes and 20 ms for
	// each of Serial and Throughput.
	Deadline time.Duration
}

// CommitSetup is one server setup the ways were measured on.
type CommitSetup struct {
	Setup string `json:"setup"`
	Rows  []Row  `json:"rows"`
}

// CommitReport is the scenario's result: the acceptance's two messages
// stored the ways commit.go lists, with a worker's first fence, on one node and on a three-node cluster,
// every stream file-backed, R1 on the node and R3 on the cluster.
type CommitReport struct {
	Setups []CommitSetup `json:"setups"`
}

// Commit measures the ways of storing the acceptance's pair on one
// embedded server and on a three-node cluster in this process
// (docs/performance.md, "The acceptance's commit").
func Commit(ctx context.Context, cfg CommitConfig, progress io.Writer) (CommitReport, error) {
	mc := Config{Serial: cfg.Serial, Throughput: cfg.Throughput, Concurrency: cfg.Concurrency, Quick: cfg.Quick}.withDefaults()
	if cfg.Deadline <= 0 {
		cfg.Deadline = 5*time.Minute + time.Duration(mc.Serial+mc.Throughput)*20*time.Millisecond
	}
	// No dispatches: nothing to lose, only a deadline.
	return bounded(ctx, "--scale commit", cfg.Deadline, func(ctx context.Context, _ *lost) (CommitReport, error) {
		return commit(ctx, mc, progress)
	})
}

func commit(ctx context.Context, mc Config, progress io.Writer) (CommitReport, error) {
	say := sayer(progress)
	dir, err := os.MkdirTemp("", "agora-bench-commit-")
	if err != nil {
		return CommitReport{}, err
	}
	defer os.RemoveAll(dir)
	var rep CommitReport
	for _, setup := range []struct {
		name     string
		replicas int
	}{{"one node, file store, R1", 1}, {"three-node cluster in this process, file store, R3", 3}} {
		say("starting %s", setup.name)
		urls, stop, err := startServers(filepath.Join(dir, strconv.Itoa(setup.replicas)), setup.replicas)
		if err != nil {
			return rep, err
		}
		rows, err := measureCommits(ctx, urls[0], setup.replicas, mc, say)
		stop()
		if err != nil {
			return rep, fmt.Errorf("%s: %w", setup.name, err)
		}
		rep.Setups = append(rep.Setups, CommitSetup{Setup: setup.name, Rows: rows})
	}
	return rep, nil
}

func measureCommits(ctx context.Context, url string, replicas int, cfg Config, say func(string, ...any)) ([]Row, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	var reads, misses atomic.Int64
	scs, err := commitScenarios(ctx, nc, js, replicas, &reads, &misses)
	if err != nil {
		return nil, err
	}
	defer func() {
		say("fence reads by direct get that found no accepted event yet (read again after 1 ms, backing off): %d of %d", misses.Load(), reads.Load())
	}()
	var rows []Row
	for _, sc := range scs {
		say("measuring %s", sc.name)
		row, err := measure(ctx, sc, cfg)
		if err != nil {
			return nil, err
		}
		if len(rows) > 0 {
			b := rows[0]
			row.Baseline, row.P50Ratio, row.RateRatio = b.Scenario, row.P50MS/b.P50MS, row.PerSecond/b.PerSecond
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// startServers starts one embedded server, or n clustered ones (JetStream
// on each, routes between them), and returns their client URLs and a stop.
func startServers(dir string, n int) ([]string, func(), error) {
	if n == 1 {
		s, err := natsserver.Start(natsserver.Config{Port: -1, StoreDir: dir})
		if err != nil {
			return nil, nil, err
		}
		return []string{s.ClientURL()}, func() { s.Shutdown(); s.WaitForShutdown() }, nil
	}
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, err
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	var servers []*server.Server
	stop := func() {
		for _, s := range servers {
			s.Shutdown()
			s.WaitForShutdown()
		}
	}
	for i := range n {
		opts := &server.Options{
			ServerName: fmt.Sprintf("bench-%d", i), Host: "127.0.0.1", Port: -1,
			JetStream: true, StoreDir: filepath.Join(dir, strconv.Itoa(i)), NoLog: true, NoSigs: true,
			JetStreamMaxMemory: -1, JetStreamMaxStore: -1,
			Cluster: server.ClusterOpts{Name: "bench", Host: "127.0.0.1", Port: ports[i]},
			Routes:  server.RoutesFromStr(strings.Join(slices.Delete(slices.Clone(routes), i, i+1), ",")), // every other server
		}
		s, err := server.NewServer(opts)
		if err != nil {
			stop()
			return nil, nil, err
		}
		go s.Start()
		servers = append(servers, s)
	}
	var urls []string
	for _, s := range servers {
		if !s.ReadyForConnections(10 * time.Second) {
			stop()
			return nil, nil, fmt.Errorf("bench: server %s not ready within 10s", s.Name())
		}
		urls = append(urls, s.ClientURL())
	}
	// An R3 stream can be placed once the cluster has a meta leader and
	// that leader has heard from every server (a leader alone answers "no
	// suitable peers for placement").
	deadline := time.Now().Add(30 * time.Second)
	for {
		peers := -1
		for _, s := range servers {
			if s.JetStreamIsLeader() {
				peers = len(s.JetStreamClusterPeers())
			}
		}
		if peers == n {
			break
		}
		if time.Now().After(deadline) {
			stop()
			if peers < 0 {
				return nil, nil, fmt.Errorf("bench: the cluster elected no JetStream leader within 30s")
			}
			return nil, nil, fmt.Errorf("bench: the JetStream leader knows %d of %d servers after 30s", peers, n)
		}
		time.Sleep(20 * time.Millisecond) // polling the server's own state
	}
	return urls, stop, nil
}

// PrintCommit writes the report as one table per setup.
func PrintCommit(w io.Writer, r CommitReport) {
	for _, st := range r.Setups {
		fmt.Fprintf(w, "\n%s\n", st.Setup)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "storing accepted + work\tp50 ms\tp99 ms\tper second\tp50 × first\trate × first\tCPU ms each")
		for i, row := range st.Rows {
			p, q := "1.00", "1.00"
			if i > 0 {
				p, q = fmt.Sprintf("%.2f", row.P50Ratio), fmt.Sprintf("%.2f", row.RateRatio)
			}
			fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%.0f\t%s\t%s\t%.3f\n", row.Scenario, row.P50MS, row.P99MS, row.PerSecond, p, q, row.CPUMS)
		}
		tw.Flush()
	}
}
