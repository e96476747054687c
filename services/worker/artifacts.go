package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/consume"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Artifacts are the regular files a run leaves under .agora/artifacts/.
// After the runtime (and everything it started) has exited, the worker
// uploads them to agora_artifacts under <dispatch_id>/<path>, in path order,
// and lists them in the terminal event. It reads through os.Root (nothing
// outside the folder, no symlink followed); a symlink, FIFO, device or
// socket is skipped and listed with the reason, and so is a file past a cap
// (per file, per dispatch total, count, and the listing's own bound: a file
// whose entry would not fit the terminal event's artifacts list is not
// uploaded). The skipped list is bounded too; what it leaves out is
// counted. A rerun after a crash uploads the same names again, replacing
// what an earlier attempt left; only the terminal event's listing counts.
// See docs/artifacts.md.

// headerAttempt records on each object the delivery attempt that uploaded
// it, so a reader can tell a stale attempt's object from the listed one.
const headerAttempt = "Agora-Attempt"

// uploadArtifacts uploads the run's artifacts. ws is the workspace; an
// absent folder means none. An error is a transient store failure: the
// delivery is retried.
func (s *Service) uploadArtifacts(ctx context.Context, j *job, ws string) (lifecycle.Outputs, error) {
	var out lifecycle.Outputs
	if ws == "" {
		return out, nil
	}
	var skipped skipList
	dir := openArtifacts(ws, &out, &skipped)
	if dir == nil {
		return out, nil
	}
	defer dir.Close()
	var total int64
	listed := 1 // bytes of the artifacts list's JSON: "[]" less the comma the first entry does not need
	err := fs.WalkDir(dir.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			skipped.add(&out, name, "unreadable: "+err.Error())
			if d != nil && d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if name == "." || d.IsDir() {
			return nil
		}
		skip := func(reason string) error {
			skipped.add(&out, name, reason)
			return nil
		}
		if !d.Type().IsRegular() {
			return skip(kindOf(d.Type()) + ", not a regular file")
		}
		info, err := d.Info()
		if err != nil {
			return skip("unreadable: " + err.Error())
		}
		if over := s.caps.over(len(out.Artifacts), total, listed+entrySize(j.req.DispatchID, name, info.Size()), info.Size()); over != "" {
			return skip(over)
		}
		a, err := s.uploadOne(ctx, j, dir, name, info)
		var bad *notRegular
		if errors.As(err, &bad) {
			return skip(bad.Error())
		}
		if tooLarge(err) {
			// The store can never take it (a chunk over the server's max
			// payload): retrying the delivery would not help.
			return skip("refused by the object store: " + err.Error())
		}
		if err != nil {
			return err
		}
		total += a.Size
		listed += jsonSize(a) + 1
		out.Artifacts = append(out.Artifacts, a)
		return nil
	})
	if err != nil {
		return lifecycle.Outputs{}, fmt.Errorf("upload artifacts: %w", err)
	}
	if len(out.Artifacts) > 0 || skipped.n > 0 {
		j.log.Info("artifacts uploaded", "count", len(out.Artifacts), "bytes", total, "skipped", skipped.n)
	}
	return out, nil
}

// openArtifacts opens the workspace's artifacts folder, nil when there is
// none to upload; one that is not a folder is noted as skipped.
func openArtifacts(ws string, out *lifecycle.Outputs, skipped *skipList) *os.Root {
	root, err := os.OpenRoot(ws)
	if err != nil {
		return nil
	}
	defer root.Close()
	fi, err := root.Lstat(lifecycle.ArtifactsDir)
	if err != nil || !fi.IsDir() {
		if err == nil {
			skipped.add(out, ".", lifecycle.ArtifactsDir+" is "+kindOf(fi.Mode())+", not a folder")
		}
		return nil
	}
	dir, err := root.OpenRoot(lifecycle.ArtifactsDir)
	if err != nil {
		return nil
	}
	return dir
}

// over names the cap a file of size bytes would pass, "" when it fits:
// count files and total bytes are uploaded already, and listed is the
// artifacts list's size with the file's entry.
func (c artifactCaps) over(count int, total int64, listed int, size int64) string {
	switch {
	case count >= c.count:
		return fmt.Sprintf("over the count cap (AGORA_WORKER_ARTIFACT_MAX_COUNT=%d files)", c.count)
	case size > c.file:
		return fmt.Sprintf("%d bytes: over the per-file cap (AGORA_WORKER_ARTIFACT_MAX_FILE=%d bytes)", size, c.file)
	case total+size > c.total:
		return fmt.Sprintf("%d bytes: over the per-dispatch total cap (AGORA_WORKER_ARTIFACT_MAX_TOTAL=%d bytes)", size, c.total)
	case listed > lifecycle.MaxArtifactsListBytes:
		return fmt.Sprintf("over the listing cap (%d bytes of entries in the terminal event's artifacts list)", lifecycle.MaxArtifactsListBytes)
	}
	return ""
}

// skipList fills a run's artifacts_skipped within its bounds
// (lifecycle.MaxSkippedListed entries, lifecycle.MaxSkippedListBytes of
// JSON) and counts the rest in artifacts_skipped_omitted. Once one entry
// is left out, so are all after it: the list stays a prefix in path order.
type skipList struct {
	n     int // files skipped, listed or not
	bytes int
	full  bool
}

func (l *skipList) add(out *lifecycle.Outputs, name, reason string) {
	l.n++
	e := lifecycle.SkippedArtifact{Name: name, Reason: reason}
	size := jsonSize(e) + 1
	if l.full || len(out.ArtifactsSkipped) >= lifecycle.MaxSkippedListed || l.bytes+size > lifecycle.MaxSkippedListBytes {
		l.full = true
		out.ArtifactsSkippedOmitted++
		return
	}
	l.bytes += size
	out.ArtifactsSkipped = append(out.ArtifactsSkipped, e)
}

// entrySize is an upper bound of the JSON of an artifact's entry before it
// is uploaded: its content type is not known yet, so a long one is
// assumed.
func entrySize(dispatchID, name string, size int64) int {
	return jsonSize(lifecycle.Artifact{Name: name, Size: size, SHA256: strings.Repeat("0", 64),
		ContentType: strings.Repeat("x", maxContentType), Ref: lifecycle.ArtifactObject(dispatchID, name)}) + 1
}

// maxContentType bounds the content types contentType returns for the
// listing's estimate (the longest in common mime tables is about 80 bytes).
const maxContentType = 128

// jsonSize is the length of v's JSON (HTML escaping included, so it is an
// upper bound of any encoding of the event).
func jsonSize(v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		return 0
	}
	return len(b)
}

// notRegular is a file that changed into something else between the walk
// and its opening.
type notRegular struct{ what string }

func (e *notRegular) Error() string { return e.what + ", not a regular file" }

// uploadOne streams one file to the object store, hashing and sniffing it
// on the way.
func (s *Service) uploadOne(ctx context.Context, j *job, dir *os.Root, name string, want fs.FileInfo) (lifecycle.Artifact, error) {
	f, err := dir.OpenFile(name, os.O_RDONLY|oNoFollow, 0)
	if err != nil {
		return lifecycle.Artifact{}, &notRegular{what: "unopenable (" + err.Error() + ")"}
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || !os.SameFile(fi, want) {
		return lifecycle.Artifact{}, &notRegular{what: "changed while read"}
	}
	head := make([]byte, 512)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return lifecycle.Artifact{}, &notRegular{what: "unreadable (" + err.Error() + ")"}
	}
	head = head[:n]
	ct := contentType(name, head)
	if len(ct) > maxContentType {
		ct = "application/octet-stream" // keeps entrySize an upper bound
	}
	h := sha256.New()
	// Cap what is read at the size seen, so a file that grows is not read
	// past the cap.
	body := io.TeeReader(io.LimitReader(io.MultiReader(bytes.NewReader(head), f), fi.Size()), h)
	obj := lifecycle.ArtifactObject(j.req.DispatchID, name)
	meta := jetstream.ObjectMeta{Name: obj, Description: ct, Headers: nats.Header{
		headerAttempt: []string{strconv.Itoa(j.attempt)}, "Content-Type": []string{ct},
	}}
	info, err := s.artifacts.Put(context.WithoutCancel(ctx), meta, body)
	if err != nil {
		return lifecycle.Artifact{}, fmt.Errorf("put %s: %w", obj, err)
	}
	return lifecycle.Artifact{Name: name, Size: int64(info.Size), SHA256: hex.EncodeToString(h.Sum(nil)), ContentType: ct, Ref: obj}, nil
}

// typeByExt names the types of text formats mime.TypeByExtension may not
// know, whatever the host's mime tables hold.
var typeByExt = map[string]string{
	".diff": "text/x-diff", ".patch": "text/x-diff", ".md": "text/markdown", ".json": "application/json",
	".csv": "text/csv", ".yaml": "application/yaml", ".yml": "application/yaml", ".go": "text/x-go", ".py": "text/x-python",
}

// contentType sniffs a file's type from its first bytes, refined by its
// name for text formats the sniffer calls plain text; text gets a charset.
func contentType(name string, head []byte) string {
	sniffed := http.DetectContentType(head)
	ext := strings.ToLower(path.Ext(name))
	byName := typeByExt[ext]
	if byName == "" {
		if t := mime.TypeByExtension(ext); t != "" {
			byName, _, _ = strings.Cut(t, ";")
		}
	}
	textual := strings.HasPrefix(sniffed, "text/plain") && utf8.Valid(head)
	switch {
	case textual && byName != "" && (strings.HasPrefix(byName, "text/") || byName == "application/json" || byName == "application/yaml"):
		return byName + "; charset=utf-8"
	case textual:
		return "text/plain; charset=utf-8"
	case sniffed == "application/octet-stream" && byName != "" && !strings.HasPrefix(byName, "text/"):
		return byName
	}
	return sniffed
}

// kindOf names a non-regular file type for a skip reason.
func kindOf(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a folder"
	}
	return "not a regular file"
}

// hasArtifacts reports whether a workspace's artifacts folder exists with
// something in it (or is something other than a folder, to report).
func hasArtifacts(ws string) bool {
	if ws == "" {
		return false
	}
	p := ws + "/" + lifecycle.ArtifactsDir
	fi, err := os.Lstat(p)
	if err != nil {
		return false
	}
	if !fi.IsDir() {
		return true
	}
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	names, _ := f.Readdirnames(1)
	return len(names) > 0
}

// heartbeat runs f while telling JetStream every AckWait/3 that the
// delivery is still in progress, so a long upload is not redelivered.
func (s *Service) heartbeat(j *job, f func() (lifecycle.Outputs, error)) (lifecycle.Outputs, error) {
	stop := consume.KeepAlive(j.msg, consume.KeepAliveEvery(s.ackWait), func(err error) { j.log.Warn("in-progress ack failed", "err", err) })
	defer stop()
	return f()
}
