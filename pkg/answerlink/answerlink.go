// Package answerlink mints and opens signed answer links: a URL that
// answers one question with one option (or opens a form for a free-text
// answer) for whoever the link was sent to, through any channel that
// carries a link (e-mail, chat, SMS). The inbox serves them at
// /inbox/a/<token> (docs/inbox.md).
//
// A token seals {link id, question id, option or open, audience, the
// question's route, who minted it, expiry}
// with AES-256-GCM under a key shared by whoever mints links and the inbox
// that serves them (AGORA_ANSWER_LINK_KEY), so it cannot be forged or
// altered, and says nothing readable to whoever intercepts it. Opening a
// link (GET) never answers: it shows a confirmation page, because mail
// scanners fetch links. Answering (POST) records the link id in the KV
// bucket agora_answer_links first, so each link answers once; the
// answer's answered_by names the audience and who minted the link for
// them (AnsweredBy). A link answers only on the route it was minted for:
// once its question moves to another route, or its minter may no longer
// answer that route, the inbox refuses it (docs/inbox.md).
package answerlink

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/seal"
)

// Path is where the inbox serves a link; the token follows it.
const Path = "/inbox/a/"

// version prefixes every token and is authenticated with it, so no other
// token sealed under the same key opens as a link.
const version = "l1."

// Limits on what a link carries.
const (
	// MaxTTL bounds how long a link lasts.
	MaxTTL = 30 * 24 * time.Hour
	// DefaultTTL is a link's life when the question has no deadline.
	DefaultTTL = 7 * 24 * time.Hour
	// MaxAudienceBytes matches the router's limit on answered_by.
	MaxAudienceBytes = 256
)

// Errors of Open. Neither changes anything.
var (
	ErrInvalid = errors.New("answerlink: the link is not one Agora issued (tampered, truncated or signed with another key)")
	ErrExpired = errors.New("answerlink: the link has expired")
)

// Claims is what a link carries.
type Claims struct {
	// ID is random and names the link's single-use record.
	ID         string `json:"id"`
	QuestionID string `json:"q"`
	// Option is the option (a choice) or the decision (approve or reject,
	// for an approval) the link answers with. Empty when Open.
	Option string `json:"o,omitempty"`
	// Open makes the link open a form for an answer in the person's own
	// words (and, for an approval, a decision and a comment).
	Open bool `json:"open,omitempty"`
	// Audience is who the link was sent to; it becomes answered_by.
	Audience string `json:"aud"`
	// Route is the route the question was on when the link was minted:
	// the link answers it only there. Empty in links minted before
	// routes were sealed.
	Route string `json:"r,omitempty"`
	// MintedBy names who minted the link for the audience: an inbox user
	// as inbox:<name>, the webhook notifier as webhook:<route>.
	MintedBy string    `json:"by,omitempty"`
	Expires  time.Time `json:"exp"`
	// ShownDigest is the question's shown digest when the link was
	// minted (lifecycle.Question.ShownDigest): the link answers only the
	// question as it was then, and its answer carries it to the router
	// (docs/answering.md, "Bound answers"). Empty in links minted before
	// links were bound.
	ShownDigest string `json:"sd,omitempty"`
}

// MaxMintedByBytes bounds Claims.MintedBy.
const MaxMintedByBytes = 128

// AnsweredBy is who an answer through the link is recorded as: the
// audience, and who sent them the link, as "bob@corp (link from
// inbox:alice)" — the audience is the minter's word, the minter is
// proven by their sign-in.
func (c Claims) AnsweredBy() string {
	if c.MintedBy == "" {
		return c.Audience
	}
	suffix := " (link from " + c.MintedBy + ")"
	if n := MaxAudienceBytes - len(suffix); len(c.Audience) > n {
		return lifecycle.Clip(c.Audience, n-len("…")) + suffix
	}
	return c.Audience + suffix
}

func (c Claims) check() error {
	switch {
	case c.QuestionID == "":
		return errors.New("answerlink: the question id is empty")
	case c.Open == (c.Option != ""):
		return errors.New("answerlink: a link carries either an option or open, not both or neither")
	case strings.TrimSpace(c.Audience) == "":
		return errors.New("answerlink: the audience is empty; name who the link is for (it becomes answered_by)")
	case len(c.Audience) > MaxAudienceBytes:
		return fmt.Errorf("answerlink: the audience is longer than %d bytes", MaxAudienceBytes)
	case !utf8.ValidString(c.Audience) || strings.IndexFunc(c.Audience, unicode.IsControl) >= 0:
		return errors.New("answerlink: the audience must be printable UTF-8 text")
	case len(c.MintedBy) > MaxMintedByBytes:
		return fmt.Errorf("answerlink: who minted the link is longer than %d bytes", MaxMintedByBytes)
	case !utf8.ValidString(c.MintedBy) || strings.IndexFunc(c.MintedBy, unicode.IsControl) >= 0:
		return errors.New("answerlink: who minted the link must be printable UTF-8 text")
	case c.Expires.IsZero():
		return errors.New("answerlink: the expiry is not set")
	}
	return nil
}

// Minter mints and opens links with one key. It is safe for concurrent
// use.
type Minter struct{ s *seal.Sealer }

// New returns a Minter for key: 32 random bytes in base64, as in
// AGORA_ANSWER_LINK_KEY (e.g. `openssl rand -base64 32`).
func New(key string) (*Minter, error) {
	b, err := seal.DecodeKey(key)
	if err != nil {
		return nil, fmt.Errorf("answerlink: key: %w", err)
	}
	s, err := seal.New(b, version)
	if err != nil {
		return nil, fmt.Errorf("answerlink: %w", err)
	}
	return &Minter{s: s}, nil
}

// Mint seals c into a token (the last part of the link's path). It fills
// c.ID when empty, and refuses an expiry in the past or beyond MaxTTL.
func (m *Minter) Mint(c Claims) (string, error) {
	if c.ID == "" {
		c.ID = seal.RandomID()
	}
	c.Audience = strings.TrimSpace(c.Audience)
	if err := c.check(); err != nil {
		return "", err
	}
	now := time.Now()
	if !c.Expires.After(now) {
		return "", fmt.Errorf("answerlink: the expiry %s is in the past", c.Expires.Format(time.RFC3339))
	}
	if c.Expires.After(now.Add(MaxTTL + time.Minute)) {
		return "", fmt.Errorf("answerlink: the expiry %s is more than %s away", c.Expires.Format(time.RFC3339), MaxTTL)
	}
	c.Expires = c.Expires.UTC().Truncate(time.Second)
	return m.s.Seal(c)
}

// Open verifies a token at now and returns its claims: ErrInvalid for a
// token this key did not mint, ErrExpired (with the claims) after its
// expiry. It does not consume the link.
func (m *Minter) Open(token string, now time.Time) (Claims, error) {
	var c Claims
	if err := m.s.Open(token, &c); err != nil || c.ID == "" || c.check() != nil {
		return Claims{}, ErrInvalid
	}
	if !now.Before(c.Expires) {
		return c, ErrExpired
	}
	return c, nil
}

// Link is one signed link for a question.
type Link struct {
	// Option is what the link answers with; empty for the open link.
	Option string `json:"option,omitempty"`
	// Open is set on the link that opens a form for the person's own
	// answer.
	Open bool   `json:"open,omitempty"`
	URL  string `json:"url"`
}

// Choices returns what links a question gets: its options (approve and
// reject for an approval), and open when an answer in the person's own
// words is allowed (no options, or options that are suggestions).
func Choices(q lifecycle.Question) (options []string, open bool) {
	switch {
	case q.KindIs(lifecycle.QuestionApproval):
		return []string{"approve", "reject"}, false
	case len(q.Options) == 0:
		return nil, true
	default:
		return q.Options, q.Kind == "clarification" || q.Kind == "information"
	}
}

// Expiry returns a link's default expiry for q: its deadline, or
// DefaultTTL from now when it has none, never beyond MaxTTL.
func Expiry(q lifecycle.Question, now time.Time) time.Time {
	exp := now.Add(DefaultTTL)
	if q.Deadline != nil && q.Deadline.After(now) {
		exp = *q.Deadline
	}
	if limit := now.Add(MaxTTL); exp.After(limit) {
		return limit
	}
	return exp
}

// ForQuestion mints every link of q (see Choices) for audience, by
// mintedBy (Claims.MintedBy), sealed to q's route, valid until expires,
// under baseURL, the inbox as people open it (e.g.
// https://agora.example.com/inbox, or its origin).
func (m *Minter) ForQuestion(baseURL string, q lifecycle.Question, audience, mintedBy string, expires time.Time) ([]Link, error) {
	base, err := linkBase(baseURL)
	if err != nil {
		return nil, err
	}
	options, open := Choices(q)
	var out []Link
	add := func(c Claims) error {
		tok, err := m.Mint(c)
		if err != nil {
			return err
		}
		out = append(out, Link{Option: c.Option, Open: c.Open, URL: base + tok})
		return nil
	}
	for _, o := range options {
		if err := add(Claims{QuestionID: q.QuestionID, Option: o, Audience: audience, Route: q.Route, MintedBy: mintedBy, Expires: expires, ShownDigest: q.ShownDigest}); err != nil {
			return nil, err
		}
	}
	if open {
		if err := add(Claims{QuestionID: q.QuestionID, Open: true, Audience: audience, Route: q.Route, MintedBy: mintedBy, Expires: expires, ShownDigest: q.ShownDigest}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// linkBase turns the inbox's URL (with or without its /inbox path) into
// the prefix of its links.
func linkBase(baseURL string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(baseURL))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("answerlink: base URL %q: want the inbox's http or https URL, as in https://agora.example.com/inbox", baseURL)
	}
	p := strings.TrimSuffix(u.Path, "/")
	p = strings.TrimSuffix(p, "/inbox")
	return u.Scheme + "://" + u.Host + p + Path, nil
}
