package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The Tasks extension's requests reach tools.respond before the SDK sees
// them: on streamable HTTP from Handler (serveTaskHTTP), on stdio and
// in-process transports from a connection that takes them off the
// stream it reads (taskTransport). Everything else goes to the SDK as it
// came.

// maxTaskBody bounds the body read to find a task request; a longer one
// is the SDK's, as it came.
const maxTaskBody = 4 << 20

// peekTaskCall reads a POST's body and returns the task request it holds,
// if it holds one; the body stays readable for the SDK either way.
func peekTaskCall(r *http.Request) (*jsonrpc.Request, bool) {
	if r.Method != http.MethodPost || r.Body == nil {
		return nil, false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxTaskBody+1))
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
	if err != nil || len(body) > maxTaskBody {
		return nil, false
	}
	msg, err := jsonrpc.DecodeMessage(body)
	if err != nil {
		return nil, false
	}
	req, ok := msg.(*jsonrpc.Request)
	return req, ok && taskCall(req)
}

// serveTaskHTTP answers req, a task request of protocol version v, with
// one JSON response. A request of the sessionless protocol must carry the
// Mcp-Method and Mcp-Name headers of its body (Mcp-Name is the taskId of
// a tasks/* request, the tool's name of tools/call).
func (s *Service) serveTaskHTTP(w http.ResponseWriter, r *http.Request, t *tools, req *jsonrpc.Request, v string) {
	if v >= sessionlessProtocol {
		if err := taskHeaders(r.Header, req, v); err != nil {
			writeRPC(w, http.StatusBadRequest, &jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: mcp.CodeHeaderMismatch, Message: err.Error()}})
			return
		}
	}
	writeRPC(w, http.StatusOK, t.respond(r.Context(), req))
}

// taskHeaders checks the standard headers of a sessionless request
// against its body.
func taskHeaders(h http.Header, req *jsonrpc.Request, v string) error {
	var p struct {
		Name   string                     `json:"name"`
		TaskID string                     `json:"taskId"`
		Meta   map[string]json.RawMessage `json:"_meta"`
	}
	_ = json.Unmarshal(req.Params, &p)
	name := p.TaskID
	if req.Method == "tools/call" {
		name = p.Name
	}
	var mv string
	_ = json.Unmarshal(p.Meta[mcp.MetaKeyProtocolVersion], &mv)
	switch {
	case h.Get("Mcp-Method") != req.Method:
		return fmt.Errorf("header mismatch: Mcp-Method header value %q does not match body value %q", h.Get("Mcp-Method"), req.Method)
	case h.Get("Mcp-Name") != name:
		return fmt.Errorf("header mismatch: Mcp-Name header value %q does not match body value %q", h.Get("Mcp-Name"), name)
	case mv != v:
		return fmt.Errorf("header mismatch: MCP-Protocol-Version header value %q does not match _meta %s %q", v, mcp.MetaKeyProtocolVersion, mv)
	}
	return nil
}

func writeRPC(w http.ResponseWriter, status int, resp *jsonrpc.Response) {
	b, err := jsonrpc.EncodeMessage(resp)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// taskTransport serves the Tasks extension on a transport's connection
// (stdio, or in-process) beside the SDK server that reads it.
type taskTransport struct {
	mcp.Transport
	t *tools
}

func (tt taskTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := tt.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	return &taskConn{Connection: c, t: tt.t, ctx: cctx, cancel: cancel}, nil
}

// taskConn takes the task requests off the messages it reads and answers
// each from a goroutine of its own, which Close ends and waits for.
type taskConn struct {
	mcp.Connection
	t      *tools
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (c *taskConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	for {
		msg, err := c.Connection.Read(ctx)
		if err != nil {
			return nil, err
		}
		req, ok := msg.(*jsonrpc.Request)
		if !ok || !taskCall(req) {
			return msg, nil
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			if err := c.Connection.Write(c.ctx, c.t.respond(c.ctx, req)); err != nil {
				c.t.s.log.Warn("mcp task: writing the response failed", "method", req.Method, "err", err)
			}
		}()
	}
}

func (c *taskConn) Close() error {
	c.cancel()
	err := c.Connection.Close()
	c.wg.Wait()
	return err
}
