// Package subagent defines a sub-agent: what a worker runs for a dispatch
// (docs/subagents.md, "Definition rules"). Definitions are written as YAML or
// JSON, validated here, and stored as JSON in the agora_subagents key-value
// bucket under their name.
package subagent

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/template"
	"time"

	"sigs.k8s.io/yaml"
)

// The runtimes every worker offers. A definition may name another runtime
// that workers announce (docs/subagents.md, "Writing a runtime").
const (
	RuntimeExec       = "exec"        // run Command
	RuntimeClaudeCode = "claude-code" // run the claude CLI with Prompt
	RuntimeCodex      = "codex"       // run the codex CLI with Prompt
	RuntimeGeminiCLI  = "gemini-cli"  // run the gemini CLI with Prompt
)

// BuiltinRuntimes lists the runtimes every worker offers.
var BuiltinRuntimes = []string{RuntimeExec, RuntimeClaudeCode, RuntimeCodex, RuntimeGeminiCLI}

// ValidRuntime reports whether name can name a runtime: 1-64 lowercase
// letters, digits and '-', starting with a letter.
func ValidRuntime(name string) bool {
	if len(name) == 0 || len(name) > 64 || name[0] < 'a' || name[0] > 'z' {
		return false
	}
	for _, r := range name {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return false
		}
	}
	return true
}

// Permission modes of the CLI runtimes (docs/subagents.md).
const (
	PermissionDefault = ""       // the CLI's own approvals off (claude-code: --dangerously-skip-permissions): the sub-agent runs unattended in Agora's sandbox
	PermissionStrict  = "strict" // the CLI keeps its own approvals (claude-code: no --dangerously-skip-permissions)
)

// DefaultTimeout applies when neither the definition nor the request sets one.
const DefaultTimeout = 30 * time.Minute

// DefaultMaxRounds applies when neither the definition nor the request sets one.
const DefaultMaxRounds = 10

// Definition is a sub-agent definition.
type Definition struct {
	Name        string            `json:"name"`
	Runtime     string            `json:"runtime"`
	Command     []string          `json:"command,omitempty"`
	Prompt      string            `json:"prompt,omitempty"`
	Model       string            `json:"model,omitempty"`
	Permission  string            `json:"permission_mode,omitempty"`
	Timeout     string            `json:"timeout,omitempty"`
	EnvAllow    []string          `json:"env_allow,omitempty"`
	Files       map[string]string `json:"files,omitempty"`
	MaxRounds   int               `json:"max_rounds,omitempty"`
	Description string            `json:"description,omitempty"`
	Sandbox     Sandbox           `json:"sandbox,omitzero"`
}

var (
	nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)
	envRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// ValidName reports whether s can name a sub-agent: 1–64 letters, digits,
// '-' or '_', starting with a letter or digit (it is a subject token and a
// key).
func ValidName(s string) bool { return nameRE.MatchString(s) }

// ValidEnvName reports whether s is a portable environment variable name.
func ValidEnvName(s string) bool { return envRE.MatchString(s) }

// Reserved reports whether an environment variable name is Agora's own or a
// credential a sub-agent must never be given: AGORA_* and NATS_*.
func Reserved(name string) bool {
	u := strings.ToUpper(name)
	return strings.HasPrefix(u, "AGORA_") || strings.HasPrefix(u, "NATS_")
}

// Hook reports whether an environment variable name makes a loader or an
// interpreter run code of the setter's choosing (LD_PRELOAD, BASH_ENV,
// NODE_OPTIONS, PYTHONSTARTUP, …) or changes which programs run (PATH). A
// request may set one only when the definition's env_allow lists it.
func Hook(name string) bool {
	u := strings.ToUpper(name)
	for _, p := range []string{"LD_", "DYLD_", "PYTHON", "PERL5", "RUBY", "NODE_", "GCONV_", "GIO_", "GTK_"} {
		if strings.HasPrefix(u, p) {
			return true
		}
	}
	switch u {
	case "PATH", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "IFS", "CDPATH",
		"JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_EXEC_PATH",
		"LOCPATH", "NLSPATH", "HOSTALIASES", "RESOLV_HOST_CONF", "TMPDIR", "HOME":
		return true
	}
	return false
}

// Parse decodes a YAML or JSON definition and validates it. The error
// reports every problem at once: each key that is no field, with its line
// and the field it most likely meant, a value of the wrong type, and what
// Validate finds in the rest.
func Parse(b []byte) (Definition, error) {
	unknown := unknownKeys(b)
	var d Definition
	if err := yaml.Unmarshal(b, &d); err != nil {
		return Definition{}, fmt.Errorf("subagent: %w", errors.Join(unknown, decodeError(err)))
	}
	verr := d.Validate()
	switch {
	case unknown == nil && verr == nil:
		return d, nil
	case unknown == nil:
		return Definition{}, verr
	}
	return Definition{}, fmt.Errorf("subagent: %w", errors.Join(unknown, verr))
}

// decodeError says what sigs.k8s.io/yaml's error says, in the terms of a
// YAML definition rather than its JSON decoder's.
func decodeError(err error) error {
	msg := err.Error()
	for _, p := range []string{"error unmarshaling JSON: ", "while decoding JSON: ", "json: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	msg = strings.ReplaceAll(msg, "Go struct field ", "field ")
	return errors.New("YAML: " + msg)
}

// ParseFile reads, parses and validates the definition in the file at path,
// then resolves its command against the file's folder (see ResolveCommand),
// so a definition names its scripts as the files beside it, wherever it is
// applied from. Resolved lists the arguments it changed, "old → new".
func ParseFile(path string) (d Definition, resolved []string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Definition{}, nil, fmt.Errorf("subagent: %w", err)
	}
	if d, err = Parse(b); err != nil {
		return Definition{}, nil, err
	}
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return Definition{}, nil, fmt.Errorf("subagent: %w", err)
	}
	d, resolved = d.ResolveCommand(dir)
	return d, resolved, nil
}

// ResolveCommand returns d with every relative path in its command made
// absolute against dir, the folder of the file the definition came from.
// The worker runs the command in the dispatch's workspace, where a path
// relative to the definition file means nothing. An argument counts as a
// relative path when it contains a '/', does not start with '-', and names
// a file that exists under dir; others (a program found on PATH such as
// "sh", flags, a file the definition's files lay down in the workspace) are
// left as they are. See docs/subagents.md, "Definition rules".
func (d Definition) ResolveCommand(dir string) (Definition, []string) {
	var resolved []string
	cmd := slices.Clone(d.Command)
	for i, a := range cmd {
		if a == "" || filepath.IsAbs(a) || strings.HasPrefix(a, "-") || !strings.Contains(a, "/") {
			continue
		}
		if _, ok := d.Files[path.Clean(a)]; ok {
			continue
		}
		abs := filepath.Join(dir, a)
		if _, err := os.Stat(abs); err != nil {
			continue
		}
		cmd[i] = abs
		resolved = append(resolved, a+" → "+abs)
	}
	d.Command = cmd
	return d, resolved
}

// TimeoutDuration returns the definition's timeout, or DefaultTimeout.
func (d Definition) TimeoutDuration() time.Duration {
	t, err := time.ParseDuration(d.Timeout)
	if err != nil || t <= 0 {
		return DefaultTimeout
	}
	return t
}

// Rounds returns the definition's round limit, or DefaultMaxRounds.
func (d Definition) Rounds() int {
	if d.MaxRounds > 0 {
		return d.MaxRounds
	}
	return DefaultMaxRounds
}

// Validate reports every problem in d at once, each naming its field.
func (d Definition) Validate() error {
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, a...)))
	}
	if !ValidName(d.Name) {
		bad("name", "%q must be 1-64 letters, digits, '-' or '_'", d.Name)
	}
	switch d.Runtime {
	case RuntimeExec:
		if len(d.Command) == 0 || d.Command[0] == "" {
			bad("command", "required for runtime exec")
		}
	case RuntimeClaudeCode, RuntimeCodex, RuntimeGeminiCLI:
		if strings.TrimSpace(d.Prompt) == "" {
			bad("prompt", "required for runtime %s", d.Runtime)
		}
	case "":
		bad("runtime", "required: %s, or a runtime the workers announce", strings.Join(BuiltinRuntimes, ", "))
	default:
		if !ValidRuntime(d.Runtime) {
			bad("runtime", "%q is not a runtime name: 1-64 lowercase letters, digits and '-', starting with a letter (%s, or a runtime the workers announce)", d.Runtime, strings.Join(BuiltinRuntimes, ", "))
		}
	}
	if d.Prompt != "" {
		if _, err := template.New("prompt").Option("missingkey=zero").Parse(d.Prompt); err != nil {
			bad("prompt", "%v", err)
		}
	}
	switch d.Permission {
	case PermissionDefault, PermissionStrict:
	default:
		bad("permission_mode", "%q: want empty or strict", d.Permission)
	}
	if d.Timeout != "" {
		if t, err := time.ParseDuration(d.Timeout); err != nil || t <= 0 {
			bad("timeout", "%q is not a positive duration such as 30m", d.Timeout)
		}
	}
	for _, n := range d.EnvAllow {
		switch {
		case !ValidEnvName(n):
			bad("env_allow", "%q is not a valid variable name", n)
		case Reserved(n):
			bad("env_allow", "%q is reserved: a sub-agent never sees AGORA_* or NATS_* settings", n)
		}
	}
	for p := range d.Files {
		if err := ValidFilePath(p); err != nil {
			bad("files", "%v", err)
		}
	}
	if d.MaxRounds < 0 {
		bad("max_rounds", "%d is negative", d.MaxRounds)
	}
	d.Sandbox.validate(bad)
	d.Sandbox.Network.validate(bad)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("subagent %q: %w", d.Name, err)
	}
	return nil
}

// ValidFilePath checks a path in Files: relative, clean of "..", and not
// inside .agora (Agora's own control files).
func ValidFilePath(p string) error {
	if p == "" {
		return errors.New("empty file path")
	}
	if filepath.IsAbs(p) || strings.HasPrefix(p, "/") || strings.HasPrefix(p, `\`) {
		return fmt.Errorf("%q is absolute", p)
	}
	c := path.Clean(filepath.ToSlash(p))
	if c == "." || c == ".." || strings.HasPrefix(c, "../") {
		return fmt.Errorf("%q escapes the workspace", p)
	}
	if c == ".agora" || strings.HasPrefix(c, ".agora/") {
		return fmt.Errorf("%q is inside .agora, which Agora owns", p)
	}
	return nil
}
