package lifecycle

// Artifacts: files a sub-agent writes under .agora/artifacts/ are uploaded
// by the worker to the object store bucket agora_artifacts, each under
// ArtifactObject(dispatch_id, name), and listed in the dispatch's terminal
// event (finished, needs_input, failed). See docs/artifacts.md.

// BucketArtifacts is the object store bucket of artifacts.
const BucketArtifacts = "agora_artifacts"

// ArtifactsDir is where a sub-agent writes artifacts, relative to its
// workspace (AGORA_ARTIFACTS_DIR holds the absolute path).
const ArtifactsDir = ".agora/artifacts"

// ArtifactObject returns the object name of a dispatch's artifact:
// <dispatch_id>/<name>.
func ArtifactObject(dispatchID, name string) string { return dispatchID + "/" + name }

// Artifact is one uploaded file of a dispatch.
type Artifact struct {
	// Name is the file's path under .agora/artifacts/, with '/' separators.
	Name string `json:"name"`
	Size int64  `json:"size"`
	// SHA256 is the lowercase hex SHA-256 of the content.
	SHA256 string `json:"sha256"`
	// ContentType is sniffed from the content and the name, with a
	// charset for text.
	ContentType string `json:"content_type"`
	// Ref is the object's name in agora_artifacts.
	Ref string `json:"ref"`
}

// SkippedArtifact is a file under .agora/artifacts/ that was not uploaded,
// and why: not a regular file (a symlink, FIFO, device, socket), or over a
// cap (named).
type SkippedArtifact struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Outputs are the files a run left, carried by the terminal events a run
// produces (finished, needs_input, failed). Both lists are bounded so the
// event fits a NATS message (docs/artifacts.md, "Bounds"); what a list
// leaves out is counted beside it.
type Outputs struct {
	Artifacts []Artifact `json:"artifacts,omitempty"`
	// ArtifactsOmitted counts uploaded artifacts that Artifacts does not
	// list: the worker dropped them from the listing so the terminal event
	// fits the server's max payload. Their objects stay in agora_artifacts
	// until they expire, but no reader offers them.
	ArtifactsOmitted int               `json:"artifacts_omitted,omitempty"`
	ArtifactsSkipped []SkippedArtifact `json:"artifacts_skipped,omitempty"`
	// ArtifactsSkippedOmitted counts files that were not uploaded and that
	// ArtifactsSkipped does not list, past its bounds.
	ArtifactsSkippedOmitted int `json:"artifacts_skipped_omitted,omitempty"`
}

// Bounds of the lists a terminal event carries. The worker uploads no file
// whose entry would not fit MaxArtifactsListBytes (besides its count cap,
// AGORA_WORKER_ARTIFACT_MAX_COUNT), so every object it stores is listed
// unless the event has to shrink further to fit the server's max payload.
const (
	// MaxArtifactsListBytes bounds the JSON of the artifacts list.
	MaxArtifactsListBytes = 256 << 10
	// MaxSkippedListed and MaxSkippedListBytes bound artifacts_skipped.
	MaxSkippedListed    = 100
	MaxSkippedListBytes = 32 << 10
)

// RunOutputs returns the outputs of a terminal event's data, or nil for
// data that carries none.
func RunOutputs(d Data) *Outputs {
	switch v := d.(type) {
	case *Finished:
		return &v.Outputs
	case *NeedsInput:
		return &v.Outputs
	case *Failed:
		return &v.Outputs
	}
	return nil
}
