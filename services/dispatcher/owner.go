package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/agora-dispatch/agora/internal/principal"
	"github.com/agora-dispatch/agora/internal/problem"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Whose thread it is (docs/security.md, "Principals and scopes"): every
// /v1 request is made by a principal, proven by its bearer token; a
// thread belongs to the principal that dispatched its first round (the
// root record's principal). A principal that may not see a thread gets
// the 404 of an id that does not exist, so ids tell it nothing.

type principalKey struct{}

// auth authenticates the bearer token (internal/principal, in constant
// time) and serves h as that principal.
func (s *Service) auth(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := s.principals.Authenticate(r.Header.Get("Authorization"))
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="agora"`)
			problem.Write(w, r, &client.Problem{Type: client.ProblemUnauthorized, Title: "Unauthorized", Status: http.StatusUnauthorized,
				Detail: "send Authorization: Bearer <token> with a token of AGORA_API_TOKENS, or one whose SHA-256 a principal of AGORA_PRINCIPALS_FILE holds"})
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}

// caller is the principal auth put in r's context.
func caller(r *http.Request) *principal.Principal {
	if p, ok := r.Context().Value(principalKey{}).(*principal.Principal); ok {
		return p
	}
	return &principal.Principal{Name: principal.Local, Admin: true} // a handler mounted without auth
}

// ownerOf returns the principal whose thread threadID is; empty for a
// thread dispatched through the NATS API or with no root record.
func (s *Service) ownerOf(ctx context.Context, b *bindings, threadID string) (string, error) {
	rec, _, err := b.store.get(ctx, threadID)
	switch {
	case errors.Is(err, errNoRecord):
		return "", nil
	case err != nil:
		return "", err
	}
	return rec.Principal, nil
}

// allowThread returns nil when p may see thread threadID (and, with
// cancel, cancel it); otherwise the 404 of an unknown what id when p may
// not see it, or a 403 when it may see but not cancel it.
func (s *Service) allowThread(ctx context.Context, b *bindings, p *principal.Principal, what, id, threadID string, cancel bool) error {
	if p.Admin || (p.SeeAll && !cancel) || !idRE.MatchString(threadID) {
		return nil
	}
	owner, err := s.ownerOf(ctx, b, threadID)
	if err != nil {
		return err
	}
	return s.allowOwner(p, what, id, threadID, owner, cancel)
}

// allowOwner is allowThread once the thread's owner is known.
func (s *Service) allowOwner(p *principal.Principal, what, id, threadID, owner string, cancel bool) error {
	if !p.MaySee(owner) {
		return s.gone(what, id)
	}
	if cancel && !p.MayCancel(owner) {
		return &client.Problem{Type: client.ProblemForbidden, Title: "Forbidden", Status: http.StatusForbidden,
			Detail: fmt.Sprintf("principal %s may see thread %s but not cancel it: only the principal that dispatched it (%s) or an admin may", p.Name, threadID, owner)}
	}
	return nil
}

// allowDispatch is allowThread for the thread of dispatch id. An id that
// is malformed or has no record is left to the handler, which says so.
func (s *Service) allowDispatch(ctx context.Context, b *bindings, p *principal.Principal, id string, cancel bool) error {
	if p.Admin || (p.SeeAll && !cancel) || !idRE.MatchString(id) {
		return nil
	}
	threadID, owner, found, err := s.dispatchOwner(ctx, b, id)
	if err != nil || !found {
		return err
	}
	return s.allowOwner(p, "dispatch", id, threadID, owner, cancel)
}

// dispatchOwner returns the thread of dispatch id and that thread's owner;
// found is false when id has no record. A root holds its thread's owner
// itself, so only a later round reads a second record.
func (s *Service) dispatchOwner(ctx context.Context, b *bindings, id string) (threadID, owner string, found bool, err error) {
	rec, _, err := b.store.get(ctx, id)
	switch {
	case errors.Is(err, errNoRecord):
		return "", "", false, nil
	case err != nil:
		return "", "", false, err
	}
	if rec.ThreadID == id {
		return id, rec.Principal, true, nil
	}
	owner, err = s.ownerOf(ctx, b, rec.ThreadID)
	return rec.ThreadID, owner, err == nil, err
}

// natsCaller is who calls the NATS API on subject (docs/security.md, "The
// NATS API"). NATS tells a service no caller, so the subject does, as the
// users' grants allow: agora.api.<verb> is for trusted users (nil: no
// check, and Agora-Principal names whose thread a dispatch starts);
// agora.api.<verb>.<user>, granted to user alone, is the principal of
// that name in AGORA_PRINCIPALS_FILE, or else one of the default scope
// (dispatches any sub-agent, sees and cancels its own threads).
func (s *Service) natsCaller(subject string) *principal.Principal {
	switch subject {
	case lifecycle.APIDispatch, lifecycle.APICancel, lifecycle.APIStatus:
		return nil
	}
	_, user, ok := lifecycle.ParseAPICaller(subject)
	if !ok || len(user) > 64 {
		// Not a principal's name: a caller that may do nothing.
		return &principal.Principal{Name: "-", Dispatch: []string{}}
	}
	if p, ok := s.principals.Named(user); ok {
		return p
	}
	return &principal.Principal{Name: user}
}

// mayDispatch refuses, with a 403 naming the scope, a sub-agent p may not
// dispatch.
func mayDispatch(p *principal.Principal, subagent string) *client.Problem {
	if p.MayDispatch(subagent) {
		return nil
	}
	return &client.Problem{Type: client.ProblemForbidden, Title: "Forbidden", Status: http.StatusForbidden,
		Detail: fmt.Sprintf("principal %s may not dispatch sub-agent %q: its dispatch scope is %v (AGORA_PRINCIPALS_FILE)", p.Name, subagent, p.Dispatch)}
}
