package seal_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/pkg/seal"
)

type claim struct {
	Question string `json:"q"`
	Option   string `json:"o"`
}

func sealer(t *testing.T, key, version string) *seal.Sealer {
	t.Helper()
	b, err := seal.DecodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	s, err := seal.New(b, version)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSealOpens(t *testing.T) {
	key := seal.NewKey()
	s := sealer(t, key, "l1.")
	tok, err := s.Seal(claim{"q-1", "B"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok, "l1.") || strings.Contains(tok, "q-1") {
		t.Fatalf("token %q: want the version prefix and no plain text", tok)
	}
	var got claim
	if err := sealer(t, key, "l1.").Open(tok, &got); err != nil || got != (claim{"q-1", "B"}) {
		t.Fatalf("Open = %+v, %v", got, err)
	}
}

func TestOpenRefusesWhatThisKeyDidNotSeal(t *testing.T) {
	key := seal.NewKey()
	s := sealer(t, key, "l1.")
	tok, _ := s.Seal(claim{"q-1", "B"})
	flipped := []byte(tok)
	flipped[len(flipped)-3] ^= 1
	for name, c := range map[string]struct {
		s   *seal.Sealer
		tok string
	}{
		"another key":          {sealer(t, seal.NewKey(), "l1."), tok},
		"another version":      {sealer(t, key, "m1."), "m1." + strings.TrimPrefix(tok, "l1.")},
		"a flipped bit":        {s, string(flipped)},
		"truncated":            {s, tok[:len(tok)-4]},
		"the prefix only":      {s, "l1."},
		"not base64":           {s, "l1.***"},
		"shorter than a nonce": {s, "l1.AAAA"},
	} {
		var got claim
		if err := c.s.Open(c.tok, &got); !errors.Is(err, seal.ErrInvalid) {
			t.Errorf("%s: Open = %v, want ErrInvalid", name, err)
		}
	}
}

func TestKeys(t *testing.T) {
	if _, err := seal.DecodeKey("c2hvcnQ="); err == nil || !strings.Contains(err.Error(), "want 32") {
		t.Errorf("a short key: %v", err)
	}
	if _, err := seal.DecodeKey("not base64!"); err == nil || !strings.Contains(err.Error(), "openssl rand -base64 32") {
		t.Errorf("not base64: %v", err)
	}
	if _, err := seal.New(make([]byte, 16), "v1."); err == nil {
		t.Error("New took a 16-byte key")
	}
	if _, err := seal.New(make([]byte, seal.KeySize), ""); err == nil {
		t.Error("New took an empty version")
	}
	if a, b := seal.RandomID(), seal.RandomID(); a == b || len(a) != 24 {
		t.Errorf("RandomID: %q, %q", a, b)
	}
}
