package inbox

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/internal/problem"

	"golang.org/x/crypto/bcrypt"

	"github.com/agora-dispatch/agora/pkg/client"
)

// Cookie, form and header names.
const (
	sessionCookie = "agora_inbox_session"
	// loginCookie carries the login form's CSRF token before there is a
	// session (double submit).
	loginCookie = "agora_inbox_login"
	csrfField   = "csrf"
	// CSRFHeader carries the session's CSRF token on a JSON API POST made
	// with the session cookie (the page's script reads it from the
	// csrf-token meta tag). Requests with a bearer token need none.
	CSRFHeader = "X-CSRF-Token"
)

// randomToken returns 32 random bytes, base64url-encoded.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// identity is who makes a request.
type identity struct {
	user *user
	// sess is the session; nil for the dev token used as a bearer token.
	sess *session
	// bearer reports an Authorization header: no cookie, so no CSRF risk.
	bearer bool
}

// valid reports whether the identity may still act (its session was not
// signed out and has not expired).
func (id *identity) valid() bool { return id.sess == nil || id.sess.valid() }

// signedOut is closed when the identity's session is signed out; nil (never
// ready) for the dev token.
func (id *identity) signedOut() <-chan struct{} {
	if id.sess == nil {
		return nil
	}
	return id.sess.done
}

// csrf returns the token forms and script must send back.
func (id *identity) csrf() string {
	if id.sess == nil {
		return ""
	}
	return id.sess.csrf
}

type identityKey struct{}

func withIdentity(ctx context.Context, id *identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// authenticate finds who makes r: a bearer token (the dev token, or a
// session token from POST /inbox/api/login) or the session cookie. ok is
// false when neither is valid; a present but invalid bearer token is not
// overridden by a cookie. Other Authorization schemes (a proxy's Basic
// auth) are left alone.
func (s *Server) authenticate(r *http.Request) (*identity, bool) {
	if tok, found := cutPrefixFold(r.Header.Get("Authorization"), "bearer "); found {
		tok = strings.TrimSpace(tok)
		if s.devToken != "" && equal(tok, s.devToken) {
			return &identity{user: s.devUser, bearer: true}, true
		}
		if sess, u, ok := s.session(r.Context(), tok); ok {
			return &identity{user: u, sess: sess, bearer: true}, true
		}
		return nil, false
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil, false
	}
	sess, u, ok := s.session(r.Context(), c.Value)
	if !ok {
		return nil, false
	}
	return &identity{user: u, sess: sess}, true
}

// session finds the session of token and the user it signed in, as the
// users file says now: a user removed from the file (and reloaded) is
// signed out.
func (s *Server) session(ctx context.Context, token string) (*session, *user, bool) {
	sess, ok := s.sessions.lookup(ctx, token)
	if !ok {
		return nil, nil, false
	}
	u, ok := s.userNamed(sess.user)
	if !ok {
		return nil, nil, false
	}
	return sess, u, true
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return s, false
	}
	return s[len(prefix):], true
}

// equal compares secrets in constant time.
func equal(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1 && a != "" && b != ""
}

// checkPassword finds the user named name with this password.
func (s *Server) checkPassword(name, password string) (*user, bool) {
	u, ok := (*s.users.Load())[name]
	hash := dummyHash()
	if ok {
		hash = u.hash
	}
	if err := bcrypt.CompareHashAndPassword(hash, []byte(password)); err != nil || !ok {
		return nil, false
	}
	return u, true
}

// checkCredentials signs in with a name and password (users file) or the
// dev token.
func (s *Server) checkCredentials(name, password, token string) (*user, bool) {
	if s.devToken != "" {
		if equal(token, s.devToken) {
			return s.devUser, true
		}
		return nil, false
	}
	return s.checkPassword(name, password)
}

// secure reports whether r came over TLS, directly or through a proxy.
func secure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

func (s *Server) setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge time.Duration) {
	c := &http.Cookie{
		Name: name, Value: value, Path: Prefix,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure(r),
	}
	switch {
	case maxAge > 0:
		c.MaxAge = int(maxAge / time.Second)
		c.Expires = time.Now().Add(maxAge)
	case maxAge < 0:
		c.MaxAge = -1
		c.Expires = time.Unix(1, 0)
	}
	http.SetCookie(w, c)
}

// page wraps a page handler: without a sign-in the browser is sent to the
// login page, which comes back here.
func (s *Server) page(h func(http.ResponseWriter, *http.Request, *identity)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := s.authenticate(r)
		if !ok {
			next := r.URL.Path
			if r.Method != http.MethodGet {
				next = Prefix + "/"
			} else if r.URL.RawQuery != "" {
				next += "?" + r.URL.RawQuery
			}
			http.Redirect(w, r, Prefix+"/login?next="+url.QueryEscape(next), http.StatusSeeOther)
			return
		}
		h(w, r.WithContext(withIdentity(r.Context(), id)), id)
	})
}

// form wraps a page's POST handler: it also checks the form's CSRF token.
func (s *Server) form(h func(http.ResponseWriter, *http.Request, *identity)) http.Handler {
	return s.page(func(w http.ResponseWriter, r *http.Request, id *identity) {
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			s.errorPage(w, r, id, http.StatusBadRequest, "The form could not be read", err.Error())
			return
		}
		if id.bearer || !equal(r.PostForm.Get(csrfField), id.csrf()) {
			s.metrics.csrfRefused.Inc()
			s.errorPage(w, r, id, http.StatusForbidden, "This form has expired",
				"The form's security token is missing or out of date. Go back, reload the page and try again.")
			return
		}
		h(w, r, id)
	})
}

// api wraps a JSON API handler: 401 without a sign-in; a POST made with
// the session cookie must carry the CSRF header.
func (s *Server) api(h func(http.ResponseWriter, *http.Request, *identity)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := s.authenticate(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="agora-inbox"`)
			problem.Write(w, r, &client.Problem{Type: client.ProblemUnauthorized, Title: "Unauthorized", Status: http.StatusUnauthorized,
				Detail: "sign in: the session cookie, or Authorization: Bearer <token> (the dev token, or a token from POST " + Prefix + "/api/login)"})
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead && !id.bearer && !equal(r.Header.Get(CSRFHeader), id.csrf()) {
			s.metrics.csrfRefused.Inc()
			problem.Write(w, r, &client.Problem{Type: ProblemForbidden, Title: "Forbidden", Status: http.StatusForbidden,
				Detail: "a request made with the session cookie needs the " + CSRFHeader + " header (the csrf-token of the page)"})
			return
		}
		h(w, r.WithContext(withIdentity(r.Context(), id)), id)
	})
}

// safeNext returns where to go after signing in: a path inside the inbox,
// never another site.
func safeNext(next string) string {
	const home = Prefix + "/"
	if next == "" || strings.ContainsAny(next, "\\\r\n") || strings.Contains(next, "//") {
		return home
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil {
		return home
	}
	// A dot segment (written plainly or %2e-encoded, the path decoded)
	// would lead out of the inbox once the browser resolves it:
	// /inbox/../../evil is /evil.
	clean := path.Clean(u.Path)
	if strings.HasSuffix(u.Path, "/") && clean != "/" {
		clean += "/"
	}
	if clean != u.Path {
		return home
	}
	if u.Path != Prefix && !strings.HasPrefix(u.Path, home) {
		return home
	}
	if strings.HasPrefix(u.Path, Prefix+"/login") || strings.HasPrefix(u.Path, Prefix+"/logout") {
		return home
	}
	return next
}
