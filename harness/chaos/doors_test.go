package chaos_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/harness/chaos"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// One thread in five goes through A2A and one in five through MCP Tasks,
// so that even a short round has some of each.
func TestDoorShares(t *testing.T) {
	n := map[string]int{}
	for i := range 30 {
		n[chaos.DoorOf(i)]++
	}
	if n["a2a"] != 6 || n["mcp"] != 6 || n["api"] != 18 {
		t.Fatalf("30 threads by door: %v, want 6 a2a, 6 mcp, 18 api", n)
	}
}

// The audit wants each door to report its thread completed with the
// output the thread finished with (the same JSON value, in any key
// order), read from a real lifecycle stream.
func TestAuditDoorEnds(t *testing.T) {
	output := json.RawMessage(`{"nonce":"n1","attempt":1}`)
	cases := []struct {
		name    string
		end     chaos.TaskEnd
		anomaly string // "" when none
	}{
		{name: "completed with the output, keys reordered", end: chaos.NewTaskEnd("completed", json.RawMessage(`{"attempt":1,"nonce":"n1"}`))},
		{name: "still waiting", end: chaos.NewTaskEnd("TASK_STATE_INPUT_REQUIRED", nil), anomaly: "a2a reports task t1 TASK_STATE_INPUT_REQUIRED, want completed"},
		{name: "another output", end: chaos.NewTaskEnd("completed", json.RawMessage(`{"nonce":"n0","attempt":1}`)), anomaly: `completed with output {"nonce":"n0","attempt":1}, want the thread's`},
		{name: "never read", end: chaos.NewTaskEnd("unread: connection refused", nil), anomaly: "unread: connection refused, want completed"},
	}
	srv := natstest.StartProvisioned(t, provision.Config{})
	js := srv.JetStream(t)
	_, m, err := lifecycle.Message(lifecycle.Source("worker", "chaos-w1"), &lifecycle.Finished{
		Common: lifecycle.Common{DispatchID: "d1", ThreadID: "t1", Subagent: "chaos"}, Producer: lifecycle.Producer{WorkerID: "chaos-w1", Attempt: 1}, Output: output})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rep := chaos.AuditDoorEnds(t.Context(), js, map[string]string{"t1": "a2a"}, map[string]chaos.TaskEnd{"t1": tc.end})
			switch {
			case tc.anomaly == "" && (len(rep.Anomalies) > 0 || rep.DoorEnds != 1):
				t.Errorf("anomalies %q, %d ends checked; want none and 1", rep.Anomalies, rep.DoorEnds)
			case tc.anomaly != "" && !slices.ContainsFunc(rep.Anomalies, func(a string) bool { return strings.Contains(a, tc.anomaly) }):
				t.Errorf("anomalies %q, want one with %q", rep.Anomalies, tc.anomaly)
			}
		})
	}
}
