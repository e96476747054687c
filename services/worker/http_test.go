package worker_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/worker"
)

// TestHTTPHandler: /healthz answers ok while connected; /metrics counts
// outcomes by kind and reason, times runs, and counts undecodable work
// messages, which are terminated instead of redelivered.
func TestHTTPHandler(t *testing.T) {
	h := newHarness(t, provision.Config{})
	svc := h.startWorker(h.workerConfig(), worker.Deps{})
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)

	t.Run("healthz", func(t *testing.T) {
		resp, err := http.Get(srv.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("status = %d, want 200", resp.StatusCode)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("Content-Type = %q", ct)
		}
		var body struct {
			Status   string `json:"status"`
			WorkerID string `json:"worker_id"`
			Sandbox  struct {
				Isolation   string `json:"isolation"`
				LandlockABI int    `json:"landlock_abi"`
			} `json:"sandbox"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		if body.Status != "ok" || body.WorkerID != svc.ID() || body.Sandbox.Isolation == "" {
			t.Errorf("healthz = %+v", body)
		}
	})

	t.Run("metrics count outcomes", func(t *testing.T) {
		h.shell("ok", `true`)
		h.shell("boom", `exit 3`)
		h.terminal(h.dispatch(lifecycle.Request{Subagent: "ok", Input: json.RawMessage(`{}`)}))
		h.terminal(h.dispatch(lifecycle.Request{Subagent: "boom", Input: json.RawMessage(`{}`)}))
		want := map[string]float64{
			`agora_worker_dispatches_total{kind="finished",reason=""}`:              1,
			`agora_worker_dispatches_total{kind="failed",reason="provider-failed"}`: 1,
			`agora_worker_run_duration_seconds_count{kind="finished"}`:              1,
			`agora_worker_run_duration_seconds_count{kind="failed"}`:                1,
			`agora_worker_run_duration_seconds_bucket{kind="finished",le="+Inf"}`:   1,
			`agora_worker_in_flight`: 0,
		}
		waitMetrics(t, srv.URL, want)
	})

	t.Run("undecodable work is terminated and counted", func(t *testing.T) {
		h.waitWorkEmpty()
		before := lifecycleCount(t, h)

		garbage := nats.NewMsg("agora.dispatch.x")
		garbage.Header.Set(jetstream.MsgIDHeader, "garbage-"+lifecycle.NewID())
		garbage.Data = []byte("\x00\xffnot a cloudevent{")
		if _, err := h.js.PublishMsg(t.Context(), garbage); err != nil {
			t.Fatal(err)
		}
		// A well-formed CloudEvent of the wrong type is just as unusable.
		_, wrong, err := lifecycle.Message(lifecycle.Source("test", "harness"), &lifecycle.Answer{QuestionID: "q-1", Route: "ops", Answer: "A", AnsweredBy: "x"})
		if err != nil {
			t.Fatal(err)
		}
		wrong.Subject = "agora.dispatch.x"
		if _, err := h.js.PublishMsg(t.Context(), wrong); err != nil {
			t.Fatal(err)
		}

		waitMetrics(t, srv.URL, map[string]float64{`agora_worker_dispatches_total{kind="",reason="undecodable"}`: 2})
		h.waitWorkEmpty()
		if info := natstest.ConsumerInfo(t, h.js, lifecycle.StreamDispatch, lifecycle.ConsumerWorkers); info.NumAckPending != 0 || info.NumPending != 0 || info.NumRedelivered != 0 {
			t.Errorf("consumer: %d awaiting ack, %d pending, %d redelivered; want the bad messages gone for good",
				info.NumAckPending, info.NumPending, info.NumRedelivered)
		}
		if after := lifecycleCount(t, h); after != before {
			t.Errorf("lifecycle events %d → %d; an undecodable message must not produce one", before, after)
		}
		// Still counted once each after a while: not redelivered.
		time.Sleep(500 * time.Millisecond)
		waitMetrics(t, srv.URL, map[string]float64{`agora_worker_dispatches_total{kind="",reason="undecodable"}`: 2})
	})
}

// lifecycleCount returns the number of events on AGORA_LIFECYCLE.
func lifecycleCount(t *testing.T, h *harness) uint64 {
	t.Helper()
	return natstest.StreamInfo(t, h.js, lifecycle.StreamLifecycle).State.Msgs
}

// waitMetrics polls /metrics until every series has its wanted value
// (metrics are updated just after the terminal event is published).
func waitMetrics(t *testing.T, base string, want map[string]float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := testkit.Scrape(t, t.Context(), base+"/metrics")
		var wrong []string
		for series, v := range want {
			if g, ok := got[series]; !ok || g != v {
				wrong = append(wrong, series+" = "+strconv.FormatFloat(g, 'g', -1, 64)+" (present "+strconv.FormatBool(ok)+"), want "+strconv.FormatFloat(v, 'g', -1, 64))
			}
		}
		if len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics:\n  %s", strings.Join(wrong, "\n  "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
