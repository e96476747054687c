package genclient_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sort"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
)

// docPath is the repository's OpenAPI document, loaded from disk as a
// program would: on its own, with external references refused.
const docPath = "../agora.json"

func init() {
	// Bodies the document names that openapi3filter has no decoder for.
	openapi3filter.RegisterBodyDecoder("application/schema+json", openapi3filter.JSONBodyDecoder)
	openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
}

// loadDoc loads the repository file with kin-openapi and validates it.
func loadDoc(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	loader.IsExternalRefsAllowed = false
	doc, err := loader.LoadFromFile(docPath)
	if err != nil {
		t.Fatalf("%s does not load on its own: %v", docPath, err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("%s: %v", docPath, err)
	}
	return doc
}

// onPurpose marks a request the test makes wrong on purpose (to see a
// documented refusal): the contract does not check the request, only the
// response.
type onPurpose struct{}

func wrongOnPurpose(ctx context.Context) context.Context {
	return context.WithValue(ctx, onPurpose{}, true)
}

// contract is an http.RoundTripper that checks every exchange against the
// document with kin-openapi's openapi3filter: the request must match an
// operation (unless made wrong on purpose), the response's status must be
// one the operation lists, its Content-Type one of that status's media
// types, and its body must match the schema (JSON, text and HTML bodies;
// an event stream or an artifact's bytes are checked for status and type
// only). A mismatch fails the test (docs/api.md).
type contract struct {
	errorf func(format string, args ...any) // the test's Errorf
	doc    *openapi3.T
	router routers.Router
	base   http.RoundTripper

	mu   sync.Mutex
	seen map[string]map[int]bool // operationId → statuses answered
}

func newContract(t *testing.T, serverURL string) *contract {
	t.Helper()
	doc := loadDoc(t)
	// Route requests to the test's listener rather than the documented
	// agora dev address.
	doc.Servers = openapi3.Servers{{URL: serverURL}}
	r, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &contract{errorf: t.Errorf, doc: doc, router: r, base: http.DefaultTransport, seen: map[string]map[int]bool{}}
}

func (k *contract) RoundTrip(req *http.Request) (*http.Response, error) {
	route, params, err := k.router.FindRoute(req)
	if err != nil {
		k.errorf("contract: %s %s is not an operation of the document: %v", req.Method, req.URL, err)
		return k.base.RoundTrip(req)
	}
	op := route.Operation.OperationID
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true}}
	var body []byte
	if req.Body != nil {
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		req.Body.Close()
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	if purposely, _ := req.Context().Value(onPurpose{}).(bool); !purposely {
		if err := openapi3filter.ValidateRequest(req.Context(), in); err != nil {
			k.errorf("contract: request %s %s (%s): %v", req.Method, req.URL.Path, op, err)
		}
	}
	if req.Body != nil {
		req.Body = io.NopCloser(bytes.NewReader(body))
	}

	resp, err := k.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	if k.seen[op] == nil {
		k.seen[op] = map[int]bool{}
	}
	k.seen[op][resp.StatusCode] = true
	k.mu.Unlock()

	// openapi3filter passes some statuses (304, redirects) unchecked:
	// every status must be listed all the same.
	if route.Operation.Responses.Status(resp.StatusCode) == nil && route.Operation.Responses.Default() == nil {
		k.errorf("contract: %s %s (%s) answered %d, which the document does not list for it", req.Method, req.URL.Path, op, resp.StatusCode)
		return resp, nil
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}}
	if err := k.checkResponse(route, out, resp); err != nil {
		k.errorf("contract: %s %s (%s) answered %d %s: %v", req.Method, req.URL.Path, op, resp.StatusCode, resp.Header.Get("Content-Type"), err)
	}
	return resp, nil
}

// checkResponse validates resp; a body it reads is put back.
func (k *contract) checkResponse(route *routers.Route, out *openapi3filter.ResponseValidationInput, resp *http.Response) error {
	ct := resp.Header.Get("Content-Type")
	mt, _, _ := mime.ParseMediaType(ct)
	var media *openapi3.MediaType
	if r := route.Operation.Responses.Status(resp.StatusCode); r != nil && r.Value != nil {
		media = r.Value.Content.Get(ct)
	}
	binary := media != nil && media.Schema != nil && media.Schema.Value != nil && media.Schema.Value.Format == "binary"
	if mt == "text/event-stream" || binary {
		// A stream never ends and an artifact is any bytes: status,
		// headers and type only.
		out.Options.ExcludeResponseBody = true
		if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
			return err
		}
		if media == nil {
			return fmt.Errorf("content type %q is not documented for %d", ct, resp.StatusCode)
		}
		return nil
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	out.SetBodyBytes(b)
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		return fmt.Errorf("%w\nbody: %.600s", err, b)
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return nil
}

// unseen lists the document's operations no exchange reached.
func (k *contract) unseen() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, item := range k.doc.Paths.Map() {
		for _, op := range item.Operations() {
			if len(k.seen[op.OperationID]) == 0 {
				out = append(out, op.OperationID)
			}
		}
	}
	sort.Strings(out)
	return out
}

// unprovoked lists, as "operation status", the statuses of want that the
// document lists for an operation but no exchange drew from it.
func (k *contract) unprovoked(want ...int) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, item := range k.doc.Paths.Map() {
		for _, op := range item.Operations() {
			for _, code := range want {
				if op.Responses.Status(code) != nil && !k.seen[op.OperationID][code] {
					out = append(out, fmt.Sprintf("%s %d", op.OperationID, code))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}
