package worker

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/agora-dispatch/agora/internal/sandbox/contain"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// baseAllow are the worker variables every sub-agent inherits.
var baseAllow = []string{"PATH", "HOME", "LANG", "TZ", "TMPDIR"}

// Environment builds a sub-agent's default-deny environment from the
// worker's own (parent, as os.Environ returns it): the base names PATH,
// HOME, LANG, LC_*, TZ and TMPDIR; the names the definition allows; the
// request's env; and the AGORA_* variables that describe the run. Agora's
// own settings (AGORA_*) and NATS settings (NATS_*) never pass, whatever the
// definition or request says.
func Environment(parent []string, def subagent.Definition, reqEnv map[string]string, ws string, dispatchID, threadID string, round int) []string {
	allowed := func(name string) bool {
		if subagent.Reserved(name) {
			return false
		}
		return slices.Contains(baseAllow, name) || strings.HasPrefix(name, "LC_") || slices.Contains(def.EnvAllow, name)
	}
	env := map[string]string{}
	for _, kv := range parent {
		k, v, ok := strings.Cut(kv, "=")
		if ok && allowed(k) {
			env[k] = v
		}
	}
	for k, v := range reqEnv {
		// A request never sets Agora's names, nor a loader or interpreter
		// hook unless the definition allows it (the dispatcher refuses
		// those requests; this holds for messages published past it).
		if subagent.ValidEnvName(k) && !subagent.Reserved(k) && (!subagent.Hook(k) || slices.Contains(def.EnvAllow, k)) {
			env[k] = v
		}
	}
	if env["PATH"] == "" {
		env["PATH"] = contain.DefaultPath
	}
	dir := filepath.Join(ws, ".agora")
	env["AGORA_WORKSPACE"] = ws
	env["AGORA_INPUT_FILE"] = filepath.Join(dir, "input.json")
	env["AGORA_OUTPUT_FILE"] = filepath.Join(dir, "output.json")
	env["AGORA_NEEDS_INPUT_FILE"] = filepath.Join(dir, "needs_input.json")
	env["AGORA_ARTIFACTS_DIR"] = filepath.Join(dir, "artifacts")
	env["AGORA_PROGRESS_FILE"] = filepath.Join(dir, "progress.jsonl")
	env["AGORA_DISPATCH_ID"] = dispatchID
	env["AGORA_THREAD_ID"] = threadID
	env["AGORA_ROUND"] = strconv.Itoa(round)
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// secretValues returns the values a failure detail must never show: those
// of variables the definition allows (typically API keys) and of any
// worker variable whose name looks like a credential.
func secretValues(def subagent.Definition) []string {
	var vals []string
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if len(v) < 4 {
			continue
		}
		u := strings.ToUpper(k)
		if slices.Contains(def.EnvAllow, k) || strings.Contains(u, "TOKEN") || strings.Contains(u, "SECRET") ||
			strings.Contains(u, "PASSWORD") || strings.Contains(u, "KEY") || strings.Contains(u, "CREDS") ||
			strings.HasPrefix(u, "NATS_") || strings.HasPrefix(u, "AGORA_NATS") {
			vals = append(vals, v)
		}
	}
	return vals
}

// redact replaces every secret value in s, longest first, so a secret
// that contains another is not left half shown.
func redact(s string, secrets []string) string {
	secrets = slices.Clone(secrets)
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, v := range secrets {
		s = strings.ReplaceAll(s, v, "[redacted]")
	}
	return s
}
