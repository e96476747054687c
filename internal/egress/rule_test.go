package egress_test

import (
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/internal/egress"
	"github.com/agora-dispatch/agora/internal/testkit"
)

func TestParseRuleErrors(t *testing.T) {
	for _, tc := range []struct {
		rule, want string
	}{
		{"", "empty"},
		{" ", "empty"},
		{"example.com", "missing port"},
		{"example.com:", "missing port"},
		{"example.com:https", `port "https" is not a number`},
		{"example.com:0", `port "0" is not a number from 1 to 65535`},
		{"example.com:65536", `port "65536"`},
		{"example.com:-1", `port "-1"`},
		{":443", "empty host"},
		{"*:443", `"*" is allowed only as the first label`},
		{"*.:443", "empty host"},
		{"*.com:443", "at least two labels"},
		{"api.*.example.com:443", `"*" is allowed only as the first label`},
		{"*example.com:443", `"*" is allowed only as the first label`},
		{"*.10.0.0.1:443", "needs a domain, not an address"},
		{"exa mple.com:443", "character other than"},
		{"ex..ample.com:443", "empty label"},
		{"[fe80::1%eth0]:443", "zone"},
		{"http://example.com:443", "not host:port"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			_, err := egress.ParseRule(tc.rule)
			if err == nil {
				t.Fatalf("ParseRule(%q) succeeded", tc.rule)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) || !strings.HasPrefix(msg, "egress: rule ") || !strings.Contains(msg, "want host:port, *.domain:port or ip:port") {
				t.Errorf("ParseRule(%q) = %q, want it to contain %q and the expected form", tc.rule, msg, tc.want)
			}
		})
	}
}

func TestParseRuleString(t *testing.T) {
	for _, tc := range []struct{ rule, want string }{
		{"API.Example.COM:443", "api.example.com:443"},
		{"example.com.:8443", "example.com:8443"},
		{"*.Example.com:443", "*.example.com:443"},
		{"203.0.113.7:443", "203.0.113.7:443"},
		{"[2001:DB8::1]:443", "[2001:db8::1]:443"},
		{"[::ffff:203.0.113.7]:443", "203.0.113.7:443"},
		{"under_score.example:443", "under_score.example:443"},
	} {
		r, err := egress.ParseRule(tc.rule)
		if err != nil {
			t.Errorf("ParseRule(%q): %v", tc.rule, err)
			continue
		}
		if got := r.String(); got != tc.want {
			t.Errorf("ParseRule(%q).String() = %q, want %q", tc.rule, got, tc.want)
		}
	}
}

func TestRuleMatch(t *testing.T) {
	for _, tc := range []struct {
		rule string
		host string
		port int
		want bool
	}{
		{"api.example.com:443", "api.example.com", 443, true},
		{"api.example.com:443", "API.Example.Com", 443, true},
		{"api.example.com:443", "api.example.com.", 443, true},
		{"api.example.com:443", "api.example.com", 80, false},
		{"api.example.com:443", "x.api.example.com", 443, false},
		{"api.example.com:443", "example.com", 443, false},
		{"api.example.com:443", "api.example.com.evil.test", 443, false},

		{"*.example.com:443", "api.example.com", 443, true},
		{"*.example.com:443", "a.b.example.com", 443, true},
		{"*.example.com:443", "API.EXAMPLE.COM", 443, true},
		{"*.example.com:443", "example.com", 443, false}, // the apex is not a subdomain
		{"*.example.com:443", "badexample.com", 443, false},
		{"*.example.com:443", "example.com.evil.test", 443, false},
		{"*.example.com:443", "api.example.com", 8443, false},
		{"*.example.com:443", ".example.com", 443, false},
		{"*.example.com:443", "203.0.113.7", 443, false},

		{"203.0.113.7:443", "203.0.113.7", 443, true},
		{"203.0.113.7:443", "::ffff:203.0.113.7", 443, true},
		{"203.0.113.7:443", "203.0.113.8", 443, false},
		{"203.0.113.7:443", "203.0.113.7", 80, false},
		{"[2001:db8::1]:443", "2001:DB8:0::1", 443, true},
		{"[2001:db8::1]:443", "fe80::1%eth0", 443, false},

		{"api.example.com:443", "bad host", 443, false},
		{"api.example.com:443", "api.example.com", 0, false},
		{"api.example.com:443", "api.example.com", 65536 + 443, false},
	} {
		r, err := egress.ParseRule(tc.rule)
		if err != nil {
			t.Fatalf("ParseRule(%q): %v", tc.rule, err)
		}
		if got := r.Match(tc.host, tc.port); got != tc.want {
			t.Errorf("%q.Match(%q, %d) = %v, want %v", tc.rule, tc.host, tc.port, got, tc.want)
		}
	}
}

func TestNewReportsEveryProblem(t *testing.T) {
	_, err := egress.New(egress.Config{
		Allow:    []string{"ok.example:443", "no-port.example", "*.com:443"},
		MaxConns: -1,
	})
	testkit.CheckErr(t, "New", err, `"no-port.example": missing port`, `"*.com:443"`, "MaxConns -1")
}
