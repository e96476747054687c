// Package principal is who calls Agora's HTTP doors and what they may
// do: the one check the HTTP API and MCP over HTTP make (docs/security.md,
// "Principals and scopes").
//
// A principal is named, proven by a bearer token (the principals file
// holds its SHA-256, never the token), and scoped: the sub-agents it may
// dispatch, whether it sees only the threads it dispatched (the default)
// or every thread, and whether it is an admin (sees and cancels
// everything). A thread belongs to the principal that dispatched its
// first round.
package principal

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Local is the principal of a door that takes no tokens (loopback only):
// the one user of `agora dev`, an admin.
const Local = "local"

// Principal is one caller and its scope.
type Principal struct {
	Name string
	// Dispatch lists the sub-agents it may dispatch; nil means all.
	Dispatch []string
	// SeeAll lets it read, follow and list every thread, not only its own.
	SeeAll bool
	// Answer lists the routes whose questions it may answer (of the
	// threads it may see); nil means all.
	Answer []string
	// Admin lets it see and cancel every thread and dispatch anything.
	Admin bool
}

// MayAnswer reports whether p may answer a question on route.
func (p *Principal) MayAnswer(route string) bool {
	return p.Admin || p.Answer == nil || slices.Contains(p.Answer, route)
}

// MayDispatch reports whether p may dispatch sub-agent name.
func (p *Principal) MayDispatch(name string) bool {
	return p.Admin || p.Dispatch == nil || slices.Contains(p.Dispatch, name)
}

// MaySee reports whether p may read a thread that owner dispatched. A
// thread with no owner (dispatched through the NATS API, which names no
// caller) is seen by admins and principals that see all.
func (p *Principal) MaySee(owner string) bool {
	return p.Admin || p.SeeAll || (owner != "" && owner == p.Name)
}

// MayCancel reports whether p may cancel a thread that owner dispatched.
func (p *Principal) MayCancel(owner string) bool {
	return p.Admin || (owner != "" && owner == p.Name)
}

// Set is the principals a door accepts. The zero value (and nil) accepts
// no token; Open reports whether the door then runs without tokens.
type Set struct {
	list   []*Principal
	hashes [][32]byte // hashes[i] proves list[i]
}

// Open reports whether the set holds no principal: the door takes no
// token and every caller is the Local admin (loopback only).
func (s *Set) Open() bool { return s == nil || len(s.list) == 0 }

// Len is how many principals the set holds.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.list)
}

// Authenticate returns the principal whose token is the bearer token of
// header (an Authorization header's value). Every hash is compared, in
// constant time, so neither a token's content nor its length leaks.
func (s *Set) Authenticate(header string) (*Principal, bool) {
	if s.Open() {
		return &Principal{Name: Local, Admin: true}, true
	}
	const prefix = "bearer "
	if len(header) <= len(prefix) || !strings.EqualFold(header[:len(prefix)], prefix) {
		return nil, false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(header[len(prefix):])))
	found := -1
	for i, h := range s.hashes {
		if subtle.ConstantTimeCompare(sum[:], h[:]) == 1 && h != noToken {
			found = i
		}
	}
	if found < 0 {
		return nil, false
	}
	return s.list[found], true
}

// noToken stands in the hashes for a principal with no token: no token
// proves it over HTTP.
var noToken [32]byte

// Named returns the principal of the principals file called name: who a
// NATS user of that name is on its own API subjects (docs/security.md,
// "The NATS API"). The tokens of AGORA_API_TOKENS name no NATS user.
func (s *Set) Named(name string) (*Principal, bool) {
	if s == nil || strings.HasPrefix(name, "token-") {
		return nil, false
	}
	for _, p := range s.list {
		if p.Name == name {
			return p, true
		}
	}
	return nil, false
}

// TokenName is the principal name of a token from AGORA_API_TOKENS:
// token- and the first 8 hex digits of its SHA-256.
func TokenName(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "token-" + hex.EncodeToString(sum[:4])
}

// file is the principals file's shape.
type file struct {
	Principals []struct {
		Name        string   `yaml:"name"`
		TokenSHA256 string   `yaml:"token_sha256"`
		Dispatch    []string `yaml:"dispatch"`
		Answer      []string `yaml:"answer"`
		See         string   `yaml:"see"`
		Admin       bool     `yaml:"admin"`
	} `yaml:"principals"`
}

// Load builds the set of a door: each of tokens (AGORA_API_TOKENS) is an
// admin named TokenName (the operators' tokens), and path, when not
// empty, is a principals file (docs/security.md shows one). Every problem
// is reported at once, naming the file, the principal and the field.
func Load(tokens []string, path string) (*Set, error) {
	s := &Set{}
	for _, t := range tokens {
		s.add(&Principal{Name: TokenName(t), Admin: true}, sha256.Sum256([]byte(t)))
	}
	if path == "" {
		return s, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("principals file: %w", err)
	}
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("principals file %s: %w (want principals: [{name, token_sha256, dispatch, answer, see, admin}])", path, err)
	}
	var errs []error
	names := map[string]bool{}
	for i, p := range f.Principals {
		where := fmt.Sprintf("principals file %s: principals[%d]", path, i)
		if p.Name != "" {
			where += fmt.Sprintf(" (%s)", p.Name)
		}
		bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(where+": "+format, a...)) }
		switch {
		case !subagent.ValidName(p.Name):
			bad("name %q: want 1-64 letters, digits, '-' or '_'", p.Name)
		case p.Name == Local || strings.HasPrefix(p.Name, "token-"):
			bad("name %q is reserved (local and token-… name the tokenless door and AGORA_API_TOKENS)", p.Name)
		case names[p.Name]:
			bad("name %q is given twice", p.Name)
		}
		names[p.Name] = true
		var h [32]byte
		if p.TokenSHA256 == "" {
			// No token: a principal only the NATS API reaches, as the NATS
			// user of its name (Named).
			h = noToken
		} else if raw, err := hex.DecodeString(p.TokenSHA256); err != nil || len(raw) != 32 || [32]byte(raw) == noToken {
			bad("token_sha256: want the 64 hex digits of the token's SHA-256 (printf %%s \"$TOKEN\" | sha256sum), or none for a principal only the NATS API reaches")
		} else {
			copy(h[:], raw)
			if slices.Contains(s.hashes, h) {
				bad("token_sha256: the same token proves another principal")
			}
		}
		for _, d := range p.Dispatch {
			if d != "*" && !subagent.ValidName(d) {
				bad("dispatch: %q is not a sub-agent name (or * for all)", d)
			}
		}
		for _, r := range p.Answer {
			if r != "*" && !subagent.ValidName(r) {
				bad("answer: %q is not a route name (or * for all)", r)
			}
		}
		pr := &Principal{Name: p.Name, Admin: p.Admin}
		if p.Dispatch != nil && !slices.Contains(p.Dispatch, "*") {
			pr.Dispatch = slices.Clone(p.Dispatch)
		}
		if p.Answer != nil && !slices.Contains(p.Answer, "*") {
			pr.Answer = slices.Clone(p.Answer)
		}
		switch p.See {
		case "", "own":
		case "all":
			pr.SeeAll = true
		default:
			bad("see: %q: want own (the threads it dispatched; the default) or all", p.See)
		}
		s.add(pr, h)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Set) add(p *Principal, h [32]byte) {
	s.list = append(s.list, p)
	s.hashes = append(s.hashes, h)
}
