package main_test

import (
	"strings"
	"testing"
)

// `agora subagent apply` refuses a definition below the operator's floor as
// its environment sets it, naming the setting, and stores nothing; what it
// lets through, the dispatcher (here agora dev, with the default floor)
// refuses anyway.
func TestSubagentApplyBelowTheFloor(t *testing.T) {
	t.Parallel()
	const loose = "name: loose\nruntime: exec\ncommand: [/bin/true]\nsandbox: {mode: \"off\"}\n"
	for _, tc := range []struct {
		name, yaml string
		env        []string
		want       []string
	}{
		{"mode off under the default floor", loose, nil,
			[]string{"below the operator's sandbox floor", `sandbox.mode "off" is below the operator's floor "standard" (AGORA_SANDBOX_FLOOR)`}},
		{"standard under a strict floor", "name: plain\nruntime: exec\ncommand: [/bin/true]\n", []string{"AGORA_SANDBOX_FLOOR=strict"},
			[]string{`sandbox.mode "standard" is below the operator's floor "strict" (AGORA_SANDBOX_FLOOR)`}},
		{"a path outside the allowed ones", "name: wide\nruntime: exec\ncommand: [/bin/true]\nsandbox: {write_paths: [/etc]}\n", []string{"AGORA_SANDBOX_ALLOW_PATHS=/srv"},
			[]string{`sandbox.write_paths "/etc" is not under a path the operator allows (AGORA_SANDBOX_ALLOW_PATHS=/srv)`}},
		{"a destination when none may be added", "name: reach\nruntime: exec\ncommand: [/bin/true]\nsandbox: {network: {allow: [\"evil.test:443\"]}}\n", []string{"AGORA_SANDBOX_ALLOW_HOSTS=none"},
			[]string{`sandbox.network.allow "evil.test:443"`, "(AGORA_SANDBOX_ALLOW_HOSTS=none)"}},
		{"an invalid floor setting", loose, []string{"AGORA_SANDBOX_FLOOR=lax"}, []string{`AGORA_SANDBOX_FLOOR="lax": want strict, standard or off`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := agoraWith(t, append(agoraEnv(t), tc.env...), "subagent", "apply", "-f", writeFile(t, "def.yaml", tc.yaml))
			if r.code == 0 || r.stdout != "" {
				t.Fatalf("applied below the floor: %s", r)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q: %s", w, r.stderr)
				}
			}
		})
	}
	if r := agora(t, "subagent", "get", "loose"); r.code != 1 {
		t.Fatalf("a refused definition was stored: %s", r)
	}

	// An operator whose own floor is off may store it; the dispatcher's
	// floor (standard) still refuses to dispatch it.
	mustAgoraWith(t, append(agoraEnv(t), "AGORA_SANDBOX_FLOOR=off"), "subagent", "apply", "-f", writeFile(t, "loose.yaml", loose))
	r := agora(t, "dispatch", "loose", "--wait")
	if r.code != 1 || !strings.Contains(r.stderr, `sandbox.mode "off" is below the operator's floor "standard" (AGORA_SANDBOX_FLOOR)`) {
		t.Errorf("dispatch of a definition below the dispatcher's floor: %s", r)
	}

	// A request's timeout can only shorten its definition's.
	mustAgora(t, "subagent", "apply", "-f", writeFile(t, "brief.yaml", "name: brief\nruntime: exec\ncommand: [/bin/true]\ntimeout: 2m\n"))
	r = agora(t, "dispatch", "brief", "--timeout", "1000h")
	if r.code != 1 || !strings.Contains(r.stderr, `"1000h" is longer than the sub-agent's timeout 2m`) {
		t.Errorf("dispatch with a longer timeout: %s", r)
	}
}

// mustAgoraWith runs the binary with env and fails the test unless it
// exits 0.
func mustAgoraWith(t testing.TB, env []string, args ...string) result {
	t.Helper()
	r := agoraWith(t, env, args...)
	if r.code != 0 {
		t.Fatalf("agora %s: %s", strings.Join(args, " "), r)
	}
	return r
}
