package dispatcher_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

// TestMicroStatsTellTheTruth: what `nats micro info agora` and `nats micro
// stats agora` read ($SRV.STATS) counts every error reply of the micro
// endpoints, refusals (422) and unknown ids (404) included, and its
// processing time covers the real handling: at least the time the
// dispatcher's own histogram measured inside the handler of the same
// requests. Each verb is served by several endpoints in one queue group,
// so requests are still handled side by side (docs/dispatcher.md).
func TestMicroStatsTellTheTruth(t *testing.T) {
	const lanes = 4
	h := newHarness(t, dispatcher.Config{Concurrency: lanes})

	sent := map[string]int{}   // requests per subject
	errors := map[string]int{} // error replies per subject
	codes := map[string]bool{} // the error codes seen
	call := func(subject, body string) {
		t.Helper()
		m := h.microCall(subject, []byte(body), nil)
		sent[subject]++
		if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
			errors[subject]++
			codes[code] = true
		}
	}
	for i := range 3 {
		call(lifecycle.APIDispatch, `{"subagent":"planner","dispatch_id":"stats-`+strconv.Itoa(i)+`"}`)
	}
	call(lifecycle.APIDispatch, `{"subagent":"planner","timeout":"soon"}`)
	call(lifecycle.APIDispatch, `not json`)
	call(lifecycle.APIStatus, `{"dispatch_id":"stats-0"}`)
	call(lifecycle.APIStatus, `{"dispatch_id":"no-such-dispatch"}`)
	call(lifecycle.APIStatus, `{}`)
	call(lifecycle.APICancel, `{"dispatch_id":"no-such-dispatch"}`)
	call(lifecycle.APICancel, `{"dispatch_id":"stats-1","by":"test"}`)
	if !codes["422"] || !codes["404"] {
		t.Fatalf("error codes seen %v, want 422 and 404 among them", codes)
	}
	if errors[lifecycle.APIDispatch] != 2 || errors[lifecycle.APIStatus] != 2 || errors[lifecycle.APICancel] != 1 {
		t.Fatalf("error replies per subject %v", errors)
	}

	// micro records a request's figures once its handler has returned,
	// which is after the reply: wait for every request to be counted.
	type total struct {
		requests, errors, endpoints int
		processing                  time.Duration
		queueGroups                 map[string]bool
		lastErrors                  []string
	}
	var totals map[string]*total
	testkit.Eventually(t, waitFor, "every request counted in $SRV.STATS", func() bool {
		totals = map[string]*total{}
		for _, e := range microStats(t, h).Endpoints {
			tt := totals[e.Subject]
			if tt == nil {
				tt = &total{queueGroups: map[string]bool{}}
				totals[e.Subject] = tt
			}
			tt.endpoints++
			tt.requests += e.NumRequests
			tt.errors += e.NumErrors
			tt.processing += e.ProcessingTime
			tt.queueGroups[e.QueueGroup] = true
			if e.LastError != "" {
				tt.lastErrors = append(tt.lastErrors, e.LastError)
			}
		}
		for subject, n := range sent {
			if totals[subject] == nil || totals[subject].requests < n {
				return false
			}
		}
		return true
	})
	for subject, n := range sent {
		got := totals[subject]
		if got.requests != n {
			t.Errorf("%s: %d requests counted, %d sent", subject, got.requests, n)
		}
		if got.errors != errors[subject] {
			t.Errorf("%s: %d errors counted, %d error replies sent (last errors %q)", subject, got.errors, errors[subject], got.lastErrors)
		}
		if got.endpoints < 2 || len(got.queueGroups) != 1 {
			t.Errorf("%s: %d endpoints in queue groups %v, want several in one, so requests are handled side by side", subject, got.endpoints, got.queueGroups)
		}
	}
	if le := strings.Join(totals[lifecycle.APIDispatch].lastErrors, " | "); !strings.Contains(le, "422") {
		t.Errorf("dispatch last errors %q, want the 422", le)
	}

	// The histogram times each dispatch inside the handler; micro's
	// processing time, taken around the handler, must cover it.
	inside := microHistogramSum(t, h)
	if inside <= 0 {
		t.Fatalf("agora_dispatcher_request_duration_seconds_sum{door=\"micro\"} = %v, want the handled dispatches' time", inside)
	}
	if got := totals[lifecycle.APIDispatch].processing; got < inside {
		t.Errorf("micro processing time of dispatch %v, less than the %v its handling took: it does not time the real handling", got, inside)
	}
}

// microStats asks the service agora for its stats ($SRV.STATS.agora); one
// dispatcher runs, so one instance answers.
func microStats(t *testing.T, h *harness) micro.Stats {
	t.Helper()
	subj, err := micro.ControlSubject(micro.StatsVerb, "agora", "")
	if err != nil {
		t.Fatal(err)
	}
	m := h.microCall(subj, nil, nil)
	var st micro.Stats
	if err := json.Unmarshal(m.Data, &st); err != nil {
		t.Fatalf("$SRV.STATS: %v: %s", err, m.Data)
	}
	return st
}

// microHistogramSum reads the seconds the micro door's dispatch requests
// took from /metrics.
func microHistogramSum(t *testing.T, h *harness) time.Duration {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, h.http.URL+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	const name = `agora_dispatcher_request_duration_seconds_sum{door="micro"} `
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s%s: %v", name, v, err)
			}
			return time.Duration(f * float64(time.Second))
		}
	}
	t.Fatalf("/metrics has no %s(status %s, %v)", name, resp.Status, sc.Err())
	return 0
}
