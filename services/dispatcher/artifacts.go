package dispatcher

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/agora-dispatch/agora/internal/problem"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Artifacts over HTTP (docs/artifacts.md): a dispatch's listing comes from
// its terminal event; one artifact is streamed from agora_artifacts with
// its Content-Length, an ETag of its sha256, and single byte ranges.

// ArtifactList is the body of GET /v1/dispatches/{id}/artifacts. Unlike
// the terminal event's lifecycle.Outputs, it always carries artifacts (an
// empty array when the run left none).
type ArtifactList struct {
	DispatchID              string                      `json:"dispatch_id"`
	Artifacts               []lifecycle.Artifact        `json:"artifacts"`
	ArtifactsOmitted        int                         `json:"artifacts_omitted,omitempty"`
	ArtifactsSkipped        []lifecycle.SkippedArtifact `json:"artifacts_skipped,omitempty"`
	ArtifactsSkippedOmitted int                         `json:"artifacts_skipped_omitted,omitempty"`
}

// Problem types of the artifact routes.
const (
	problemNotEnded = "urn:agora:problem:not-ended"
	problemExpired  = "urn:agora:problem:expired"
	problemRange    = "urn:agora:problem:range-not-satisfiable"
)

func (s *Service) httpArtifacts(w http.ResponseWriter, r *http.Request) {
	s.serve(w, r, func(b *bindings) (any, error) {
		outs, err := s.outputs(r, b)
		if err != nil {
			return nil, err
		}
		if outs.Artifacts == nil {
			outs.Artifacts = []lifecycle.Artifact{}
		}
		return ArtifactList{DispatchID: r.PathValue("id"), Artifacts: outs.Artifacts, ArtifactsOmitted: outs.ArtifactsOmitted,
			ArtifactsSkipped: outs.ArtifactsSkipped, ArtifactsSkippedOmitted: outs.ArtifactsSkippedOmitted}, nil
	})
}

// outputs reads what a dispatch's terminal event lists; a 409 problem
// while it has none.
func (s *Service) outputs(r *http.Request, b *bindings) (lifecycle.Outputs, error) {
	ctx, cancel := opContext(r)
	defer cancel()
	if err := s.allowDispatch(ctx, b, caller(r), r.PathValue("id"), false); err != nil {
		return lifecycle.Outputs{}, err
	}
	rec, links, err := s.statusChain(ctx, b, r.PathValue("id"))
	if err != nil {
		return lifecycle.Outputs{}, err
	}
	t, found := terminal(links)
	if !found {
		return lifecycle.Outputs{}, &client.Problem{Type: problemNotEnded, Title: "Not ended", Status: http.StatusConflict,
			Detail: fmt.Sprintf("dispatch %s is %s: its artifacts are listed when it ends", rec.DispatchID, rec.Status)}
	}
	if o := lifecycle.RunOutputs(t.Data); o != nil {
		return *o, nil
	}
	return lifecycle.Outputs{}, nil
}

func (s *Service) httpArtifact(w http.ResponseWriter, r *http.Request) {
	b, err := s.bind(r.Context())
	if err != nil {
		problem.Write(w, r, s.problem(err))
		return
	}
	outs, err := s.outputs(r, b)
	if err != nil {
		problem.Write(w, r, s.problem(err))
		return
	}
	name := r.PathValue("name")
	var a lifecycle.Artifact
	for _, x := range outs.Artifacts {
		if x.Name == name {
			a = x
		}
	}
	if a.Name == "" {
		problem.Write(w, r, notFound("artifact", r.PathValue("id")+"/"+name))
		return
	}
	etag := `"` + a.SHA256 + `"`
	if match := r.Header.Get("If-None-Match"); match != "" && (match == etag || match == "*") {
		w.Header().Set("ETag", etag)
		w.WriteHeader(http.StatusNotModified)
		return
	}
	obs, err := b.js.ObjectStore(r.Context(), lifecycle.BucketArtifacts)
	if err != nil {
		problem.Write(w, r, s.problem(err))
		return
	}
	obj, err := obs.Get(r.Context(), a.Ref)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		problem.Write(w, r, &client.Problem{Type: problemExpired, Title: "Expired", Status: http.StatusGone,
			Detail: fmt.Sprintf("artifact %s of dispatch %s has expired: artifacts are kept as long as the lifecycle history", name, r.PathValue("id"))})
		return
	}
	if err != nil {
		problem.Write(w, r, s.problem(err))
		return
	}
	defer obj.Close()
	h := w.Header()
	h.Set("Content-Type", a.ContentType)
	h.Set("ETag", etag)
	h.Set("Accept-Ranges", "bytes")
	// An artifact is whatever a sub-agent wrote: never rendered on the
	// API's origin.
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "sandbox")
	h.Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", path.Base(name)))
	start, end, ok := byteRange(r.Header.Get("Range"), a.Size)
	switch {
	case !ok:
		h.Set("Content-Range", fmt.Sprintf("bytes */%d", a.Size))
		problem.Write(w, r, &client.Problem{Type: problemRange, Title: "Range not satisfiable", Status: http.StatusRequestedRangeNotSatisfiable,
			Detail: fmt.Sprintf("the artifact has %d bytes", a.Size)})
		return
	case start > 0 || end < a.Size:
		if _, err := io.CopyN(io.Discard, obj, start); err != nil {
			problem.Write(w, r, s.problem(err))
			return
		}
		h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, end-1, a.Size))
		h.Set("Content-Length", strconv.FormatInt(end-start, 10))
		w.WriteHeader(http.StatusPartialContent)
	default:
		h.Set("Content-Length", strconv.FormatInt(a.Size, 10))
		w.WriteHeader(http.StatusOK)
	}
	if r.Method == http.MethodHead {
		return
	}
	_, _ = io.CopyN(w, obj, end-start)
}

// byteRange reads a Range header for a body of size bytes: the half-open
// [start, end) to send. A missing, malformed or multi-range header means
// the whole body; ok is false only for a range that cannot be satisfied.
func byteRange(header string, size int64) (start, end int64, ok bool) {
	spec, found := strings.CutPrefix(header, "bytes=")
	if !found || strings.Contains(spec, ",") {
		return 0, size, true
	}
	first, last, found := strings.Cut(strings.TrimSpace(spec), "-")
	if !found {
		return 0, size, true
	}
	switch {
	case first == "": // the last n bytes
		n, err := strconv.ParseInt(last, 10, 64)
		if err != nil || n <= 0 {
			return 0, size, n == 0 && err == nil && size == 0
		}
		return max(0, size-n), size, true
	default:
		s, err := strconv.ParseInt(first, 10, 64)
		if err != nil || s < 0 {
			return 0, size, true
		}
		if s >= size {
			return 0, 0, false
		}
		e := size
		if last != "" {
			l, err := strconv.ParseInt(last, 10, 64)
			if err != nil || l < s {
				return 0, size, true
			}
			e = min(l+1, size)
		}
		return s, e, true
	}
}
