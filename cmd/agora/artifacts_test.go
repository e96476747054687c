package main_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// agora artifacts list and get, against agora dev: the listing, a verified
// download to a file and to stdout, an unknown name, an expired artifact
// and one whose bytes changed in the store.
func TestArtifactsVerb(t *testing.T) {
	t.Parallel()
	d := devServer(t)
	mustAgora(t, "subagent", "apply", "-f", writeFile(t, "artist.yaml", `name: artist
runtime: exec
command: ["/bin/sh", "-c", "printf -- '--- a\\n+++ b\\n' > \"$AGORA_ARTIFACTS_DIR/fix.diff\"; head -c 300000 /dev/zero > \"$AGORA_ARTIFACTS_DIR/blob.bin\"; ln -s /etc/hostname \"$AGORA_ARTIFACTS_DIR/link\""]
`))
	r := mustAgora(t, "dispatch", "artist", "--wait", "--json")
	lines := jsonLines(t, r.stdout)
	id := lines[0]["data"].(map[string]any)["dispatch_id"].(string)

	list := jsonLines(t, mustAgora(t, "artifacts", "list", id, "--json").stdout)
	got := map[string]map[string]any{}
	for _, l := range list {
		got[l["name"].(string)] = l
	}
	if len(list) != 3 || got["fix.diff"]["size"] != float64(12) || got["link"]["sha256"] != nil || got["blob.bin"]["size"] != float64(300000) || !strings.Contains(got["link"]["skipped"].(string), "symlink") {
		t.Fatalf("artifacts list --json = %v", list)
	}
	if table := mustAgora(t, "artifacts", "list", id); !strings.Contains(table.stdout, "fix.diff") || !strings.Contains(table.stdout, "skipped: a symlink") {
		t.Errorf("artifacts list:\n%s", table.stdout)
	}

	out := filepath.Join(t.TempDir(), "fix.diff")
	if r := mustAgora(t, "artifacts", "get", id, "fix.diff", "-o", out); !strings.Contains(r.stderr, "verified") {
		t.Errorf("get -o: %s", r)
	}
	if b, _ := os.ReadFile(out); string(b) != "--- a\n+++ b\n" {
		t.Errorf("downloaded %q", b)
	}
	blob := mustAgora(t, "artifacts", "get", id, "blob.bin").stdout
	sum := sha256.Sum256([]byte(blob))
	if len(blob) != 300000 || hex.EncodeToString(sum[:]) != got["blob.bin"]["sha256"] {
		t.Errorf("blob.bin to stdout: %d bytes", len(blob))
	}
	if r := agora(t, "artifacts", "get", id, "nope.txt"); r.code != 1 || !strings.Contains(r.stderr, "has no artifact") {
		t.Errorf("an unknown name: %s", r)
	}

	// Over HTTP: the listing, the whole file with its ETag, a range, a
	// conditional request, an unsatisfiable range, an unknown name.
	get := func(path string, hdr map[string]string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, d.httpURL+path, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := get("/v1/dispatches/"+id+"/artifacts", nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"name":"fix.diff"`) || !strings.Contains(body, `"artifacts_skipped"`) {
		t.Errorf("GET artifacts: %s %s", resp.Status, body)
	}
	resp, body = get("/v1/dispatches/"+id+"/artifacts/fix.diff", nil)
	etag := `"` + got["fix.diff"]["sha256"].(string) + `"`
	if resp.StatusCode != http.StatusOK || body != "--- a\n+++ b\n" || resp.Header.Get("ETag") != etag || resp.Header.Get("Content-Length") != "12" ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/x-diff") || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("GET fix.diff: %s %q %v", resp.Status, body, resp.Header)
	}
	if resp, body = get("/v1/dispatches/"+id+"/artifacts/fix.diff", map[string]string{"Range": "bytes=2-5"}); resp.StatusCode != http.StatusPartialContent ||
		body != "- a\n" || resp.Header.Get("Content-Range") != "bytes 2-5/12" {
		t.Errorf("GET a range: %s %q %v", resp.Status, body, resp.Header)
	}
	if resp, body = get("/v1/dispatches/"+id+"/artifacts/blob.bin", map[string]string{"Range": "bytes=-10"}); resp.StatusCode != http.StatusPartialContent || len(body) != 10 {
		t.Errorf("GET the last 10 bytes: %s %d", resp.Status, len(body))
	}
	if resp, _ = get("/v1/dispatches/"+id+"/artifacts/fix.diff", map[string]string{"If-None-Match": etag}); resp.StatusCode != http.StatusNotModified {
		t.Errorf("GET If-None-Match: %s", resp.Status)
	}
	if resp, _ = get("/v1/dispatches/"+id+"/artifacts/fix.diff", map[string]string{"Range": "bytes=100-"}); resp.StatusCode != http.StatusRequestedRangeNotSatisfiable {
		t.Errorf("GET past the end: %s", resp.Status)
	}
	if resp, _ = get("/v1/dispatches/"+id+"/artifacts/nope", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET an unknown artifact: %s", resp.Status)
	}

	// Changed in the store: the download fails and leaves no file.
	obs, err := d.jetStream(t).ObjectStore(t.Context(), lifecycle.BucketArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.Put(context.Background(), jetstream.ObjectMeta{Name: id + "/fix.diff"}, bytes.NewReader([]byte("tampered!!"))); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.diff")
	if r := agora(t, "artifacts", "get", id, "fix.diff", "-o", bad); r.code != 1 || !strings.Contains(r.stderr, "sha256") {
		t.Errorf("a changed artifact: %s", r)
	}
	if _, err := os.Stat(bad); !os.IsNotExist(err) {
		t.Errorf("a failed download left %s", bad)
	}
	// Gone from the store (past retention): said so.
	if err := obs.Delete(t.Context(), id+"/blob.bin"); err != nil {
		t.Fatal(err)
	}
	if r := agora(t, "artifacts", "get", id, "blob.bin"); r.code != 1 || !strings.Contains(r.stderr, "expired") {
		t.Errorf("an expired artifact: %s", r)
	}
	if resp, _ := get("/v1/dispatches/"+id+"/artifacts/blob.bin", nil); resp.StatusCode != http.StatusGone {
		t.Errorf("GET an expired artifact: %s", resp.Status)
	}
}

// A sub-agent reports progress with `agora progress`: dispatch --wait shows
// the reports on its progress line (and as CloudEvents with --json), and
// events --follow shows them as they come.
func TestProgressVerbAndFollowers(t *testing.T) {
	t.Parallel()
	d := devServer(t)
	def, _ := json.Marshal(map[string]any{"name": "stepper", "runtime": "exec", "command": []string{"sh", "-c",
		`"$0" progress "step one" --percent 10; sleep 0.6; "$0" progress "step two" --percent 90 --done read --todo fix; sleep 0.6`, agoraBin}})
	mustAgora(t, "subagent", "apply", "-f", writeFile(t, "stepper.json", string(def)))

	id := "stepper-" + lifecycle.NewID() // unique: the suite may run again on the same agora dev
	follow := start(t, "events", "--follow", "--thread", id)
	// The follower reads progress from when its consumer is in place (and
	// the lifecycle from the start): wait until the server lists it.
	js := d.jetStream(t)
	progress := lifecycle.ProgressFilter(id, "")
	testkit.Eventually(t, 10*time.Second, "the follower's consumer of "+progress, func() bool {
		return hasConsumer(t, js, lifecycle.StreamProgress, progress)
	})
	r := mustAgora(t, "dispatch", "stepper", "--id", id, "--wait")
	for _, want := range []string{"progress   stepper round 0 — 10% step one", "progress   stepper round 0 — 90% step two (1/2 done)"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("dispatch --wait stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	line := follow.waitLine(t, 10*time.Second, func(l string) bool { return strings.Contains(l, "90% step two") })
	if !strings.Contains(line, "progress") || !strings.Contains(line, "stepper#0") {
		t.Errorf("events --follow line: %q", line)
	}

	j := mustAgora(t, "dispatch", "stepper", "--wait", "--json")
	types := map[string]int{}
	for _, l := range jsonLines(t, j.stdout) {
		types[l["type"].(string)]++
	}
	if types["dev.agora.progress.reported"] < 2 || types["dev.agora.dispatch.finished"] != 1 {
		t.Errorf("dispatch --wait --json types = %v", types)
	}
	if r := agoraWith(t, cleanEnv(), "progress", "x"); r.code != 1 || !strings.Contains(r.stderr, "not inside an Agora dispatch") {
		t.Errorf("progress outside a dispatch: %s", r)
	}
}
