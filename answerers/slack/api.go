package slack

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	slackapi "github.com/slack-go/slack"
)

// bearerClient moves the token slack-go puts in a form body (token=…)
// into the Authorization header, as Slack recommends, so the token never
// travels in a body a proxy might log. JSON calls already carry their
// header (the bot token, or the app-level token of apps.connections.open)
// and keep it.
type bearerClient struct {
	c     *http.Client
	token string
}

func (b *bearerClient) Do(req *http.Request) (*http.Response, error) {
	if strings.HasPrefix(req.Header.Get("Content-Type"), "application/x-www-form-urlencoded") && req.Body != nil {
		raw, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
		vals, err := url.ParseQuery(string(raw))
		if err != nil {
			return nil, err
		}
		vals.Del("token")
		body := vals.Encode()
		req.Body = io.NopCloser(strings.NewReader(body))
		req.ContentLength = int64(len(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body)), nil }
	}
	if req.Header.Get("Authorization") == "" {
		req.Header.Set("Authorization", "Bearer "+b.token)
	}
	return b.c.Do(req)
}

// api calls the Slack Web API, retrying what Slack asks to be retried.
type api struct {
	c        *slackapi.Client
	attempts int
	backoff  time.Duration
	maxWait  time.Duration
	log      *slog.Logger
	metrics  *metrics
}

func newAPI(cfg Config, httpClient *http.Client, log *slog.Logger, m *metrics) *api {
	c := slackapi.New(cfg.BotToken, slackapi.OptionAPIURL(cfg.APIURL),
		slackapi.OptionHTTPClient(&bearerClient{c: httpClient, token: cfg.BotToken}))
	return &api{c: c, attempts: max(cfg.PostAttempts, 1), backoff: cfg.RetryBackoff, maxWait: cfg.MaxRetryAfter, log: log, metrics: m}
}

// errPermanent marks a Slack error that retrying will not fix (an
// ok:false reply such as channel_not_found).
var errPermanent = errors.New("slack: permanent error")

// retryable reports whether err is worth another attempt, and how long
// Slack asked to wait (0: our backoff).
func retryable(err error) (bool, time.Duration) {
	var rl *slackapi.RateLimitedError
	if errors.As(err, &rl) {
		return true, rl.RetryAfter
	}
	var sc slackapi.StatusCodeError
	if errors.As(err, &sc) {
		return sc.Code >= 500 || sc.Code == http.StatusTooManyRequests || sc.Code == http.StatusRequestTimeout, 0
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return true, 0
	}
	var se slackapi.SlackErrorResponse
	if errors.As(err, &se) {
		switch se.Err {
		case "ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout":
			return true, 0
		}
	}
	return false, 0
}

// call runs f until it succeeds, fails permanently, or has been tried
// attempts times; a 429 waits its Retry-After (capped at maxWait), other
// retryable failures a doubling backoff. It blocks until then or until
// ctx ends. A permanent failure wraps errPermanent.
func (a *api) call(ctx context.Context, method string, attempts int, f func(ctx context.Context) error) error {
	wait := a.backoff
	var err error
	for i := 1; ; i++ {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = f(cctx)
		cancel()
		if err == nil {
			a.metrics.calls.WithLabelValues(method, "ok").Inc()
			return nil
		}
		retry, after := retryable(err)
		result := "error"
		if after > 0 {
			result = "rate_limited"
		}
		a.metrics.calls.WithLabelValues(method, result).Inc()
		if !retry {
			return errors.Join(errPermanent, err)
		}
		if i >= attempts || ctx.Err() != nil {
			return err
		}
		d := wait
		if after > 0 {
			d = min(after, a.maxWait)
		} else {
			wait = min(2*wait, 30*time.Second)
		}
		a.log.Warn("slack call failed; retrying", "method", method, "attempt", i, "retry_in", d, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
}
