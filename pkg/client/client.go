package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// DefaultTimeout is the client's request timeout (WithTimeout): it bounds
// a request to an Agora endpoint when the context carries no deadline, and
// each attempt of Dispatch whatever the context's deadline.
const DefaultTimeout = 10 * time.Second

// dispatchAttempts bounds the attempts of one Dispatch.
const dispatchAttempts = 3

// Client talks to Agora over one NATS connection. Create it with New or
// Connect. It is safe for concurrent use.
type Client struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	ownConn bool
	timeout time.Duration
	natsOpt []nats.Option
	caller  string
}

// Option configures a Client.
type Option func(*Client)

// WithTimeout sets the client's request timeout (default DefaultTimeout).
// It bounds each request to an Agora endpoint when the caller's context has
// no deadline, and each attempt of Dispatch even under a longer deadline:
// a dispatcher that took the request and died does not hold the caller
// until its deadline, the request is sent again (the same dispatch id) to
// another. Give it more than the dispatcher's acceptance takes under load
// (a few milliseconds to a few hundred).
func WithTimeout(d time.Duration) Option {
	return func(c *Client) {
		if d > 0 {
			c.timeout = d
		}
	}
}

// WithCaller sends dispatch, cancel and status requests on the caller's
// own subjects, agora.api.<verb>.<user>, for a client whose NATS user
// (user) is granted only those (docs/security.md, "The NATS API"): the
// dispatcher then takes user as the caller's principal, whose threads
// they start, see and cancel. Without it requests go to agora.api.<verb>,
// the trusted users' subjects. user is a principal name: 1-64 letters,
// digits, '-' or '_'.
func WithCaller(user string) Option {
	return func(c *Client) { c.caller = user }
}

// WithNATSOptions adds options to the connection Connect opens, such as
// nats.UserCredentials. New ignores them.
func WithNATSOptions(opts ...nats.Option) Option {
	return func(c *Client) { c.natsOpt = append(c.natsOpt, opts...) }
}

// New returns a Client on an existing connection, which stays the
// caller's: Close does not close it.
func New(nc *nats.Conn, opts ...Option) (*Client, error) {
	if nc == nil {
		return nil, errors.New("client: nil NATS connection")
	}
	c := &Client{nc: nc, timeout: DefaultTimeout}
	for _, o := range opts {
		o(c)
	}
	if c.caller != "" && (len(c.caller) > 64 || lifecycle.ValidToken(c.caller) != nil) {
		return nil, fmt.Errorf("client: WithCaller(%q): not a NATS user's principal name: want 1-64 letters, digits, '-' or '_'", c.caller)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("client: jetstream: %w", err)
	}
	c.js = js
	return c, nil
}

// Connect connects to the NATS server at url (reconnecting forever) and
// returns a Client that owns the connection: Close closes it.
func Connect(url string, opts ...Option) (*Client, error) {
	probe := &Client{}
	for _, o := range opts {
		o(probe)
	}
	nopts := append([]nats.Option{nats.Name("agora-client"), nats.MaxReconnects(-1)}, probe.natsOpt...)
	nc, err := nats.Connect(url, nopts...)
	if err != nil {
		return nil, fmt.Errorf("client: connect %s: %w", url, err)
	}
	c, err := New(nc, opts...)
	if err != nil {
		nc.Close()
		return nil, err
	}
	c.ownConn = true
	return c, nil
}

// Close closes the connection when the Client opened it with Connect,
// after flushing what it published. It is a no-op for a Client from New.
func (c *Client) Close() error {
	if !c.ownConn {
		return nil
	}
	return c.nc.Drain()
}

// Conn returns the underlying connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

// call sends a JSON request to a micro endpoint and decodes the JSON
// reply into out. A micro error reply becomes a *Problem.
func (c *Client) call(ctx context.Context, subject string, hdr nats.Header, in, out any) error {
	data, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("client: %s: encode request: %w", subject, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	hdr = withSpan(ctx, hdr)
	if c.caller != "" {
		if own, err := lifecycle.APICaller(subject, c.caller); err == nil {
			subject = own
		}
	}
	resp, err := c.nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: subject, Header: hdr, Data: data})
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("client: %s: no service is answering: %w", subject, ErrUnavailable)
	case err != nil:
		return fmt.Errorf("client: %s: %w", subject, err)
	}
	if p := problemFromReply(resp); p != nil {
		return p
	}
	if err := json.Unmarshal(resp.Data, out); err != nil {
		return fmt.Errorf("client: %s: decode reply: %w", subject, err)
	}
	return nil
}

// Dispatch is a handle on one accepted dispatch: one round of a thread.
type Dispatch struct {
	// DispatchID is the dispatch id (the name every type of this package
	// and the wire use); ThreadID its thread (the dispatch id of the
	// thread's root).
	DispatchID string
	ThreadID   string
	// Record is the dispatch record as the dispatcher returned it.
	Record Record

	c *Client
}

// DispatchOption adjusts one Dispatch call: WithTraceparent, OnBehalfOf.
type DispatchOption func(*dispatchOptions)

// dispatchOptions are the headers a Dispatch request carries.
type dispatchOptions struct {
	hdr nats.Header
}

// WithTraceparent sends a W3C traceparent with the request so every event
// of the dispatch joins that trace. Without it the dispatcher starts a new
// trace.
func WithTraceparent(tp string) DispatchOption {
	return func(o *dispatchOptions) { o.hdr.Set(lifecycle.TraceparentExtension, tp) }
}

// OnBehalfOf records the dispatch's thread as principal's (the
// lifecycle.PrincipalHeader header): a door that
// authenticated its caller (MCP over HTTP does) says whose thread it is.
// The dispatcher takes it from any NATS user that may call
// agora.api.dispatch, so grant that subject to trusted doors only; on a
// caller's own subject (WithCaller) only an admin principal may name
// another.
func OnBehalfOf(principal string) DispatchOption {
	return func(o *dispatchOptions) { o.hdr.Set(lifecycle.PrincipalHeader, principal) }
}

// Dispatch asks the dispatcher (agora.api.dispatch) to accept req and
// returns a handle once it is accepted and queued. The call is idempotent:
// when req.DispatchID is empty, Dispatch generates the id before the first
// attempt, and every attempt sends that same id, which the dispatcher
// answers with the dispatch already accepted under it; so a caller's own
// retry with DispatchError.DispatchID completes the same dispatch rather
// than starting a second one.
//
// Each attempt waits at most the client's request timeout (WithTimeout),
// however long ctx allows: an attempt left unanswered (the dispatcher that
// took it died, or its reply was lost) and a temporary failure
// (ErrUnavailable) are retried with backoff, three attempts in all. When
// none is answered the *DispatchError says so (Unanswered): the dispatch
// may have been accepted, which Status with its id tells.
//
// A refused request answers a *Problem matching ErrInvalidRequest whose
// Errors name the fields at fault. A request over a size limit (its input
// over lifecycle.MaxInputBytes, or the whole over lifecycle.MaxRequestBytes
// or the server's max payload) is not sent: Dispatch returns a
// *TooLargeError, which no retry can cure. A request past its thread's round limit
// is not refused: the handle's Record already ended failed max-rounds.
// Dispatch blocks until the dispatcher answers, the attempts are spent or
// ctx ends.
func (c *Client) Dispatch(ctx context.Context, req lifecycle.Request, opts ...DispatchOption) (*Dispatch, error) {
	do := dispatchOptions{hdr: nats.Header{}}
	for _, o := range opts {
		o(&do)
	}
	hdr := do.hdr
	if req.DispatchID == "" {
		req.DispatchID = lifecycle.NewID()
	}
	if err := c.checkSize(req); err != nil {
		return nil, err
	}
	var rec Record
	backoff := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := c.dispatchOnce(ctx, hdr, req, &rec)
		if err == nil {
			break
		}
		if errors.Is(err, nats.ErrMaxPayload) {
			// The headers tipped it over: as final as checkSize's refusal.
			tl := c.tooLarge(req)
			tl.Err = err
			return nil, tl
		}
		unanswered := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
		failed := func() error {
			return &DispatchError{DispatchID: req.DispatchID, Err: err, Attempts: attempt, Timeout: c.timeout, Unanswered: unanswered}
		}
		if attempt == dispatchAttempts || !(unanswered || errors.Is(err, ErrUnavailable)) || ctx.Err() != nil {
			return nil, failed()
		}
		select {
		case <-ctx.Done():
			return nil, failed()
		case <-time.After(backoff):
		}
		backoff *= 2
	}
	return &Dispatch{DispatchID: rec.DispatchID, ThreadID: rec.ThreadID, Record: rec, c: c}, nil
}

// dispatchOnce is one attempt of Dispatch, bounded by the client's request
// timeout.
func (c *Client) dispatchOnce(ctx context.Context, hdr nats.Header, req lifecycle.Request, rec *Record) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return c.call(ctx, lifecycle.APIDispatch, hdr, req, rec)
}

// TooLargeError is a dispatch request Dispatch did not send because it can
// never be accepted: its input is over lifecycle.MaxInputBytes, or the
// whole request over lifecycle.MaxRequestBytes or the NATS server's max
// payload. Retrying cannot help; pass large data by reference instead. It
// matches ErrInvalidRequest.
type TooLargeError struct {
	// RequestBytes and InputBytes are the encoded request's and its
	// input's sizes; RequestLimit and InputLimit the limits they meet.
	RequestBytes, InputBytes int
	RequestLimit, InputLimit int
	// MaxPayload is the NATS server's max payload, when it is what bounds
	// the request (below lifecycle.MaxRequestBytes).
	MaxPayload int
	// Err is the NATS error when the server refused the message.
	Err error
}

func (e *TooLargeError) Error() string {
	req := fmt.Sprintf("the whole request at most %d bytes", e.RequestLimit)
	if e.MaxPayload > 0 {
		req += " (this NATS server's max payload)"
	}
	return fmt.Sprintf("client: the dispatch request is %d bytes with an input of %d bytes, over Agora's limits: "+
		"the input at most %d bytes and %s; nothing was dispatched. "+
		"Pass large data by reference: write it to a file the sub-agent reads (a path its definition's sandbox.read_paths shows) "+
		"or to storage it can fetch, and put the path or URL in the input",
		e.RequestBytes, e.InputBytes, e.InputLimit, req)
}

// Is reports that a TooLargeError is an invalid request.
func (e *TooLargeError) Is(target error) bool { return target == ErrInvalidRequest }

// Unwrap returns the NATS error, if the server refused the message.
func (e *TooLargeError) Unwrap() error { return e.Err }

// tooLarge measures req against the limits.
func (c *Client) tooLarge(req lifecycle.Request) *TooLargeError {
	data, _ := json.Marshal(req)
	e := &TooLargeError{RequestBytes: len(data), RequestLimit: lifecycle.MaxRequestBytes, InputLimit: lifecycle.MaxInputBytes}
	if in := bytes.TrimSpace(req.Input); !bytes.Equal(in, []byte("null")) {
		e.InputBytes = len(in)
	}
	if mp := int(c.nc.MaxPayload()); mp > 0 && mp < e.RequestLimit {
		e.RequestLimit, e.MaxPayload = mp, mp
	}
	return e
}

// checkSize refuses a request that is over a size limit before it is sent.
func (c *Client) checkSize(req lifecycle.Request) error {
	e := c.tooLarge(req)
	if e.InputBytes > e.InputLimit || e.RequestBytes > e.RequestLimit {
		return e
	}
	return nil
}

// DispatchError is a failed Dispatch. DispatchID is the id the request was
// sent with: retrying with it is safe (the same dispatch, never a second).
type DispatchError struct {
	DispatchID string
	Err        error
	// Attempts is how many requests were sent, each waiting at most
	// Timeout (the client's request timeout) for an answer.
	Attempts int
	Timeout  time.Duration
	// Unanswered reports that the last attempt got no answer: a
	// dispatcher may have accepted the dispatch and its answer been lost.
	// Status with DispatchID tells (ErrNotFound: it was not accepted).
	Unanswered bool
}

func (e *DispatchError) Error() string {
	switch {
	case errors.Is(e.Err, ErrInvalidRequest):
		// A refusal: the same request again is refused again.
		return fmt.Sprintf("%v (dispatch_id %s)", e.Err, e.DispatchID)
	case e.Unanswered:
		tries := "1 attempt"
		if e.Attempts != 1 {
			tries = fmt.Sprintf("%d attempts", e.Attempts)
		}
		return fmt.Sprintf("client: dispatch %s: no answer from the dispatcher (%s, each waiting at most %s: %v); "+
			"it may have been accepted: check with Client.Status or `agora status %s`, and retry with dispatch_id %s to complete the same dispatch",
			e.DispatchID, tries, e.Timeout, e.Err, e.DispatchID, e.DispatchID)
	}
	return fmt.Sprintf("%v (dispatch_id %s: retry with it to complete the same dispatch)", e.Err, e.DispatchID)
}

// Unwrap returns the underlying error (a *Problem, ErrUnavailable,
// context.DeadlineExceeded, …).
func (e *DispatchError) Unwrap() error { return e.Err }

// Item is one lifecycle event read from AGORA_LIFECYCLE.
type Item struct {
	// Seq is the event's stream sequence; pass it as Filter.AfterSeq to
	// resume after this event.
	Seq   uint64
	Event lifecycle.Event
	// Data is the parsed event data (*lifecycle.Accepted, *lifecycle.Started, …).
	Data lifecycle.Lifecycle
	// Progress is set instead of Data for a progress report (Watch with
	// Filter.Progress); its Seq is AGORA_PROGRESS's.
	Progress *lifecycle.Progress
}

// Kind returns the item's lifecycle kind.
func (it Item) Kind() lifecycle.Kind {
	if it.Data == nil {
		return ""
	}
	return it.Data.LifecycleKind()
}

// Wait blocks until this dispatch has its terminal event (finished,
// needs_input, failed or cancelled) and returns it. It reads the lifecycle
// stream from its start, so it never misses an event that came before the
// call. Wait covers one round: Follow (or Result) follows the thread
// through its answers.
func (d *Dispatch) Wait(ctx context.Context) (Item, error) {
	for it, err := range d.c.Watch(ctx, Filter{ThreadID: d.ThreadID, DispatchID: d.DispatchID, FromStart: true}) {
		if err != nil {
			return Item{}, err
		}
		if it.Kind().Terminal() {
			return it, nil
		}
	}
	return Item{}, ctx.Err()
}

// Follow follows a thread across its rounds until it ends, calling onItem
// (when not nil) with every lifecycle event of the thread as Watch yields
// it, oldest first, and returns the first terminal event that is not
// needs_input. It blocks until then or until ctx ends; onItem runs on the
// calling goroutine.
func (c *Client) Follow(ctx context.Context, threadID string, onItem func(Item)) (Item, error) {
	if err := lifecycle.ValidToken(threadID); err != nil {
		return Item{}, fmt.Errorf("client: thread id: %w", err)
	}
	for it, err := range c.Watch(ctx, Filter{ThreadID: threadID, FromStart: true}) {
		if err != nil {
			return Item{}, err
		}
		if onItem != nil {
			onItem(it)
		}
		if k := it.Kind(); k.Terminal() && k != lifecycle.KindNeedsInput {
			return it, nil
		}
	}
	return Item{}, ctx.Err()
}

// ThreadError is the error Dispatch.Result returns for a thread that ended failed
// or cancelled: the kind, the failure reason (empty for cancelled), the
// detail (or who cancelled and why) and the dispatch that ended it.
type ThreadError struct {
	ThreadID   string
	DispatchID string
	Kind       lifecycle.Kind
	Reason     lifecycle.Reason
	Detail     string
}

func (e *ThreadError) Error() string {
	s := fmt.Sprintf("client: thread %s ended %s", e.ThreadID, e.Kind)
	if e.Reason != "" {
		s += " (" + string(e.Reason) + ")"
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Result waits for this dispatch's thread to end, in the manner of a
// workflow run's Get: when it finished, the sub-agent's output
// (.agora/output.json) is decoded into out (a pointer; nil skips decoding;
// a run that wrote no output leaves out as it is); when it failed or was
// cancelled, Result returns a *ThreadError. It blocks until the thread
// ends or ctx does. It is Follow with the decoding done.
func (d *Dispatch) Result(ctx context.Context, out any) error {
	c, threadID := d.c, d.ThreadID
	end, err := c.Follow(ctx, threadID, nil)
	if err != nil {
		return err
	}
	switch d := end.Data.(type) {
	case *lifecycle.Finished:
		if out == nil || len(d.Output) == 0 || string(d.Output) == "null" {
			return nil
		}
		if err := json.Unmarshal(d.Output, out); err != nil {
			return fmt.Errorf("client: thread %s: decode output: %w", threadID, err)
		}
		return nil
	case *lifecycle.Failed:
		return &ThreadError{ThreadID: threadID, DispatchID: d.DispatchID, Kind: lifecycle.KindFailed, Reason: d.Reason, Detail: d.Detail}
	case *lifecycle.Cancelled:
		return &ThreadError{ThreadID: threadID, DispatchID: d.DispatchID, Kind: lifecycle.KindCancelled, Detail: strings.TrimSpace(d.By + ": " + d.Reason)}
	}
	return fmt.Errorf("client: thread %s ended with %T", threadID, end.Data)
}

// CancelOption adjusts a Cancel or CancelThread call: CancelBy.
type CancelOption func(*cancelOptions)

// cancelOptions are the fields of a cancel request its options set.
type cancelOptions struct {
	by, reason string
}

// CancelBy names who cancels (default "api") and why.
func CancelBy(by, reason string) CancelOption {
	return func(o *cancelOptions) { o.by, o.reason = by, reason }
}

// Cancel cancels a dispatch (agora.api.cancel) and returns its record. A
// queued dispatch ends cancelled and never runs; a running one is stopped.
// Cancel is idempotent: a dispatch that already ended is returned
// unchanged. An unknown id answers an error matching ErrNotFound.
func (c *Client) Cancel(ctx context.Context, dispatchID string, opts ...CancelOption) (*Record, error) {
	return cancelCall[Record](ctx, c, lifecycle.CancelRequest{DispatchID: dispatchID}, opts)
}

// CancelThread cancels every dispatch of a thread that has not ended, and
// a thread paused on a question, and returns the thread.
func (c *Client) CancelThread(ctx context.Context, threadID string, opts ...CancelOption) (*Thread, error) {
	return cancelCall[Thread](ctx, c, lifecycle.CancelRequest{ThreadID: threadID}, opts)
}

// cancelCall sends req with opts applied to agora.api.cancel and returns the
// reply, a Record or a Thread.
func cancelCall[T any](ctx context.Context, c *Client, req lifecycle.CancelRequest, opts []CancelOption) (*T, error) {
	var co cancelOptions
	for _, o := range opts {
		o(&co)
	}
	req.By, req.Reason = co.by, co.reason
	var out T
	if err := c.call(ctx, lifecycle.APICancel, nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Status returns a dispatch's record (agora.api.status). An unknown id
// answers an error matching ErrNotFound.
func (c *Client) Status(ctx context.Context, dispatchID string) (*Record, error) {
	var rec Record
	if err := c.call(ctx, lifecycle.APIStatus, nil, statusRequest{DispatchID: dispatchID}, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// Thread returns every round of a thread with its events
// (agora.api.status). An unknown id answers an error matching ErrNotFound.
func (c *Client) Thread(ctx context.Context, threadID string) (*Thread, error) {
	var th Thread
	if err := c.call(ctx, lifecycle.APIStatus, nil, statusRequest{ThreadID: threadID}, &th); err != nil {
		return nil, err
	}
	return &th, nil
}
