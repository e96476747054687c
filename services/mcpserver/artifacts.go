package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// artifactURIPrefix starts the URI of an artifact resource:
// agora://artifacts/<dispatch_id>/<name>.
const artifactURIPrefix = "agora://artifacts/"

// maxResourceBytes bounds an artifact read through MCP.
const maxResourceBytes = 8 << 20

// ArtifactRef is an artifact in a Result: read it with resources/read on
// its uri.
type ArtifactRef struct {
	Name        string `json:"name"`
	Size        int64  `json:"size"`
	ContentType string `json:"content_type"`
	SHA256      string `json:"sha256"`
	URI         string `json:"uri" jsonschema:"read it with resources/read"`
}

func artifactRefs(dispatchID string, d lifecycle.Data) []ArtifactRef {
	outs := lifecycle.RunOutputs(d)
	if outs == nil {
		return nil
	}
	var refs []ArtifactRef
	for _, a := range outs.Artifacts {
		refs = append(refs, ArtifactRef{Name: a.Name, Size: a.Size, ContentType: a.ContentType, SHA256: a.SHA256,
			URI: artifactURIPrefix + dispatchID + "/" + (&url.URL{Path: a.Name}).EscapedPath()})
	}
	return refs
}

// withLinks returns the tool result for r: its JSON as text, and a
// resource link per artifact.
func withLinks(r *Result) *mcp.CallToolResult {
	b, _ := json.Marshal(r)
	res := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}}
	for _, a := range r.Artifacts {
		size := a.Size
		res.Content = append(res.Content, &mcp.ResourceLink{URI: a.URI, Name: a.Name, MIMEType: a.ContentType, Size: &size,
			Description: "an artifact of dispatch " + r.DispatchID})
	}
	return res
}

// readArtifact serves resources/read of an artifact URI.
func (t *tools) readArtifact(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	rest, ok := strings.CutPrefix(uri, artifactURIPrefix)
	id, escaped, ok2 := strings.Cut(rest, "/")
	name, err := url.PathUnescape(escaped)
	if !ok || !ok2 || err != nil || lifecycle.ValidToken(id) != nil || name == "" {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if err := t.seeDispatch(ctx, id, false); err != nil {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	r, a, err := t.s.c.OpenArtifact(ctx, id, name)
	switch {
	case errors.Is(err, client.ErrNotFound), errors.Is(err, client.ErrNotEnded):
		return nil, mcp.ResourceNotFoundError(uri)
	case errors.Is(err, client.ErrArtifactExpired):
		return nil, fmt.Errorf("%s has expired (artifacts are kept as long as the lifecycle history)", uri)
	case err != nil:
		return nil, t.explain(err)
	}
	defer r.Close()
	if a.Size > maxResourceBytes {
		return nil, fmt.Errorf("%s is %d bytes, over the %d bytes served here: download it with `agora artifacts get %s %s`", uri, a.Size, maxResourceBytes, id, name)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", uri, err)
	}
	c := &mcp.ResourceContents{URI: uri, MIMEType: a.ContentType}
	if strings.Contains(a.ContentType, "charset=utf-8") || a.ContentType == "application/json" {
		c.Text = string(b)
	} else {
		c.Blob = b
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{c}}, nil
}
