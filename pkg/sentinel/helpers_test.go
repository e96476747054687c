package sentinel_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/pkg/sentinel"
)

// newWorkspace returns an empty workspace directory.
func newWorkspace(t *testing.T) string {
	t.Helper()
	return t.TempDir()
}

// writeRaw writes content as the sentinel file of a new workspace, creating
// .agora, and returns the workspace.
func writeRaw(t *testing.T, content []byte) string {
	t.Helper()
	ws := newWorkspace(t)
	mkAgora(t, ws)
	if err := os.WriteFile(sentinel.Path(ws), content, 0o600); err != nil {
		t.Fatal(err)
	}
	return ws
}

// mkAgora creates the .agora directory of ws.
func mkAgora(t *testing.T, ws string) {
	t.Helper()
	if err := os.Mkdir(filepath.Dir(sentinel.Path(ws)), 0o700); err != nil {
		t.Fatal(err)
	}
}

// resolve calls Resolve and fails the test on an error.
func resolve(t *testing.T, ws string) sentinel.Resolution {
	t.Helper()
	res, err := sentinel.Resolve(ws)
	if err != nil {
		t.Fatalf("Resolve: unexpected error %v", err)
	}
	return res
}

// wantMalformed checks that res is Malformed with a *MalformedError for
// field whose reason contains reason, and that nothing was parsed.
func wantMalformed(t *testing.T, res sentinel.Resolution, field, reason string) {
	t.Helper()
	if res.Status != sentinel.Malformed {
		t.Fatalf("Status = %v, want malformed (err %v)", res.Status, res.Err)
	}
	var me *sentinel.MalformedError
	if !errors.As(res.Err, &me) {
		t.Fatalf("Err = %T %v, want *MalformedError", res.Err, res.Err)
	}
	if me.Field != field {
		t.Errorf("Field = %q, want %q (err %v)", me.Field, field, me)
	}
	if !strings.Contains(me.Reason, reason) {
		t.Errorf("Reason = %q, want it to contain %q", me.Reason, reason)
	}
	if field != "" && !strings.Contains(me.Error(), field+": ") {
		t.Errorf("Error() = %q does not name the field %q", me.Error(), field)
	}
	if res.Request.Question != "" || res.Request.PartialState != nil {
		t.Errorf("Request = %+v, want zero", res.Request)
	}
}
