package subagent

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Sandbox modes (docs/sandbox.md).
const (
	// SandboxStandard is the default: the filesystem limited to the
	// workspace, a private tmp and read-only system paths; TCP connect
	// only to TCPPorts (default 443); resource limits.
	SandboxStandard = "standard"
	// SandboxStrict is standard without default ports and with /etc
	// narrowed to the files programs commonly need.
	SandboxStrict = "strict"
	// SandboxOff runs the sub-agent with only the launcher's process-tree
	// containment. It must be asked for explicitly and is logged as a
	// warning at every dispatch.
	SandboxOff = "off"
)

// Sandbox is a definition's `sandbox:` block. Its zero value is the
// standard mode with default limits. A request can never loosen it.
type Sandbox struct {
	Mode string `json:"mode,omitempty"`
	// ReadPaths and WritePaths are absolute paths the sub-agent may read
	// (and execute), or read and write, besides the defaults.
	ReadPaths  []string `json:"read_paths,omitempty"`
	WritePaths []string `json:"write_paths,omitempty"`
	// TCPPorts are the remote TCP ports the sub-agent may connect to.
	// Unset: 443 in standard mode, none in strict mode. An empty list
	// means none.
	TCPPorts *[]int `json:"tcp_ports,omitempty"`
	// Network lists the destinations the run may reach through the
	// worker's egress proxy (docs/sandbox.md, "Egress proxy"); the run has
	// no other way out of its own network namespace. Unset: none.
	Network Network `json:"network,omitzero"`
	Limits  Limits  `json:"limits,omitempty"`
}

// Network is a definition's egress allow-list: each entry host:port,
// *.domain:port (subdomains only) or an IP address and port.
type Network struct {
	Allow []string `json:"allow,omitempty"`
}

// Limits bound one run. Sizes are bytes with an optional unit (KiB, MiB,
// GiB, KB, MB, GB); zero or empty means the default; "unlimited" lifts a
// limit.
type Limits struct {
	// Memory bounds the address space of each process (RLIMIT_AS) and,
	// where the worker has a cgroup, the run's memory. Default 8GiB.
	Memory string `json:"memory,omitempty"`
	// Processes bounds the run's processes and threads. Default 512.
	Processes int `json:"processes,omitempty"`
	// OpenFiles bounds each process's open files (RLIMIT_NOFILE).
	// Default 4096.
	OpenFiles int `json:"open_files,omitempty"`
	// FileSize bounds any one file a process writes (RLIMIT_FSIZE).
	// Default 1GiB.
	FileSize string `json:"file_size,omitempty"`
	// CPUTime bounds each process's CPU time (RLIMIT_CPU), a duration.
	// Default: the run's timeout.
	CPUTime string `json:"cpu_time,omitempty"`
	// WorkspaceSize bounds the workspace while the run goes on. Default
	// 4GiB.
	WorkspaceSize string `json:"workspace_size,omitempty"`
}

// Limit defaults.
const (
	DefaultMemory        = 8 << 30
	DefaultProcesses     = 512
	DefaultOpenFiles     = 4096
	DefaultFileSize      = 1 << 30
	DefaultWorkspaceSize = 4 << 30
)

// Unlimited is the value of a resolved limit that is lifted.
const Unlimited = -1

// ModeOrDefault returns the sandbox mode, standard when unset.
func (s Sandbox) ModeOrDefault() string {
	if s.Mode == "" {
		return SandboxStandard
	}
	return s.Mode
}

// Ports returns the TCP ports the sub-agent may connect to.
func (s Sandbox) Ports() []int {
	if s.TCPPorts != nil {
		return *s.TCPPorts
	}
	if s.ModeOrDefault() == SandboxStandard {
		return []int{443}
	}
	return nil
}

// Resolved are a run's limits in numbers: bytes, counts and a duration;
// Unlimited (-1) where lifted.
type Resolved struct {
	Memory, FileSize, WorkspaceSize int64
	Processes, OpenFiles            int64
	CPUTime                         time.Duration // 0: unlimited
}

// Resolve turns the limits into numbers, with defaults; timeout is the
// run's timeout, the default CPU time. The limits must be valid.
func (l Limits) Resolve(timeout time.Duration) Resolved {
	size := func(s string, def int64) int64 {
		if s == "" {
			return def
		}
		n, _ := ParseSize(s)
		return n
	}
	count := func(n int, def int64) int64 {
		switch {
		case n == 0:
			return def
		case n < 0:
			return Unlimited
		}
		return int64(n)
	}
	r := Resolved{
		Memory: size(l.Memory, DefaultMemory), FileSize: size(l.FileSize, DefaultFileSize),
		WorkspaceSize: size(l.WorkspaceSize, DefaultWorkspaceSize),
		Processes:     count(l.Processes, DefaultProcesses), OpenFiles: count(l.OpenFiles, DefaultOpenFiles),
		CPUTime: timeout,
	}
	switch l.CPUTime {
	case "":
	case "unlimited":
		r.CPUTime = 0
	default:
		r.CPUTime, _ = time.ParseDuration(l.CPUTime)
	}
	return r
}

// ParseSize reads a size such as 512MiB, 2GB or 1048576; "unlimited" is
// Unlimited.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "unlimited" {
		return Unlimited, nil
	}
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is not a size such as 512MiB or 2GiB", s)
	}
	return n * mult, nil
}

// validate appends the block's problems, each naming its field.
func (s Sandbox) validate(bad func(field, format string, a ...any)) {
	switch s.Mode {
	case "", SandboxStandard, SandboxStrict, SandboxOff:
	default:
		bad("sandbox.mode", "%q: want strict, standard or off", s.Mode)
	}
	for _, f := range []struct {
		name  string
		paths []string
	}{{"sandbox.read_paths", s.ReadPaths}, {"sandbox.write_paths", s.WritePaths}} {
		for _, p := range f.paths {
			if !filepath.IsAbs(p) || filepath.Clean(p) != p {
				bad(f.name, "%q must be a clean absolute path", p)
			} else if p == "/" {
				bad(f.name, "%q would open the whole filesystem; use mode: off if that is meant", p)
			}
		}
	}
	if s.TCPPorts != nil {
		for _, p := range *s.TCPPorts {
			if p < 1 || p > 65535 {
				bad("sandbox.tcp_ports", "%d is not a TCP port", p)
			}
		}
	}
	for _, f := range []struct{ name, v string }{{"sandbox.limits.memory", s.Limits.Memory}, {"sandbox.limits.file_size", s.Limits.FileSize}, {"sandbox.limits.workspace_size", s.Limits.WorkspaceSize}} {
		if f.v != "" {
			if _, err := ParseSize(f.v); err != nil {
				bad(f.name, "%v", err)
			}
		}
	}
	if c := s.Limits.CPUTime; c != "" && c != "unlimited" {
		if d, err := time.ParseDuration(c); err != nil || d < time.Second {
			bad("sandbox.limits.cpu_time", "%q is not a duration of at least 1s, or unlimited", c)
		}
	}
}
