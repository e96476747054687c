package dispatcher

import (
	"encoding/json"
	"io/fs"
	"net/http"
	"path"
	"sync"

	"github.com/agora-dispatch/agora/internal/problem"

	"github.com/agora-dispatch/agora/internal/buildinfo"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/schema"
)

// httpOpenAPI serves GET /v1/openapi.json: the HTTP API's OpenAPI 3.1
// document, which holds the event schemas it refers to (docs/api.md).
func (s *Service) httpOpenAPI(w http.ResponseWriter, r *http.Request) {
	b, err := servedOpenAPI()
	if err != nil {
		s.log.Error("openapi document", "err", err)
		problem.Write(w, r, &client.Problem{Type: client.ProblemUnavailable, Title: "Service unavailable", Status: http.StatusInternalServerError,
			Detail: "the OpenAPI document could not be built"})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=3600")
	_, _ = w.Write(b)
}

// servedOpenAPI is the document with info.version set to the build's version
// (internal/buildinfo), built once.
var servedOpenAPI = sync.OnceValues(func() ([]byte, error) {
	b, err := schema.OpenAPI()
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	if info, ok := doc["info"].(map[string]any); ok {
		info["version"] = buildinfo.Version()
	}
	return json.Marshal(doc)
})

// httpSchema serves GET /v1/schemas/{name}: the JSON Schema an event's
// dataschema names (schema/cloudevents/<name>), and asyncapi.yaml, from the
// copy built into the binary, so the contract is readable from a running
// Agora as well as from the repository.
func (s *Service) httpSchema(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	p := path.Join(schema.Dir, name)
	ct := "application/schema+json"
	if name == schema.AsyncAPIName {
		p, ct = name, "application/yaml"
	}
	b, err := fs.ReadFile(schema.FS(), p)
	if err != nil || path.Base(name) != name {
		problem.Write(w, r, &client.Problem{Type: client.ProblemNotFound, Title: "Not found", Status: http.StatusNotFound,
			Detail: "no schema " + name + ": the names are those of the events' dataschema, and asyncapi.yaml"})
		return
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Cache-Control", "public, max-age=3600")
	_, _ = w.Write(b)
}
