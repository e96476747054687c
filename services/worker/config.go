package worker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/runtimes"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Config is the worker's configuration, read from AGORA_* variables with
// config.Load. The zero value of every field means its default.
type Config struct {
	// NATSURL is the NATS server to connect to.
	NATSURL string `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222"`
	// NATSCreds is a NATS credentials file.
	NATSCreds string `envconfig:"NATS_CREDS"`
	// Concurrency is the number of dispatches run at once, each slot
	// pulling one message at a time.
	Concurrency int `envconfig:"WORKER_CONCURRENCY" default:"4"`
	// WorkspaceRoot holds one workspace per dispatch.
	WorkspaceRoot string `envconfig:"WORKSPACE_ROOT"`
	// KeepWorkspaces leaves workspaces in place after a dispatch ends.
	KeepWorkspaces bool `envconfig:"WORKER_KEEP_WORKSPACES"`
	// ShutdownTimeout is how long in-flight runs may go on after a stop
	// request before they are cancelled.
	ShutdownTimeout time.Duration `envconfig:"WORKER_SHUTDOWN_TIMEOUT" default:"30s"`
	// SweepInterval is how often the worker removes the workspaces no run
	// holds any more (docs/worker.md, "Workspaces"), beside the sweep at
	// its start. Shorten it to cross live runs with sweeps in a soak.
	SweepInterval time.Duration `envconfig:"WORKER_SWEEP_INTERVAL" default:"5m"`
	// KillGrace is the time between SIGTERM and SIGKILL.
	KillGrace time.Duration `envconfig:"WORKER_KILL_GRACE" default:"5s"`
	// HTTPAddr serves /metrics and /healthz when set.
	HTTPAddr string `envconfig:"WORKER_HTTP_ADDR"`
	// ID names this worker in `started` events; default host-pid.
	ID string `envconfig:"WORKER_ID"`
	// PullExpiry bounds one pull request; a stop waits at most this long
	// for an idle slot.
	PullExpiry time.Duration `envconfig:"WORKER_PULL_EXPIRY" default:"2s"`
	// DisableNeedsInputHelper, when exactly "true", stops the CLI runtimes
	// from laying down their instruction files (the agora-needs-input
	// skill, AGENTS.md, GEMINI.md) and MCP configurations.
	DisableNeedsInputHelper string `envconfig:"DISABLE_NEEDS_INPUT_HELPER"`
	// SandboxLauncher is the launcher binary sub-agents start through;
	// default agora-sandbox next to the worker's executable, else the
	// worker's executable itself (docs/sandbox.md).
	SandboxLauncher string `envconfig:"SANDBOX_LAUNCHER"`
	// SandboxUID is the unprivileged host uid (and gid) a root worker's
	// runs are mapped to; default 1000000000; -1 keeps the worker's own
	// (root without any capability: tests and single-user machines only).
	// A worker that is not root maps runs to its own uid (docs/sandbox.md,
	// "No privilege").
	SandboxUID int `envconfig:"SANDBOX_UID"`

	// SandboxHelper is the agora binary a sandboxed run finds as `agora`
	// on its PATH (for agora needs-input and agora progress); default the
	// worker's own executable when it is agora, else agora next to it.
	SandboxHelper string `envconfig:"SANDBOX_HELPER"`
	// SandboxWorkspace is how a run's workspace_size holds: "tmpfs" (the
	// default where runs have namespaces of their own: a filesystem of that
	// size per run, mounted by a root worker or by the launcher of one that
	// is not, so a write past it fails; its pages count against the run's
	// memory) or "watch" (the size checked once a second; always so without
	// namespaces) (docs/sandbox.md).
	SandboxWorkspace string `envconfig:"SANDBOX_WORKSPACE"`
	// Runtimes holds the executable of each CLI runtime, read from the
	// variable its registry entry names (runtimes.Spec.BinVar:
	// AGORA_WORKER_CLAUDE_BIN, AGORA_WORKER_CODEX_BIN,
	// AGORA_WORKER_GEMINI_BIN), which `agora subagent check` reads too.
	Runtimes runtimes.Config
	// ArtifactMaxFile, ArtifactMaxTotal and ArtifactMaxCount cap the files
	// of one dispatch uploaded from .agora/artifacts/ (sizes as in 64MiB);
	// files past a cap are skipped and listed as skipped
	// (docs/artifacts.md).
	ArtifactMaxFile  string `envconfig:"WORKER_ARTIFACT_MAX_FILE" default:"64MiB"`
	ArtifactMaxTotal string `envconfig:"WORKER_ARTIFACT_MAX_TOTAL" default:"256MiB"`
	ArtifactMaxCount int    `envconfig:"WORKER_ARTIFACT_MAX_COUNT" default:"1000"`
	// SandboxFloor, SandboxAllowPaths and SandboxAllowHosts are the
	// operator's floor (subagent.Floor; docs/sandbox.md, "The operator's
	// floor"): the weakest sandbox mode this worker runs (strict, standard
	// or off), and the path prefixes and destinations a definition's
	// sandbox block may add (empty: any; "none": none). A delivery whose
	// definition is below the floor ends failed rejected and never runs.
	SandboxFloor      string   `envconfig:"SANDBOX_FLOOR" default:"standard"`
	SandboxAllowPaths []string `envconfig:"SANDBOX_ALLOW_PATHS"`
	SandboxAllowHosts []string `envconfig:"SANDBOX_ALLOW_HOSTS"`
}

// Floor returns the operator's sandbox floor the configuration sets.
func (c Config) Floor() subagent.Floor {
	return subagent.Floor{Mode: c.SandboxFloor, Paths: c.SandboxAllowPaths, Hosts: c.SandboxAllowHosts}
}

// Default artifact caps.
const (
	DefaultArtifactMaxFile  = 64 << 20
	DefaultArtifactMaxTotal = 256 << 20
	DefaultArtifactMaxCount = 1000
)

// artifactCaps are the parsed artifact caps.
type artifactCaps struct {
	file, total int64
	count       int
}

func (c Config) artifactCaps() (artifactCaps, error) {
	caps := artifactCaps{file: DefaultArtifactMaxFile, total: DefaultArtifactMaxTotal, count: DefaultArtifactMaxCount}
	var errs []error
	for _, v := range []struct {
		name, val string
		dst       *int64
	}{{"AGORA_WORKER_ARTIFACT_MAX_FILE", c.ArtifactMaxFile, &caps.file}, {"AGORA_WORKER_ARTIFACT_MAX_TOTAL", c.ArtifactMaxTotal, &caps.total}} {
		if v.val == "" {
			continue
		}
		n, err := subagent.ParseSize(v.val)
		if err != nil || n <= 0 {
			errs = append(errs, fmt.Errorf("%s=%q: want a size such as 64MiB", v.name, v.val))
			continue
		}
		*v.dst = n
	}
	switch {
	case c.ArtifactMaxCount < 0:
		errs = append(errs, fmt.Errorf("AGORA_WORKER_ARTIFACT_MAX_COUNT=%d: must not be negative", c.ArtifactMaxCount))
	case c.ArtifactMaxCount > 0:
		caps.count = c.ArtifactMaxCount
	}
	return caps, errors.Join(errs...)
}

// withDefaults gives every zero field its default: its default tag, for
// WorkspaceRoot agora-workspaces in the temporary directory, for ID
// host-pid.
func (c Config) withDefaults() Config {
	c = config.Defaults(c)
	if c.WorkspaceRoot == "" {
		c.WorkspaceRoot = filepath.Join(os.TempDir(), "agora-workspaces")
	}
	if c.ID == "" {
		h, _ := os.Hostname()
		if h == "" {
			h = "worker"
		}
		c.ID = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	return c
}

// Validate reports every problem at once, naming each variable.
func (c Config) Validate() error {
	var errs []error
	if c.Concurrency < 0 || c.Concurrency > 1024 {
		errs = append(errs, fmt.Errorf("AGORA_WORKER_CONCURRENCY=%d: want 1 to 1024", c.Concurrency))
	}
	if c.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("AGORA_WORKER_SHUTDOWN_TIMEOUT=%s: must not be negative", c.ShutdownTimeout))
	}
	if c.KillGrace < 0 {
		errs = append(errs, fmt.Errorf("AGORA_WORKER_KILL_GRACE=%s: must not be negative", c.KillGrace))
	}
	if c.SweepInterval < 0 || (c.SweepInterval > 0 && c.SweepInterval < 100*time.Millisecond) {
		errs = append(errs, fmt.Errorf("AGORA_WORKER_SWEEP_INTERVAL=%s: want at least 100ms", c.SweepInterval))
	}
	if c.PullExpiry < 0 || (c.PullExpiry > 0 && c.PullExpiry < 100*time.Millisecond) {
		errs = append(errs, fmt.Errorf("AGORA_WORKER_PULL_EXPIRY=%s: want at least 100ms", c.PullExpiry))
	}
	if c.WorkspaceRoot != "" && !filepath.IsAbs(c.WorkspaceRoot) {
		errs = append(errs, fmt.Errorf("AGORA_WORKSPACE_ROOT=%q: must be an absolute path", c.WorkspaceRoot))
	}
	if c.SandboxUID < -1 {
		errs = append(errs, fmt.Errorf("AGORA_SANDBOX_UID=%d: want an unprivileged uid, or -1 for the worker's own", c.SandboxUID))
	}
	if c.SandboxWorkspace != "" && c.SandboxWorkspace != "tmpfs" && c.SandboxWorkspace != "watch" {
		errs = append(errs, fmt.Errorf("AGORA_SANDBOX_WORKSPACE=%q: want tmpfs or watch", c.SandboxWorkspace))
	}
	if c.SandboxHelper != "" && !filepath.IsAbs(c.SandboxHelper) {
		errs = append(errs, fmt.Errorf("AGORA_SANDBOX_HELPER=%q: must be an absolute path", c.SandboxHelper))
	}
	if c.SandboxLauncher != "" && !filepath.IsAbs(c.SandboxLauncher) {
		errs = append(errs, fmt.Errorf("AGORA_SANDBOX_LAUNCHER=%q: must be an absolute path", c.SandboxLauncher))
	}
	switch c.DisableNeedsInputHelper {
	case "", "true", "false":
	default:
		errs = append(errs, fmt.Errorf("AGORA_DISABLE_NEEDS_INPUT_HELPER=%q: want exactly true or false", c.DisableNeedsInputHelper))
	}
	if _, err := c.artifactCaps(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Floor().Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
