package dispatcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/internal/svc"

	"github.com/agora-dispatch/agora/internal/problem"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// maxBodyBytes bounds an HTTP request body; bodies above MaxRequestBytes
// but within this bound get a 422 naming the limit.
const maxBodyBytes = 1 << 20

// Handler returns the HTTP API. Every /v1 route needs a bearer token when
// APITokens or PrincipalsFile is set, and shows, follows and cancels only
// what its principal may (owner.go); /metrics and /healthz are open.
//
//	POST /v1/dispatches               a lifecycle.Request (Content-Type application/json or none, else 415) → 201 (new) or 200 (same dispatch_id again), the client.Record
//	GET  /v1/dispatches/{id}          the client.Record
//	POST /v1/dispatches/{id}/cancel   optional {"by", "reason"} → the client.Record
//	GET  /v1/dispatches/{id}/artifacts          what the run left: {dispatch_id, artifacts, artifacts_skipped}; 409 before it ends
//	GET  /v1/dispatches/{id}/artifacts/{name…}  one artifact, streamed: Content-Length, ETag (sha256), single byte ranges; 410 once expired
//	GET  /v1/threads/{id}             the client.Thread: every round with its events
//	POST /v1/threads/{id}/cancel      optional {"by", "reason"} → the client.Thread
//	GET  /v1/events                   Server-Sent Events: lifecycle and progress CloudEvents, `event:` = the type (query: thread, dispatch, kind, type=lifecycle|progress, from=start|now; header Last-Event-ID)
//	GET  /v1/schemas/{name}           the JSON Schemas events name in dataschema, and asyncapi.yaml (open)
//	GET  /v1/openapi.json             the OpenAPI 3.1 document of these routes (open; docs/dispatcher.md)
//	GET  /metrics                     Prometheus metrics
//	GET  /healthz                     200 when NATS is connected and JetStream answers
//
// Errors are RFC 9457 problem documents (client.Problem); an invalid
// request is a 422 whose errors name each field. The handler can be
// mounted on another server (agora dev does); it works before Run and
// ends its event streams when Run stops. Safe for concurrent use.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/dispatches", s.auth(s.httpDispatch))
	mux.Handle("GET /v1/dispatches/{id}", s.auth(s.httpStatus))
	mux.Handle("POST /v1/dispatches/{id}/cancel", s.auth(s.httpCancel))
	mux.Handle("GET /v1/dispatches/{id}/artifacts", s.auth(s.httpArtifacts))
	mux.Handle("GET /v1/dispatches/{id}/artifacts/{name...}", s.auth(s.httpArtifact))
	mux.Handle("GET /v1/threads/{id}", s.auth(s.httpThread))
	mux.Handle("POST /v1/threads/{id}/cancel", s.auth(s.httpCancelThread))
	mux.Handle("GET /v1/events", s.auth(s.httpEvents))
	mux.HandleFunc("GET /v1/schemas/{name}", s.httpSchema)
	mux.HandleFunc("GET /v1/openapi.json", s.httpOpenAPI)
	mux.Handle("GET /metrics", svc.MetricsHandler(s.gatherer))
	mux.HandleFunc("GET /healthz", s.httpHealth)
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// opContext detaches a request's work from the client connection (a
// disconnect must not interrupt an acceptance half way) and bounds it.
func opContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.Context()), opTimeout)
}

// problemMediaType is the problem type of a body that is not JSON.
const problemMediaType = "urn:agora:problem:unsupported-media-type"

// jsonBody reports whether a request's Content-Type is one a JSON body may
// carry: application/json (any parameters) or none at all.
func jsonBody(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	if strings.TrimSpace(ct) == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

func (s *Service) httpDispatch(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if !jsonBody(r) {
		s.metrics.request(doorHTTP, resultRejected, start)
		w.Header().Set("Accept-Post", "application/json")
		problem.Write(w, r, &client.Problem{Type: problemMediaType, Title: "Unsupported media type", Status: http.StatusUnsupportedMediaType,
			Detail: fmt.Sprintf("the body is %q; send a JSON lifecycle request with Content-Type: application/json", r.Header.Get("Content-Type"))})
		return
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		s.metrics.request(doorHTTP, resultRejected, start)
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			problem.Write(w, r, &client.Problem{Type: client.ProblemTooLarge, Title: "Request too large", Status: http.StatusRequestEntityTooLarge,
				Detail: fmt.Sprintf("the body is larger than %d bytes", maxBodyBytes),
				Errors: []client.FieldError{{Field: "request", Message: fmt.Sprintf("is larger than %d bytes; the limit is %d", maxBodyBytes, MaxRequestBytes)}}})
			return
		}
		problem.Write(w, r, problem.Invalid(client.FieldError{Field: "request", Message: "cannot read the body: " + err.Error()}))
		return
	}
	req, p := decodeRequest(data)
	if p != nil {
		s.metrics.request(doorHTTP, resultRejected, start)
		problem.Write(w, r, p)
		return
	}
	ctx, cancel := opContext(r)
	defer cancel()
	b, err := s.bind(ctx)
	if err != nil {
		s.metrics.request(doorHTTP, resultError, start)
		problem.Write(w, r, s.problem(err))
		return
	}
	who := caller(r)
	if denied := mayDispatch(who, req.Subagent); denied != nil {
		s.metrics.request(doorHTTP, resultRejected, start)
		problem.Write(w, r, denied)
		return
	}
	tp := r.Header.Get("traceparent")
	rec, result, err := s.accept(ctx, b, req, len(data), tp, doorHTTP, who.Name)
	s.metrics.request(doorHTTP, result, start)
	if err == nil && result != resultAccepted && result != resultMaxRounds {
		// The same dispatch_id again answers the first record: only to
		// a principal that may see it (another gets a conflict that
		// tells nothing of it).
		if aerr := s.allowThread(ctx, b, who, "dispatch", rec.DispatchID, rec.ThreadID, false); aerr != nil {
			problem.Write(w, r, &client.Problem{Type: client.ProblemInvalidRequest, Title: "Conflict", Status: http.StatusConflict,
				Detail: "dispatch_id is taken: leave it empty for a new dispatch, or pick another",
				Errors: []client.FieldError{{Field: "dispatch_id", Message: "is taken"}}})
			return
		}
	}
	if err != nil {
		problem.Write(w, r, refusal(s.requestLog(doorHTTP, req, tp), err))
		return
	}
	status := http.StatusOK
	if result == resultAccepted || result == resultMaxRounds {
		status = http.StatusCreated
	}
	w.Header().Set("Location", "/v1/dispatches/"+url.PathEscape(rec.DispatchID))
	writeJSON(w, status, rec)
}

func (s *Service) httpStatus(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := opContext(r)
	defer cancel()
	s.serve(w, r, func(b *bindings) (any, error) {
		if err := s.allowDispatch(ctx, b, caller(r), r.PathValue("id"), false); err != nil {
			return nil, err
		}
		return s.status(ctx, b, r.PathValue("id"))
	})
}

func (s *Service) httpThread(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := opContext(r)
	defer cancel()
	s.serve(w, r, func(b *bindings) (any, error) {
		id := r.PathValue("id")
		if err := s.allowThread(ctx, b, caller(r), "thread", id, id, false); err != nil {
			return nil, err
		}
		return s.thread(ctx, b, id)
	})
}

func (s *Service) httpCancel(w http.ResponseWriter, r *http.Request) {
	s.cancelRequest(w, r, func(ctx context.Context, b *bindings, id, by, reason string) (any, error) {
		if err := s.allowDispatch(ctx, b, caller(r), id, true); err != nil {
			return nil, err
		}
		return s.cancelDispatch(ctx, b, id, by, reason)
	})
}

func (s *Service) httpCancelThread(w http.ResponseWriter, r *http.Request) {
	s.cancelRequest(w, r, func(ctx context.Context, b *bindings, id, by, reason string) (any, error) {
		if err := s.allowThread(ctx, b, caller(r), "thread", id, id, true); err != nil {
			return nil, err
		}
		return s.cancelThread(ctx, b, id, by, reason)
	})
}

// cancelRequest serves a cancel of the dispatch or thread named by the
// path's id: it reads the body (cancelBody) and answers what cancel
// returns within opTimeout.
func (s *Service) cancelRequest(w http.ResponseWriter, r *http.Request, cancel func(ctx context.Context, b *bindings, id, by, reason string) (any, error)) {
	by, reason, err := cancelBody(w, r)
	if err != nil {
		problem.Write(w, r, s.problem(err))
		return
	}
	ctx, stop := opContext(r)
	defer stop()
	s.serve(w, r, func(b *bindings) (any, error) { return cancel(ctx, b, r.PathValue("id"), by, reason) })
}

// cancelBody reads the optional {"by", "reason"} of a cancel.
func cancelBody(w http.ResponseWriter, r *http.Request) (by, reason string, err error) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		return "", "", problem.Invalid(client.FieldError{Field: "request", Message: "cannot read the body: " + err.Error()})
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return "", "", nil
	}
	var req struct {
		By     string `json:"by"`
		Reason string `json:"reason"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return "", "", problem.Invalid(client.FieldError{Field: short(strings.Trim(name, `"`)), Message: "is not a field of a cancel (known: by, reason)"})
		}
		return "", "", problem.Invalid(client.FieldError{Field: "request", Message: `must be empty or a JSON object {"by": "…", "reason": "…"}: ` + err.Error()})
	}
	return req.By, req.Reason, nil
}

// serve binds, runs f and writes its value as JSON or its error as a
// problem.
func (s *Service) serve(w http.ResponseWriter, r *http.Request, f func(*bindings) (any, error)) {
	b, err := s.bind(r.Context())
	if err != nil {
		problem.Write(w, r, s.problem(err))
		return
	}
	v, err := f(b)
	if err != nil {
		problem.Write(w, r, s.problem(err))
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *Service) httpHealth(w http.ResponseWriter, r *http.Request) {
	if st := s.nc.Status(); st != nats.CONNECTED {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "nats": st.String()})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	js, err := jetstream.New(s.nc)
	if err == nil {
		_, err = js.AccountInfo(ctx)
	}
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "nats": "connected", "jetstream": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "nats": "connected", "jetstream": "ok", "dispatcher_id": s.cfg.ID})
}

// sseFilter reads the query of GET /v1/events.
func sseFilter(r *http.Request) (jetstream.OrderedConsumerConfig, error) {
	q := r.URL.Query()
	var errs []client.FieldError
	kind := lifecycle.Kind(q.Get("kind"))
	if kind != "" && !kind.Valid() {
		errs = append(errs, client.FieldError{Field: "kind", Message: fmt.Sprintf("%q is not a lifecycle kind (accepted, started, finished, needs_input, failed, cancelled)", short(string(kind)))})
	}
	thread, dispatch := q.Get("thread"), q.Get("dispatch")
	if thread != "" && lifecycle.ValidToken(thread) != nil {
		errs = append(errs, client.FieldError{Field: "thread", Message: fmt.Sprintf("%q is not a thread id", short(thread))})
	}
	if dispatch != "" && lifecycle.ValidToken(dispatch) != nil {
		errs = append(errs, client.FieldError{Field: "dispatch", Message: fmt.Sprintf("%q is not a dispatch id", short(dispatch))})
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{lifecycle.LifecycleFilter(kind, thread, dispatch)},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
	}
	switch q.Get("from") {
	case "":
		// Naming a thread or a dispatch asks for its history: replayed
		// from its start unless from=now.
		if thread != "" || dispatch != "" {
			cfg.DeliverPolicy = jetstream.DeliverAllPolicy
		}
	case "now":
	case "start":
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	default:
		errs = append(errs, client.FieldError{Field: "from", Message: "want start (replay retained events; the default with thread or dispatch) or now (the default otherwise)"})
	}
	last := r.Header.Get("Last-Event-ID")
	field := "Last-Event-ID"
	if last == "" {
		last, field = q.Get("last_event_id"), "last_event_id"
	}
	if last != "" {
		seq, err := strconv.ParseUint(last, 10, 64)
		if err != nil {
			errs = append(errs, client.FieldError{Field: field, Message: fmt.Sprintf("%q is not an event id (a stream sequence number)", short(last))})
		} else {
			cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, seq+1
		}
	}
	if len(errs) > 0 {
		return cfg, problem.Invalid(errs...)
	}
	return cfg, nil
}
