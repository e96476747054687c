package answerlink_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/agora-dispatch/agora/pkg/answerlink"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/seal"
)

func minter(t *testing.T) *answerlink.Minter {
	t.Helper()
	m, err := answerlink.New(seal.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestMintOpen(t *testing.T) {
	m := minter(t)
	exp := time.Now().Add(time.Hour)
	tok, err := m.Mint(answerlink.Claims{QuestionID: "q1", Option: "A", Audience: " alice@example.com ", Expires: exp})
	if err != nil {
		t.Fatal(err)
	}
	// Neither the audience nor the question id shows in the token, even
	// base64-encoded (strings long enough not to occur by chance).
	long, err := m.Mint(answerlink.Claims{QuestionID: "q-question-id-in-clear", Option: "A", Audience: "alice@example.com", Expires: exp})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(long, "alice") || strings.Contains(long, "question-id") || strings.Contains(long, base64.RawURLEncoding.EncodeToString([]byte(`"q-question-id`))[:16]) {
		t.Errorf("token %q shows what it carries", long)
	}
	c, err := m.Open(tok, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if c.QuestionID != "q1" || c.Option != "A" || c.Open || c.Audience != "alice@example.com" || c.ID == "" || !c.Expires.Equal(exp.UTC().Truncate(time.Second)) {
		t.Errorf("claims = %+v", c)
	}
	if _, err := m.Open(tok, exp.Add(time.Second)); !errors.Is(err, answerlink.ErrExpired) {
		t.Errorf("after expiry: err = %v, want ErrExpired", err)
	}
	// Two links for the same claims are different links.
	tok2, _ := m.Mint(answerlink.Claims{QuestionID: "q1", Option: "A", Audience: "alice@example.com", Expires: exp})
	c2, _ := m.Open(tok2, time.Now())
	if tok2 == tok || c2.ID == c.ID {
		t.Error("two mints gave the same link id")
	}
}

func TestOpenRefusesForgeries(t *testing.T) {
	m := minter(t)
	tok, err := m.Mint(answerlink.Claims{QuestionID: "q1", Open: true, Audience: "bob", Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	flip := []byte(tok)
	flip[len(flip)/2] ^= 1
	other, _ := minter(t).Mint(answerlink.Claims{QuestionID: "q1", Open: true, Audience: "bob", Expires: time.Now().Add(time.Hour)})
	// A token sealed under the same key for another purpose.
	key := seal.NewKey()
	m2, _ := answerlink.New(key)
	b, _ := seal.DecodeKey(key)
	s, _ := seal.New(b, "v1.")
	foreign, _ := s.Seal(answerlink.Claims{ID: "x", QuestionID: "q1", Open: true, Audience: "bob", Expires: time.Now().Add(time.Hour)})
	for name, tc := range map[string]struct {
		m   *answerlink.Minter
		tok string
	}{
		"empty":           {m, ""},
		"garbage":         {m, "l1.!!!"},
		"one bit flipped": {m, string(flip)},
		"truncated":       {m, tok[:len(tok)-4]},
		"another key":     {m, other},
		"another purpose": {m2, foreign},
		"version removed": {m, strings.TrimPrefix(tok, "l1.")},
	} {
		if _, err := tc.m.Open(tc.tok, time.Now()); !errors.Is(err, answerlink.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

func TestMintRefusesBadClaims(t *testing.T) {
	m := minter(t)
	now := time.Now()
	for name, tc := range map[string]struct {
		c    answerlink.Claims
		want string
	}{
		"no question":      {answerlink.Claims{Option: "A", Audience: "a", Expires: now.Add(time.Hour)}, "question id"},
		"option and open":  {answerlink.Claims{QuestionID: "q", Option: "A", Open: true, Audience: "a", Expires: now.Add(time.Hour)}, "either"},
		"neither":          {answerlink.Claims{QuestionID: "q", Audience: "a", Expires: now.Add(time.Hour)}, "either"},
		"no audience":      {answerlink.Claims{QuestionID: "q", Open: true, Audience: "  ", Expires: now.Add(time.Hour)}, "audience is empty"},
		"control in name":  {answerlink.Claims{QuestionID: "q", Open: true, Audience: "a\nb", Expires: now.Add(time.Hour)}, "printable"},
		"past":             {answerlink.Claims{QuestionID: "q", Open: true, Audience: "a", Expires: now.Add(-time.Second)}, "in the past"},
		"too far":          {answerlink.Claims{QuestionID: "q", Open: true, Audience: "a", Expires: now.Add(answerlink.MaxTTL + time.Hour)}, "away"},
		"no expiry":        {answerlink.Claims{QuestionID: "q", Open: true, Audience: "a"}, "expiry"},
		"audience too big": {answerlink.Claims{QuestionID: "q", Open: true, Audience: strings.Repeat("a", 300), Expires: now.Add(time.Hour)}, "longer"},
	} {
		if _, err := m.Mint(tc.c); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", name, err, tc.want)
		}
	}
	if _, err := answerlink.New("c2hvcnQ="); err == nil || !strings.Contains(err.Error(), "want 32") {
		t.Errorf("short key: err = %v", err)
	}
}

func TestForQuestion(t *testing.T) {
	m := minter(t)
	exp := time.Now().Add(time.Hour)
	for name, tc := range map[string]struct {
		q        lifecycle.Question
		options  []string
		withOpen bool
	}{
		"approval":             {lifecycle.Question{QuestionID: "q", Kind: "approval"}, []string{"approve", "reject"}, false},
		"binding options":      {lifecycle.Question{QuestionID: "q", Kind: "decision", Options: []string{"A", "B"}}, []string{"A", "B"}, false},
		"suggested options":    {lifecycle.Question{QuestionID: "q", Kind: "clarification", Options: []string{"A"}}, []string{"A"}, true},
		"free text":            {lifecycle.Question{QuestionID: "q"}, nil, true},
		"options without kind": {lifecycle.Question{QuestionID: "q", Options: []string{"x"}}, []string{"x"}, false},
	} {
		tc.q.Route = "people"
		links, err := m.ForQuestion("https://agora.example.com/inbox/", tc.q, "carol", "inbox:alice", exp)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var opts []string
		open := false
		for _, l := range links {
			tok, ok := strings.CutPrefix(l.URL, "https://agora.example.com/inbox/a/")
			if !ok {
				t.Fatalf("%s: url %q", name, l.URL)
			}
			c, err := m.Open(tok, time.Now())
			if err != nil || c.QuestionID != "q" || c.Audience != "carol" || c.Option != l.Option || c.Open != l.Open ||
				c.Route != "people" || c.MintedBy != "inbox:alice" || c.AnsweredBy() != "carol (link from inbox:alice)" {
				t.Errorf("%s: link %+v opens as %+v, %v", name, l, c, err)
			}
			if l.Open {
				open = true
			} else {
				opts = append(opts, l.Option)
			}
		}
		if strings.Join(opts, ",") != strings.Join(tc.options, ",") || open != tc.withOpen {
			t.Errorf("%s: options %v open %v, want %v %v", name, opts, open, tc.options, tc.withOpen)
		}
	}
	if _, err := m.ForQuestion("ftp://x", lifecycle.Question{QuestionID: "q"}, "a", "", exp); err == nil {
		t.Error("ftp base URL accepted")
	}
	links, _ := m.ForQuestion("http://127.0.0.1:8080", lifecycle.Question{QuestionID: "q"}, "a", "", exp)
	if len(links) != 1 || !strings.HasPrefix(links[0].URL, "http://127.0.0.1:8080/inbox/a/l1.") {
		t.Errorf("origin base: %+v", links)
	}
}

func TestExpiry(t *testing.T) {
	now := time.Now()
	soon := now.Add(time.Hour)
	far := now.Add(90 * 24 * time.Hour)
	past := now.Add(-time.Hour)
	for name, tc := range map[string]struct {
		deadline *time.Time
		want     time.Time
	}{
		"no deadline": {nil, now.Add(answerlink.DefaultTTL)},
		"deadline":    {&soon, soon},
		"far":         {&far, now.Add(answerlink.MaxTTL)},
		"past":        {&past, now.Add(answerlink.DefaultTTL)},
	} {
		if got := answerlink.Expiry(lifecycle.Question{Deadline: tc.deadline}, now); !got.Equal(tc.want) {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
}

// AnsweredBy names the audience and the minter, within the router's
// 256-byte limit on answered_by, keeping the minter whole.
func TestAnsweredBy(t *testing.T) {
	for _, tc := range []struct {
		c    answerlink.Claims
		want string
	}{
		{answerlink.Claims{Audience: "bob"}, "bob"},
		{answerlink.Claims{Audience: "bob", MintedBy: "inbox:alice"}, "bob (link from inbox:alice)"},
	} {
		if got := tc.c.AnsweredBy(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.c, got, tc.want)
		}
	}
	long := answerlink.Claims{Audience: strings.Repeat("é", 128), MintedBy: "inbox:alice"}.AnsweredBy()
	if len(long) > answerlink.MaxAudienceBytes || !strings.HasSuffix(long, " (link from inbox:alice)") || !utf8.ValidString(long) {
		t.Errorf("a long audience: %d bytes %q", len(long), long)
	}
}
