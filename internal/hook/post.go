package hook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/internal/clip"
)

// MaxBackoff bounds the wait between two attempts.
const MaxBackoff = 30 * time.Second

// ErrRedirect is Post's error, wrapped, for a receiver that answered with
// a redirect.
var ErrRedirect = errors.New("redirects are never followed (the signed body would go to another URL)")

// Request is one signed POST.
type Request struct {
	URL     string
	Secret  string
	EventID string
	Body    []byte
	// Header holds more headers to send (User-Agent, say).
	Header http.Header
}

// NoRedirects makes a copy of hc (a fresh client with timeout when nil)
// that never follows a redirect: following it would send the signed body
// and its signature to a URL nobody configured.
func NoRedirects(hc *http.Client, timeout time.Duration) *http.Client {
	c := &http.Client{Timeout: timeout}
	if hc != nil {
		cp := *hc
		c = &cp
	}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return c
}

// Post sends r once through hc (made with NoRedirects), signed at the
// moment it is sent. It reports a Retry-After the receiver asked for (on
// a 429 or 503), and whether the failure is one a retry cannot fix: a
// redirect, or a 4xx other than 408 and 429.
func Post(ctx context.Context, hc *http.Client, r Request) (retryAfter time.Duration, permanent bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL, bytes.NewReader(r.Body))
	if err != nil {
		return 0, true, err
	}
	for k, v := range r.Header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(EventIDHeader, r.EventID)
	req.Header.Set(SignatureHeader, Sign(r.Secret, r.Body, time.Now()))
	resp, err := hc.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return 0, false, nil
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		retryAfter = ParseRetryAfter(resp.Header.Get("Retry-After"))
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return 0, true, fmt.Errorf("%s answered %s to %s: %w", r.URL, resp.Status, clip.String(resp.Header.Get("Location"), 200), ErrRedirect)
	}
	permanent = resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusRequestTimeout && resp.StatusCode != http.StatusTooManyRequests
	return retryAfter, permanent, fmt.Errorf("%s answered %s: %s", r.URL, resp.Status, strings.TrimSpace(clip.String(string(msg), 200)))
}

// Backoff is the wait after failed attempt number attempt (1 first):
// first, doubling, at most MaxBackoff.
func Backoff(first time.Duration, attempt int) time.Duration {
	d := first
	for i := 1; i < attempt && d < MaxBackoff; i++ {
		d *= 2
	}
	return min(d, MaxBackoff)
}

// ParseRetryAfter reads Retry-After in seconds or as an HTTP date, capped
// at 5 minutes.
func ParseRetryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 0 {
		return min(time.Duration(n)*time.Second, 5*time.Minute)
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(time.Until(t), 0), 5*time.Minute)
	}
	return 0
}

// Sleep waits d, or until ctx ends (false).
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// CheckDelivery checks the settings of a delivery that POSTs with retries,
// as every door that does checks them: attempts from 1 to 100, a first
// backoff of at least 10ms, a timeout of at least 100ms. The names are
// the settings' own, for the errors.
func CheckDelivery(attempts int, backoff, timeout time.Duration, attemptsName, backoffName, timeoutName string) []error {
	var errs []error
	if attempts < 1 || attempts > 100 {
		errs = append(errs, fmt.Errorf("%s=%d: want 1 to 100", attemptsName, attempts))
	}
	if backoff < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("%s=%s: want at least 10ms", backoffName, backoff))
	}
	if timeout < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("%s=%s: want at least 100ms", timeoutName, timeout))
	}
	return errs
}
