package worker_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/worker"
)

// artifactSHA reads an artifact back from agora_artifacts and returns the
// SHA-256 of its bytes.
func (h *harness) artifactSHA(ref string) string {
	h.t.Helper()
	obs := natstest.ObjectStore(h.t, h.js, lifecycle.BucketArtifacts)
	r, err := obs.Get(h.t.Context(), ref)
	if err != nil {
		h.t.Fatalf("get %s: %v", ref, err)
	}
	defer r.Close()
	sum := sha256.New()
	if _, err := io.Copy(sum, r); err != nil {
		h.t.Fatal(err)
	}
	return hex.EncodeToString(sum.Sum(nil))
}

// objects lists the names in agora_artifacts under a dispatch.
func (h *harness) objects(dispatchID string) []string {
	h.t.Helper()
	obs := natstest.ObjectStore(h.t, h.js, lifecycle.BucketArtifacts)
	list, err := obs.List(h.t.Context())
	if err != nil && err != jetstream.ErrNoObjectsFound {
		h.t.Fatal(err)
	}
	var names []string
	for _, o := range list {
		if strings.HasPrefix(o.Name, dispatchID+"/") {
			names = append(names, o.Name)
		}
	}
	slices.Sort(names)
	return names
}

// A sub-agent leaves a 20 MiB binary, a diff and a nested text file, plus a
// symlink and a FIFO: the three regular files are uploaded byte for byte
// and listed in path order with their digests and types; the symlink and
// the FIFO are refused and listed as skipped.
func TestArtifactsUploadedAndListed(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	h.shell("maker", `set -e
cd "$AGORA_ARTIFACTS_DIR"
head -c 20971520 /dev/urandom > big.bin
printf -- '--- a/x.go\n+++ b/x.go\n@@ -1 +1 @@\n-old\n+new\n' > fix.diff
mkdir -p reports/2026 && echo "all green" > reports/2026/summary.txt
ln -s /etc/passwd passwd-link
mkfifo pipe
sha256sum big.bin fix.diff reports/2026/summary.txt > "$AGORA_WORKSPACE/sums"
awk '{printf "%s\"%s\":\"%s\"", (NR>1?",":"{"), $2, $1} END {print "}"}' "$AGORA_WORKSPACE/sums" > "$AGORA_OUTPUT_FILE"`)
	id := h.dispatch(lifecycle.Request{Subagent: "maker"})
	f, ok := h.terminal(id).Data.(*lifecycle.Finished)
	if !ok {
		t.Fatalf("terminal = %+v, want finished", h.terminal(id).Data)
	}
	var sums map[string]string
	if err := json.Unmarshal(f.Output, &sums); err != nil {
		t.Fatalf("output %s: %v", f.Output, err)
	}
	var names []string
	for _, a := range f.Artifacts {
		names = append(names, a.Name)
		if a.SHA256 != sums[a.Name] || a.Ref != id+"/"+a.Name {
			t.Errorf("artifact %+v: the sub-agent's sha256 is %s", a, sums[a.Name])
		}
		if got := h.artifactSHA(a.Ref); got != a.SHA256 {
			t.Errorf("%s: stored bytes hash to %s, listed %s", a.Name, got, a.SHA256)
		}
	}
	if want := []string{"big.bin", "fix.diff", "reports/2026/summary.txt"}; !slices.Equal(names, want) {
		t.Fatalf("artifacts = %v, want %v", names, want)
	}
	types := map[string]string{}
	for _, a := range f.Artifacts {
		types[a.Name] = a.ContentType
	}
	if types["big.bin"] != "application/octet-stream" || types["fix.diff"] != "text/x-diff; charset=utf-8" || types["reports/2026/summary.txt"] != "text/plain; charset=utf-8" {
		t.Errorf("content types = %v", types)
	}
	if f.Artifacts[0].Size != 20<<20 {
		t.Errorf("big.bin size = %d", f.Artifacts[0].Size)
	}
	skipped := map[string]string{}
	for _, s := range f.ArtifactsSkipped {
		skipped[s.Name] = s.Reason
	}
	if !strings.Contains(skipped["passwd-link"], "symlink") || !strings.Contains(skipped["pipe"], "FIFO") || len(skipped) != 2 {
		t.Errorf("skipped = %v, want the symlink and the FIFO", skipped)
	}
	if objs := h.objects(id); len(objs) != 3 {
		t.Errorf("objects under %s = %v, want the three files only", id, objs)
	}
}

// Past a cap, files are skipped and listed with the cap named; the outcome
// is unchanged. needs_input and failed dispatches carry their artifacts too.
func TestArtifactCapsAndOutcomes(t *testing.T) {
	h := newHarness(t, provision.Config{})
	cfg := h.workerConfig()
	cfg.ArtifactMaxFile, cfg.ArtifactMaxTotal, cfg.ArtifactMaxCount = "1KiB", "1500B", 3
	h.startWorker(cfg, worker.Deps{})
	h.shell("capped", `cd "$AGORA_ARTIFACTS_DIR"
head -c 2048 /dev/zero > a-too-big
head -c 1000 /dev/zero > b-fits
head -c 1000 /dev/zero > c-over-total
echo x > d-fits; echo y > e-fits; echo z > f-over-count`)
	h.shell("asker", `echo '+new' > "$AGORA_ARTIFACTS_DIR/change.diff"
echo '{"question":"Apply it?","kind":"approval"}' > "$AGORA_NEEDS_INPUT_FILE"`)
	h.shell("crasher", `echo "trace" > "$AGORA_ARTIFACTS_DIR/debug.log"; exit 3`)

	id := h.dispatch(lifecycle.Request{Subagent: "capped"})
	f, ok := h.terminal(id).Data.(*lifecycle.Finished)
	if !ok {
		t.Fatalf("terminal = %+v, want finished (caps skip files, they do not fail the run)", h.terminal(id).Data)
	}
	var names []string
	for _, a := range f.Artifacts {
		names = append(names, a.Name)
	}
	if want := []string{"b-fits", "d-fits", "e-fits"}; !slices.Equal(names, want) {
		t.Errorf("uploaded %v, want %v", names, want)
	}
	reasons := map[string]string{}
	for _, s := range f.ArtifactsSkipped {
		reasons[s.Name] = s.Reason
	}
	for name, cap := range map[string]string{"a-too-big": "AGORA_WORKER_ARTIFACT_MAX_FILE", "c-over-total": "AGORA_WORKER_ARTIFACT_MAX_TOTAL", "f-over-count": "AGORA_WORKER_ARTIFACT_MAX_COUNT"} {
		if !strings.Contains(reasons[name], cap) {
			t.Errorf("%s skipped for %q, want the cap %s named", name, reasons[name], cap)
		}
	}

	ni, ok := h.terminal(h.dispatch(lifecycle.Request{Subagent: "asker"})).Data.(*lifecycle.NeedsInput)
	if !ok || len(ni.Artifacts) != 1 || ni.Artifacts[0].Name != "change.diff" {
		t.Errorf("needs_input artifacts = %+v", ni)
	}
	fl, ok := h.terminal(h.dispatch(lifecycle.Request{Subagent: "crasher"})).Data.(*lifecycle.Failed)
	if !ok || fl.Reason != lifecycle.ReasonProviderFailed || len(fl.Artifacts) != 1 || fl.Artifacts[0].Name != "debug.log" {
		t.Errorf("failed artifacts = %+v", fl)
	}
}

// A worker killed while it uploads: the redelivered run uploads the same
// names again and its terminal event lists each artifact once, matching
// what is stored.
func TestWorkerKilledDuringUpload(t *testing.T) {
	h := newHarness(t, provision.Config{WorkAckWait: 2 * time.Second})
	h.shell("many", `cd "$AGORA_ARTIFACTS_DIR"
for i in $(seq 1 40); do head -c 2097152 /dev/zero > "part-$i"; done`)
	victim, logs := h.startWorkerProcess("victim")
	id := h.dispatch(lifecycle.Request{Subagent: "many"})
	deadline := time.Now().Add(30 * time.Second)
	for len(h.objects(id)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no upload began; worker output:\n%s", logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = victim.Wait()
	during := len(h.objects(id))
	if during >= 40 {
		t.Skipf("the upload finished (%d objects) before the kill landed", during)
	}
	t.Logf("killed with %d of 40 objects stored", during)

	h.startWorker(h.workerConfig(), worker.Deps{})
	f, ok := h.terminal(id).Data.(*lifecycle.Finished)
	if !ok || f.Attempt != 2 {
		t.Fatalf("terminal = %+v, want finished by attempt 2", h.terminal(id).Data)
	}
	h.assertOneTerminal(id)
	seen := map[string]bool{}
	for _, a := range f.Artifacts {
		if seen[a.Name] {
			t.Errorf("%s listed twice", a.Name)
		}
		seen[a.Name] = true
		if got := h.artifactSHA(a.Ref); got != a.SHA256 {
			t.Errorf("%s: stored %s, listed %s", a.Name, got, a.SHA256)
		}
	}
	if len(f.Artifacts) != 40 || len(h.objects(id)) != 40 {
		t.Errorf("listed %d, stored %d, want 40 each", len(f.Artifacts), len(h.objects(id)))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	obs, _ := h.js.ObjectStore(ctx, lifecycle.BucketArtifacts)
	info, err := obs.GetInfo(ctx, f.Artifacts[0].Ref)
	if err != nil || info.Headers.Get("Agora-Attempt") != "2" {
		t.Errorf("object %s: %+v %v, want uploaded by attempt 2", f.Artifacts[0].Ref, info, err)
	}
}
