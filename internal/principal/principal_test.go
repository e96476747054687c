package principal_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/agora-dispatch/agora/internal/principal"
)

func TestScopes(t *testing.T) {
	sum := sha256.Sum256([]byte("tok-a"))
	f := filepath.Join(t.TempDir(), "p.yaml")
	body := "principals:\n  - {name: a, token_sha256: " + hex.EncodeToString(sum[:]) + ", dispatch: [x]}\n  - {name: agents, dispatch: [x], answer: [ops]}\n"
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	set, err := principal.Load([]string{"op"}, f)
	if err != nil {
		t.Fatal(err)
	}
	if set.Open() || set.Len() != 3 {
		t.Fatalf("open %v len %d", set.Open(), set.Len())
	}
	for _, tc := range []struct {
		header, name string
		ok           bool
	}{
		{"Bearer tok-a", "a", true},
		{"bearer   tok-a ", "a", true},
		{"Bearer op", principal.TokenName("op"), true},
		{"Bearer tok-", "", false},
		{"Basic tok-a", "", false},
		{"", "", false},
	} {
		p, ok := set.Authenticate(tc.header)
		if ok != tc.ok || (ok && p.Name != tc.name) {
			t.Errorf("Authenticate(%q) = %+v %v, want %q %v", tc.header, p, ok, tc.name, tc.ok)
		}
	}
	a, _ := set.Authenticate("Bearer tok-a")
	op, _ := set.Authenticate("Bearer op")
	for _, tc := range []struct {
		what string
		got  bool
		want bool
	}{
		{"a dispatches x", a.MayDispatch("x"), true},
		{"a dispatches y", a.MayDispatch("y"), false},
		{"a sees its own", a.MaySee("a"), true},
		{"a sees b's", a.MaySee("b"), false},
		{"a sees an unowned thread", a.MaySee(""), false},
		{"a cancels its own", a.MayCancel("a"), true},
		{"a cancels b's", a.MayCancel("b"), false},
		{"the operator sees b's", op.MaySee("b"), true},
		{"the operator cancels an unowned thread", op.MayCancel(""), true},
		{"the operator dispatches y", op.MayDispatch("y"), true},
		{"a answers any route (no answer scope)", a.MayAnswer("human"), true},
		{"the operator answers any route", op.MayAnswer("ops"), true},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.what, tc.got, tc.want)
		}
	}
	// A principal with no token is only a NATS user's: Named finds it, no
	// header proves it; the operators' tokens name no NATS user.
	if p, ok := set.Named("agents"); !ok || p.MayDispatch("y") || !p.MayDispatch("x") || p.Admin || !p.MayAnswer("ops") || p.MayAnswer("human") {
		t.Errorf("Named(agents) = %+v %v", p, ok)
	}
	if p, ok := set.Named("a"); !ok || p.Name != "a" {
		t.Errorf("Named(a) = %+v %v", p, ok)
	}
	for _, name := range []string{principal.TokenName("op"), "nobody", ""} {
		if p, ok := set.Named(name); ok {
			t.Errorf("Named(%q) = %+v", name, p)
		}
	}
	for _, h := range []string{"Bearer ", "Bearer agents", "Bearer " + string(make([]byte, 32))} {
		if p, ok := set.Authenticate(h); ok {
			t.Errorf("Authenticate(%q) = %+v", h, p)
		}
	}

	// No tokens and no file: the one local admin, any header.
	var none *principal.Set
	if p, ok := none.Authenticate(""); !ok || p.Name != principal.Local || !p.Admin {
		t.Errorf("an open door: %+v %v", p, ok)
	}
}
