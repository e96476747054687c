package main_test

import (
	"encoding/json"
	"testing"
	"time"
)

// A small chaos round through the real binary: separate service processes
// killed and paused while threads run, then the audit. -short skips it.
func TestChaosSmallRound(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos round: skipped with -short")
	}
	// The deadline bounds the threads' ends; reading the doors' tasks,
	// stopping the services and the audit come after it.
	r := agoraWithin(t, 2*time.Minute, cleanEnv(), "chaos", "--threads", "12", "--fault-every", "800ms", "--fault-window", "4s", "--deadline", "50s", "--json")
	var rep struct {
		Threads    int            `json:"threads"`
		Events     int            `json:"events_audited"`
		Faults     map[string]int `json:"faults"`
		Anomalies  []string       `json:"anomalies"`
		Dispatches int            `json:"dispatches"`
		Questions  int            `json:"questions"`
		Coalesced  int            `json:"coalesced_questions"`
		Groups     int            `json:"coalesced_groups"`
		GroupSizes []int          `json:"group_sizes"`
		Resumes    int            `json:"resumes_checked"`
		ByDoor     map[string]int `json:"threads_by_door"`
		DoorEnds   int            `json:"door_ends_checked"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("chaos --json: %v\n%s", err, r)
	}
	if r.code != 0 || len(rep.Anomalies) > 0 {
		t.Fatalf("chaos found anomalies (exit %d): %v\n%s", r.code, rep.Anomalies, r.stderr)
	}
	if rep.Threads != 12 || rep.Events == 0 || rep.Dispatches < 12 {
		t.Fatalf("the audit looked at too little: %+v", rep)
	}
	// Some threads go through A2A and some through MCP Tasks, and each
	// door reported every one of its threads completed with its output.
	if rep.ByDoor["a2a"] != 3 || rep.ByDoor["mcp"] != 2 || rep.DoorEnds != 5 {
		t.Errorf("threads by door %v, %d door ends checked; want 3 through a2a, 2 through mcp, 5 checked", rep.ByDoor, rep.DoorEnds)
	}
	// Ask once: every question asked was matched to one re-dispatch, and
	// each group holds its asked question and those that joined it.
	if rep.Resumes != rep.Questions {
		t.Errorf("%d questions asked, %d matched to a re-dispatch", rep.Questions, rep.Resumes)
	}
	sum := 0
	for _, n := range rep.GroupSizes {
		if n < 2 {
			t.Errorf("a group of %d threads: %v", n, rep.GroupSizes)
		}
		sum += n
	}
	if len(rep.GroupSizes) != rep.Groups || sum != rep.Groups+rep.Coalesced {
		t.Errorf("%d groups of %v threads, %d questions joined", rep.Groups, rep.GroupSizes, rep.Coalesced)
	}
	n := 0
	for _, v := range rep.Faults {
		n += v
	}
	if n == 0 {
		t.Fatalf("no fault was injected: %+v", rep)
	}
}
