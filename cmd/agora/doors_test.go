package main_test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// A listen address that is not HOST:PORT says so, on every door with
// --http; only an address in use asks whether another process holds it.
func TestListenAddressErrors(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() })
	inUse := busy.Addr().String()
	dev := func(addr string) []string {
		return []string{"dev", "--memory", "--nats-listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--http", addr}
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"dev empty port", dev("localhost:"), "want HOST:PORT, e.g. 127.0.0.1:8080"},
		{"dev too many colons", dev("127.0.0.1:80:80"), "want HOST:PORT, e.g. 127.0.0.1:8080"},
		{"dev in use", dev(inUse), "is another agora dev running?"},
		{"inbox empty port", []string{"inbox", "--dev-token", "--http", "localhost:"}, "want HOST:PORT, e.g. 127.0.0.1:8080"},
		{"inbox too many colons", []string{"inbox", "--dev-token", "--http", "a:b:c"}, "want HOST:PORT, e.g. 127.0.0.1:8080"},
		{"mcp empty port", []string{"mcp", "--http", "localhost:"}, "want HOST:PORT, e.g. 127.0.0.1:8080"},
		{"mcp too many colons", []string{"mcp", "--http", "a:b:c"}, "want HOST:PORT, e.g. 127.0.0.1:8080"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := agoraWith(t, append(cleanEnv(), "AGORA_NATS_URL=nats://127.0.0.1:1"), tt.args...)
			if r.code == 0 || !strings.Contains(r.stderr, tt.want) {
				t.Errorf("want an error with %q: %s", tt.want, r)
			}
			if tt.want != "is another agora dev running?" && strings.Contains(r.stderr, "another") {
				t.Errorf("a malformed address blamed another process: %s", r)
			}
		})
	}
}

// --retention and AGORA_RETENTION take days; a bad one suggests the forms
// that work. (A bad --http stops dev right after the flags are read.)
func TestRetentionTakesDays(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"flag days", nil, []string{"--retention", "7d"}, "want HOST:PORT"},
		{"env days", []string{"AGORA_RETENTION=7d"}, nil, "want HOST:PORT"},
		{"flag bad unit", nil, []string{"--retention", "7x"}, "168h"},
		{"env bad unit", []string{"AGORA_RETENTION=7x"}, nil, "168h"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"dev", "--memory", "--nats-listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--http", "localhost:"}, tt.args...)
			r := agoraWith(t, append(cleanEnv(), tt.env...), args...)
			if r.code == 0 || !strings.Contains(r.stderr, tt.want) || strings.Contains(r.stderr, `unknown unit "d"`) {
				t.Errorf("want an error with %q: %s", tt.want, r)
			}
		})
	}
}

// An id given without its q- prefix is suggested with it.
func TestAnswerSuggestsQuestionPrefix(t *testing.T) {
	t.Parallel()
	r := agora(t, "answer", "bad-ans", "yes")
	if r.code != 1 || !strings.Contains(r.stderr, "did you mean q-bad-ans?") {
		t.Errorf("agora answer bad-ans: %s", r)
	}
	if r := agora(t, "answer", "q-bad-ans", "yes"); r.code != 1 || strings.Contains(r.stderr, "did you mean") {
		t.Errorf("agora answer q-bad-ans: %s", r)
	}
}

// A dispatch of an unknown sub-agent lists the registered ones.
func TestDispatchUnknownSubagentListsRegistered(t *testing.T) {
	t.Parallel()
	r := agora(t, "dispatch", "no-such-agent")
	if r.code != 1 || !strings.Contains(r.stderr, `no sub-agent named "no-such-agent"`) || !strings.Contains(r.stderr, "registered: ") || !strings.Contains(r.stderr, "demo") {
		t.Errorf("dispatch of an unknown sub-agent: %s", r)
	}
}

// A new definition's apply says it is the first version; the number is the
// bucket's revision that dispatches record, not a count.
func TestApplyNewDefinitionSaysFirstVersion(t *testing.T) {
	t.Parallel()
	mustAgora(t, "subagent", "apply", "-f", writeFile(t, "other.yaml", "name: first-other\nruntime: exec\ncommand: [\"true\"]\n"))
	r := mustAgora(t, "subagent", "apply", "-f", writeFile(t, "first.yaml", "name: first-version\nruntime: exec\ncommand: [\"true\"]\n"))
	if !strings.HasPrefix(r.stdout, "sub-agent first-version created: first version, subagent_revision ") {
		t.Errorf("apply of a new definition: %s", r)
	}
}

// agora artifacts get takes a thread id as list does: the artifact of the
// latest round that left it.
func TestArtifactsGetByThread(t *testing.T) {
	t.Parallel()
	mustAgora(t, "subagent", "apply", "-f", writeFile(t, "late-artist.yaml", `name: late-artist
runtime: exec
command: ["/bin/sh", "-c", "if [ \"$AGORA_ROUND\" = 0 ]; then exec \"$0\" needs-input --question 'go on?'; fi; printf late > \"$AGORA_ARTIFACTS_DIR/late.txt\"", "`+agoraBin+`"]
`))
	r := agora(t, "dispatch", "late-artist", "--round", "--json")
	if r.code != 4 {
		t.Fatalf("round 1: %s", r)
	}
	lines := jsonLines(t, r.stdout)
	data := lines[len(lines)-1]["data"].(map[string]any)
	qid, _ := data["question_id"].(string)
	thread, _ := data["thread_id"].(string)
	if qid == "" || thread == "" {
		t.Fatalf("needs_input without ids: %v", lines[len(lines)-1])
	}
	mustAgora(t, "answer", qid, "yes")
	deadline := time.Now().Add(60 * time.Second)
	for {
		g := agora(t, "artifacts", "get", thread, "late.txt")
		if g.code == 0 && g.stdout == "late" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("artifacts get THREAD late.txt: %s", g)
		}
		time.Sleep(300 * time.Millisecond)
	}
}
