package contain

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/egress"
	"github.com/agora-dispatch/agora/internal/sandbox"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// The policy of one run (docs/sandbox.md, "Namespaces: a box of its own"
// and "The definition's sandbox: block"): what its root shows, its limits
// and its network, built from the definition's sandbox block.

// System paths a sandboxed run may read and execute.
var (
	systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/sys/devices/system/cpu"}
	strictEtc  = []string{"/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group", "/etc/localtime", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ssl", "/etc/ca-certificates", "/etc/alternatives", "/etc/os-release", "/etc/mime.types"}
	deviceRW   = []string{"/dev/null", "/dev/zero", "/dev/full"}
	deviceRO   = []string{"/dev/urandom", "/dev/random"}
)

// helperPath is where a sandboxed run finds the agora binary; its folder
// leads the run's PATH. proxyPort is the egress proxy's port on the run's
// own loopback.
const (
	helperPath = "/run/agora/bin/agora"
	proxyPort  = 3128
)

// DefaultPath is a sub-agent's PATH when the worker has none.
const DefaultPath = "/usr/local/bin:/usr/bin:/bin"

// egressRules are the destinations the definition lets the run reach
// through the egress proxy (docs/sandbox.md, "Egress proxy").
func egressRules(sb subagent.Sandbox) []string {
	if sb.ModeOrDefault() == subagent.SandboxStrict {
		return nil
	}
	return sb.Network.Allow
}

// Prepare lays the box out for workspace ws, whose folders the worker has
// made: the launcher policy, the binds of the run's root, the egress proxy
// and the run's cgroups. pathEnv is the sub-agent's PATH, which the run
// keeps after the helper's folder.
func (b *Box) Prepare(ws, pathEnv string) error {
	if b.mode == subagent.SandboxOff {
		return nil
	}
	ns := b.isolation == sandbox.ModeNamespaces
	p := sandbox.Policy{Landlock: true, Rlimits: map[string]uint64{}, Root: ns, Loopback: ns, Seccomp: ns}
	p.WriteDirs = append([]string{ws}, b.def.Sandbox.WritePaths...)
	p.ReadDirs = append(append([]string{}, systemDirs...), b.def.Sandbox.ReadPaths...)
	if b.mode == subagent.SandboxStrict {
		p.ReadFiles = append(p.ReadFiles, strictEtc...)
	} else {
		p.ReadDirs = append(p.ReadDirs, "/etc")
	}
	if b.privateProc {
		p.ReadDirs = append(p.ReadDirs, "/proc")
	}
	// Absolute paths the definition's command names (a script given to
	// an interpreter, a config file) are readable: the definition's author
	// chose them.
	for _, a := range b.def.Command {
		if !filepath.IsAbs(a) {
			continue
		}
		if fi, err := os.Stat(a); err == nil && fi.IsDir() {
			p.ReadDirs = append(p.ReadDirs, a)
		} else if err == nil {
			p.ReadFiles = append(p.ReadFiles, a)
		}
	}
	if ns {
		if err := b.namespacePolicy(&p, pathEnv); err != nil {
			return err
		}
	} else {
		p.WriteFiles = deviceRW
		p.ReadFiles = append(p.ReadFiles, deviceRO...)
	}
	p.TCPConnect = append(p.TCPConnect, b.ports...)
	l := b.limits
	set := func(name string, v int64) {
		if v > 0 {
			p.Rlimits[name] = uint64(v)
		}
	}
	set("as", l.Memory)
	if b.nprocLimit() {
		set("nproc", l.Processes)
	}
	set("nofile", l.OpenFiles)
	set("fsize", l.FileSize)
	if l.CPUTime > 0 {
		set("cpu", int64((l.CPUTime+time.Second-1)/time.Second))
	}
	b.policy = p
	if b.useCgroups {
		return b.makeCgroups()
	}
	return nil
}

// nprocLimit reports whether the run's processes are bounded by
// RLIMIT_NPROC rather than a cgroup: a run in a user namespace of its own
// without a cgroup (a worker that is not root). RLIMIT_NPROC counts the
// tasks of a uid in its user namespace, which is the run's own
// (docs/sandbox.md, "Limits").
func (b *Box) nprocLimit() bool {
	return b.isolation == sandbox.ModeNamespaces && !b.useCgroups && b.limits.Processes > 0
}

// namespacePolicy adds to p what a run in namespaces of its own gets: the
// binds its root shows, its private /tmp and /dev/shm, the agora helper
// and the egress proxy (docs/sandbox.md, "Namespaces").
func (b *Box) namespacePolicy(p *sandbox.Policy, pathEnv string) error {
	// The run's root shows these paths of the host and nothing else
	// (the launcher makes /proc, /dev, /tmp and /dev/shm itself).
	for _, d := range p.ReadDirs {
		if d != "/proc" {
			b.binds = append(b.binds, sandbox.Bind{Host: d, Target: d})
		}
	}
	for _, f := range p.ReadFiles {
		b.binds = append(b.binds, sandbox.Bind{Host: f, Target: f})
	}
	for _, d := range p.WriteDirs {
		b.binds = append(b.binds, sandbox.Bind{Host: d, Target: d, Write: true})
	}
	if b.fs == WorkspaceLauncher && len(p.WriteDirs) > 0 {
		p.Workspace, p.WorkspaceSize = p.WriteDirs[0], uint64(b.limits.WorkspaceSize)
	}
	p.WriteDirs = append(p.WriteDirs, "/tmp", "/dev/shm")
	if helper := b.host.helper; helper != "" {
		b.binds = append(b.binds, sandbox.Bind{Host: helper, Target: helperPath})
		p.ReadFiles = append(p.ReadFiles, helperPath)
		b.env["PATH"] = filepath.Dir(helperPath) + ":" + subagentPath(pathEnv)
	}
	if exe := b.host.exe; exe != "" {
		// The require_input MCP server the claude-code runtime starts.
		b.binds = append(b.binds, sandbox.Bind{Host: exe, Target: exe})
		p.ReadFiles = append(p.ReadFiles, exe)
	}
	p.WriteFiles = deviceRW
	p.ReadFiles = append(p.ReadFiles, deviceRO...)
	// The network is the run's own: loopback, and the egress proxy on
	// 127.0.0.1:proxyPort when the definition allows destinations.
	if len(b.egress) > 0 {
		cfg := b.host.egress
		cfg.Allow, cfg.Logger = b.egress, b.log
		px, err := egress.New(cfg)
		if err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
		b.proxy = px
		p.ProxyPort = proxyPort
		proxy := "http://127.0.0.1:" + strconv.Itoa(proxyPort)
		for _, k := range []string{"HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY", "all_proxy"} {
			b.env[k] = proxy
		}
		b.env["NO_PROXY"], b.env["no_proxy"] = "localhost,127.0.0.1,::1", "localhost,127.0.0.1,::1"
		p.TCPConnect = append(p.TCPConnect, proxyPort)
	}
	return nil
}

// findHelper finds the agora binary runs get as `agora`: configured,
// else exe (the worker's own executable) when it is agora, else agora
// next to it; "" when there is none.
func findHelper(configured, exe string) string {
	if configured != "" {
		return configured
	}
	if exe == "" {
		return ""
	}
	if filepath.Base(exe) == "agora" {
		return exe
	}
	p := filepath.Join(filepath.Dir(exe), "agora")
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return p
	}
	return ""
}

// subagentPath is the PATH a sandboxed run keeps after the helper's
// folder.
func subagentPath(p string) string {
	if p == "" {
		return DefaultPath
	}
	return p
}

// absPath finds absolute paths in a program's error output.
var absPath = regexp.MustCompile(`/[A-Za-z0-9._+@-]+(?:/[A-Za-z0-9._+@-]+)+`)

// FailureNote says, for a run that could not start or died without a
// sentinel, which paths its command needs that the sandbox hides and the
// read_paths line that would show them (docs/sandbox.md, "Checking a
// definition"); "" when it finds none. It resolves the command as
// CheckDefinition does — the #! chain, symbolic links to their targets,
// shims, env lookups — so a hidden interpreter is named even when the
// error names only the script; failing that, it names the hidden paths
// output mentions.
func (b *Box) FailureNote(output string) string {
	if b == nil || b.isolation != sandbox.ModeNamespaces || b.mode == subagent.SandboxOff {
		return ""
	}
	rep := CheckDefinition(b.def, os.Environ())
	if rep.Denied() && len(rep.Add) > 0 {
		var hidden []string
		for _, st := range rep.Steps {
			if st.Status == CheckDenied && len(hidden) < 5 {
				hidden = append(hidden, st.Path+" ("+st.Why+")")
			}
		}
		return fmt.Sprintf(" (the sandbox does not show %s to the run: to allow it, add sandbox.read_paths: [%s] to the definition; agora subagent check %s lists every path its command needs)",
			strings.Join(hidden, ", "), strings.Join(rep.Add, ", "), b.def.Name)
	}
	return b.hiddenNote(output)
}

// hiddenNote names the paths a failed run's output mentions that exist on
// the worker's host but are not in the run's root, and the read_paths line
// that would show them (a program that dies on a path the sandbox hides
// rarely says so itself).
func (b *Box) hiddenNote(output string) string {
	var hidden []string
	for _, p := range absPath.FindAllString(output, 50) {
		p = filepath.Clean(p)
		if slices.Contains(hidden, p) || b.shows(p) {
			continue
		}
		if _, err := os.Lstat(p); err == nil {
			hidden = append(hidden, p)
		}
		if len(hidden) == 5 {
			break
		}
	}
	if len(hidden) == 0 {
		return ""
	}
	// The paths come from what the run printed, so no link of them is
	// followed to its target: that is the host's to keep. The command's
	// own links are followed by FailureNote's check, from the definition.
	dirs := make([]string, 0, len(hidden))
	for _, p := range hidden {
		d := p
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			d = filepath.Dir(p)
		}
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return fmt.Sprintf(" (the sandbox does not show %s to the run: to allow it, add sandbox.read_paths: [%s] to the definition; agora subagent check lists every path a command needs)",
		strings.Join(hidden, ", "), strings.Join(dirs, ", "))
}

// shows reports whether the run's root shows path p.
func (b *Box) shows(p string) bool {
	if p == "/proc" || strings.HasPrefix(p, "/proc/") || p == helperPath {
		return true // the run's own /proc; the helper
	}
	for _, bd := range b.binds {
		if p == bd.Target || strings.HasPrefix(p, strings.TrimSuffix(bd.Target, "/")+"/") {
			return true
		}
	}
	return false
}

// EgressNote says what the run's egress proxy refused (the first few
// destinations, each once), or, for a run whose output shows a failed
// name lookup, how egress works in the sandbox: a program that dies on a
// refused connection rarely says which destination it wanted, nor why
// (docs/sandbox.md, "Egress proxy"). "" when there is nothing to say.
func (b *Box) EgressNote(output string) string {
	if b == nil || b.mode == subagent.SandboxOff {
		return ""
	}
	var parts []string
	if b.proxy != nil {
		for _, r := range b.proxy.Refusals() {
			switch {
			case r.Reason == egress.ReasonNotAllowed:
				parts = append(parts, fmt.Sprintf("egress to %s refused: add it to sandbox.network.allow", r.Target))
			case r.Status == http.StatusForbidden:
				parts = append(parts, fmt.Sprintf("egress to %s refused: %s", r.Target, clip.String(strings.TrimPrefix(r.Reason, "egress: "), 200)))
			default:
				parts = append(parts, fmt.Sprintf("egress to %s failed: %s", r.Target, clip.String(strings.TrimPrefix(r.Reason, "egress: "), 200)))
			}
		}
	}
	if len(parts) == 0 && lookupFailed.MatchString(output) {
		if b.proxy == nil {
			parts = append(parts, "the run has no network: its definition allows no destination; egress goes through Agora's proxy to the destinations sandbox.network.allow names")
		} else {
			parts = append(parts, "name resolution inside the run fails by design: egress goes through the proxy in HTTPS_PROXY, which resolves the destinations sandbox.network.allow names")
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

// lookupFailed matches what programs print when a name does not resolve.
var lookupFailed = regexp.MustCompile(`(?i)could not resolve host|temporary failure in name resolution|name or service not known|no such host|getaddrinfo|nodename nor servname|name resolution`)
