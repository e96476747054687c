package subagent_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

func TestCheckFloor(t *testing.T) {
	tests := []struct {
		name  string
		box   subagent.Sandbox
		floor subagent.Floor
		want  []string // fragments of the one problem each; none means allowed
	}{
		{name: "default block, default floor"},
		{name: "strict over the default floor", box: subagent.Sandbox{Mode: subagent.SandboxStrict}},
		{name: "off below the default floor", box: subagent.Sandbox{Mode: subagent.SandboxOff},
			want: []string{`sandbox.mode "off" is below the operator's floor "standard" (AGORA_SANDBOX_FLOOR)`}},
		{name: "off allowed by an off floor", box: subagent.Sandbox{Mode: subagent.SandboxOff}, floor: subagent.Floor{Mode: subagent.SandboxOff}},
		{name: "standard allowed by an off floor", floor: subagent.Floor{Mode: subagent.SandboxOff}},
		{name: "default mode below a strict floor", floor: subagent.Floor{Mode: subagent.SandboxStrict},
			want: []string{`sandbox.mode "standard" is below the operator's floor "strict" (AGORA_SANDBOX_FLOOR)`}},
		{name: "strict at a strict floor", box: subagent.Sandbox{Mode: subagent.SandboxStrict}, floor: subagent.Floor{Mode: subagent.SandboxStrict}},

		{name: "any path by default", box: subagent.Sandbox{ReadPaths: []string{"/etc/ssl"}, WritePaths: []string{"/home/worker"}}},
		{name: "paths under the allowed prefixes", box: subagent.Sandbox{ReadPaths: []string{"/srv"}, WritePaths: []string{"/srv/out/x", "/data"}},
			floor: subagent.Floor{Paths: []string{"/srv", " /data "}}},
		{name: "a path beside a prefix", box: subagent.Sandbox{WritePaths: []string{"/srvx"}}, floor: subagent.Floor{Paths: []string{"/srv"}},
			want: []string{`sandbox.write_paths "/srvx" is not under a path the operator allows (AGORA_SANDBOX_ALLOW_PATHS=/srv)`}},
		{name: "a path above a prefix", box: subagent.Sandbox{ReadPaths: []string{"/srv"}}, floor: subagent.Floor{Paths: []string{"/srv/data"}},
			want: []string{`sandbox.read_paths "/srv"`, "AGORA_SANDBOX_ALLOW_PATHS=/srv/data"}},
		{name: "no path with none", box: subagent.Sandbox{ReadPaths: []string{"/srv"}}, floor: subagent.Floor{Paths: []string{"none"}},
			want: []string{`sandbox.read_paths "/srv"`, "AGORA_SANDBOX_ALLOW_PATHS=none"}},
		{name: "none with no paths asked", floor: subagent.Floor{Paths: []string{"none"}, Hosts: []string{"none"}}},
		{name: "root prefix allows every path", box: subagent.Sandbox{WritePaths: []string{"/etc"}}, floor: subagent.Floor{Paths: []string{"/"}}},

		{name: "any host by default", box: subagent.Sandbox{Network: subagent.Network{Allow: []string{"evil.example:443"}}}},
		{name: "hosts within the allowed patterns",
			box:   subagent.Sandbox{Network: subagent.Network{Allow: []string{"API.anthropic.com:443", "a.b.example.com:443", "*.cdn.example.com:443", "*.example.com:443", "203.0.113.7:443", "[2001:db8::1]:8443"}}},
			floor: subagent.Floor{Hosts: []string{"api.anthropic.com:443", "*.example.com:443", "203.0.113.7:443", "[2001:db8::1]:8443"}}},
		{name: "an apex is not within its wildcard", box: subagent.Sandbox{Network: subagent.Network{Allow: []string{"example.com:443"}}},
			floor: subagent.Floor{Hosts: []string{"*.example.com:443"}},
			want:  []string{`sandbox.network.allow "example.com:443" is not a destination the operator allows (AGORA_SANDBOX_ALLOW_HOSTS=*.example.com:443)`}},
		{name: "a wildcard is not within a name", box: subagent.Sandbox{Network: subagent.Network{Allow: []string{"*.api.example.com:443"}}},
			floor: subagent.Floor{Hosts: []string{"api.example.com:443"}}, want: []string{`"*.api.example.com:443"`}},
		{name: "another port", box: subagent.Sandbox{Network: subagent.Network{Allow: []string{"api.example.com:22"}}},
			floor: subagent.Floor{Hosts: []string{"*.example.com:443", "api.example.com:443"}}, want: []string{`"api.example.com:22"`}},
		{name: "an address is not a name", box: subagent.Sandbox{Network: subagent.Network{Allow: []string{"203.0.113.7:443"}}},
			floor: subagent.Floor{Hosts: []string{"*.example.com:443"}}, want: []string{`"203.0.113.7:443"`}},
		{name: "a suffix that is not a label", box: subagent.Sandbox{Network: subagent.Network{Allow: []string{"badexample.com:443"}}},
			floor: subagent.Floor{Hosts: []string{"*.example.com:443"}}, want: []string{`"badexample.com:443"`}},
		{name: "no host with none", box: subagent.Sandbox{Network: subagent.Network{Allow: []string{"api.example.com:443"}}},
			floor: subagent.Floor{Hosts: []string{"none"}}, want: []string{"AGORA_SANDBOX_ALLOW_HOSTS=none"}},

		{name: "every problem at once",
			box: subagent.Sandbox{Mode: subagent.SandboxOff, ReadPaths: []string{"/etc"}, WritePaths: []string{"/home"},
				Network: subagent.Network{Allow: []string{"evil.example:443"}}},
			floor: subagent.Floor{Paths: []string{"/srv"}, Hosts: []string{"api.anthropic.com:443"}},
			want:  []string{"AGORA_SANDBOX_FLOOR", `sandbox.read_paths "/etc"`, `sandbox.write_paths "/home"`, `sandbox.network.allow "evil.example:443"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.floor.Validate(); err != nil {
				t.Fatalf("floor: %v", err)
			}
			err := tt.box.CheckFloor(tt.floor)
			testkit.CheckErr(t, "CheckFloor", err, tt.want...)
			if err == nil {
				return
			}
			var fe *subagent.FloorError
			if !errors.As(err, &fe) {
				t.Fatalf("CheckFloor = %v, want a *FloorError", err)
			}
			if n := len(tt.want); tt.name == "every problem at once" && len(fe.Problems) != n {
				t.Errorf("%d problems, want %d: %q", len(fe.Problems), n, fe.Problems)
			}
		})
	}
}

func TestFloorValidate(t *testing.T) {
	tests := []struct {
		name  string
		floor subagent.Floor
		want  []string // fragments; none means valid
	}{
		{name: "zero value"},
		{name: "every setting", floor: subagent.Floor{Mode: "strict", Paths: []string{"/srv", " /data", ""}, Hosts: []string{"api.anthropic.com:443", "*.example.com:443", "[::1]:80"}}},
		{name: "none", floor: subagent.Floor{Mode: "off", Paths: []string{"none"}, Hosts: []string{"none"}}},
		{name: "unknown mode", floor: subagent.Floor{Mode: "lax"}, want: []string{`AGORA_SANDBOX_FLOOR="lax": want strict, standard or off`}},
		{name: "relative path", floor: subagent.Floor{Paths: []string{"srv"}}, want: []string{`AGORA_SANDBOX_ALLOW_PATHS: "srv"`}},
		{name: "unclean path", floor: subagent.Floor{Paths: []string{"/srv/../etc"}}, want: []string{`AGORA_SANDBOX_ALLOW_PATHS: "/srv/../etc"`}},
		{name: "none among paths", floor: subagent.Floor{Paths: []string{"none", "/srv"}}, want: []string{`AGORA_SANDBOX_ALLOW_PATHS: "none" must be the only entry`}},
		{name: "host without port", floor: subagent.Floor{Hosts: []string{"api.anthropic.com"}}, want: []string{"AGORA_SANDBOX_ALLOW_HOSTS", "missing port"}},
		{name: "wildcard in the middle", floor: subagent.Floor{Hosts: []string{"a.*.com:443"}}, want: []string{"AGORA_SANDBOX_ALLOW_HOSTS", `"*" is allowed only`}},
		{name: "all at once", floor: subagent.Floor{Mode: "x", Paths: []string{"rel"}, Hosts: []string{"h:0"}},
			want: []string{"AGORA_SANDBOX_FLOOR", "AGORA_SANDBOX_ALLOW_PATHS", "AGORA_SANDBOX_ALLOW_HOSTS"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			testkit.CheckErr(t, "Validate", tt.floor.Validate(), tt.want...)
		})
	}
}

func TestNetworkAllow(t *testing.T) {
	def, err := subagent.Parse([]byte(`
name: fetcher
runtime: exec
command: [./fetch]
sandbox:
  network:
    allow: ["api.anthropic.com:443", "*.githubusercontent.com:443", "203.0.113.7:443", "[2001:db8::1]:443"]
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if got := def.Sandbox.Network.Allow; len(got) != 4 || got[1] != "*.githubusercontent.com:443" {
		t.Errorf("network.allow = %q", got)
	}
	bad := []struct{ entry, want string }{
		{"api.anthropic.com", "missing port"},
		{"api.anthropic.com:0", "not a number from 1 to 65535"},
		{"api.anthropic.com:65536", "not a number from 1 to 65535"},
		{"*.com:443", "at least two labels"},
		{"*.203.0.113.7:443", "not an address"},
		{"a.*.example.com:443", `"*" is allowed only as the first label`},
		{"exa mple.com:443", "character other than"},
		{"[fe80::1%eth0]:443", "zone"},
		{"", "missing port"},
		{"a:b:c", "not host:port"},
	}
	for _, b := range bad {
		t.Run(b.entry, func(t *testing.T) {
			d := valid()
			d.Sandbox.Network.Allow = []string{b.entry}
			err := d.Validate()
			if err == nil {
				t.Fatalf("Validate(%q): nil error", b.entry)
			}
			if !strings.Contains(err.Error(), "sandbox.network.allow") || !strings.Contains(err.Error(), b.want) {
				t.Errorf("error %q does not name sandbox.network.allow and %q", err, b.want)
			}
		})
	}
}
