package sentinel_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/pkg/sentinel"
)

func TestPath(t *testing.T) {
	if got, want := sentinel.Path("/work/d-1"), filepath.FromSlash("/work/d-1/.agora/needs_input.json"); got != want {
		t.Errorf("Path = %q, want %q", got, want)
	}
}

func TestResolveAbsent(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, ws string)
	}{
		{"agora missing", func(t *testing.T, ws string) {}},
		{"file missing", func(t *testing.T, ws string) { mkAgora(t, ws) }},
		{"other files only", func(t *testing.T, ws string) {
			mkAgora(t, ws)
			if err := os.WriteFile(filepath.Join(ws, ".agora", "input.json"), []byte(`{}`), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := newWorkspace(t)
			tt.setup(t, ws)
			res := resolve(t, ws)
			if res.Status != sentinel.Absent || res.Err != nil || res.Size != 0 {
				t.Errorf("Resolution = %+v, want absent", res)
			}
		})
	}
}

func TestResolveWorkerErrors(t *testing.T) {
	t.Run("workspace missing", func(t *testing.T) {
		if _, err := sentinel.Resolve(filepath.Join(t.TempDir(), "nope")); err == nil {
			t.Error("Resolve of a missing workspace: want an error")
		}
	})
	t.Run("workspace is a file", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := sentinel.Resolve(f); err == nil {
			t.Error("Resolve of a file as workspace: want an error")
		}
	})
	t.Run("agora not searchable", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("permissions are not enforced for root")
		}
		ws := writeRaw(t, []byte(`{"question":"q"}`))
		dir := filepath.Dir(sentinel.Path(ws))
		if err := os.Chmod(dir, 0); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Chmod(dir, 0o700) })
		if _, err := sentinel.Resolve(ws); err == nil {
			t.Error("Resolve with EACCES on .agora: want an error")
		}
	})
}

func TestResolveUnreadableFileIsMalformed(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("permissions are not enforced for root")
	}
	ws := writeRaw(t, []byte(`{"question":"q"}`))
	if err := os.Chmod(sentinel.Path(ws), 0); err != nil {
		t.Fatal(err)
	}
	wantMalformed(t, resolve(t, ws), "", "permission denied")
}

// sizedSentinel returns a valid sentinel of exactly n bytes, padded inside
// partial_state.
func sizedSentinel(t *testing.T, n int) []byte {
	t.Helper()
	const head, tail = `{"question":"q","partial_state":"`, `"}`
	pad := n - len(head) - len(tail)
	if pad < 0 {
		t.Fatalf("size %d too small", n)
	}
	b := []byte(head + strings.Repeat("x", pad) + tail)
	if len(b) != n {
		t.Fatalf("built %d bytes, want %d", len(b), n)
	}
	return b
}

func TestResolveSizeLimit(t *testing.T) {
	t.Run("exactly MaxSize is valid", func(t *testing.T) {
		content := sizedSentinel(t, 1_048_576)
		res := resolve(t, writeRaw(t, content))
		if res.Status != sentinel.Valid || res.Err != nil {
			t.Fatalf("Status = %v, Err = %v; want valid", res.Status, res.Err)
		}
		if res.Size != 1_048_576 {
			t.Errorf("Size = %d, want 1048576", res.Size)
		}
		if want := len(content) - len(`{"question":"q","partial_state":}`); len(res.Request.PartialState) != want {
			t.Errorf("len(PartialState) = %d, want %d", len(res.Request.PartialState), want)
		}
	})
	t.Run("MaxSize+1 is oversized", func(t *testing.T) {
		res := resolve(t, writeRaw(t, sizedSentinel(t, 1_048_577)))
		if res.Status != sentinel.Oversized {
			t.Fatalf("Status = %v, want oversized", res.Status)
		}
		if res.Size != 1_048_577 {
			t.Errorf("Size = %d, want 1048577", res.Size)
		}
		var oe *sentinel.OversizedError
		if !errors.As(res.Err, &oe) {
			t.Fatalf("Err = %T %v, want *OversizedError", res.Err, res.Err)
		}
		if oe.Size != 1_048_577 || oe.Limit != sentinel.MaxSize {
			t.Errorf("OversizedError = %+v", oe)
		}
		if got, want := res.Err.Error(), "sentinel: oversized: 1048577 bytes, limit 1048576"; got != want {
			t.Errorf("Error() = %q, want %q", got, want)
		}
		if res.Request.Question != "" {
			t.Errorf("Request = %+v, want zero", res.Request)
		}
	})
	t.Run("far too large is oversized without reading", func(t *testing.T) {
		ws := newWorkspace(t)
		mkAgora(t, ws)
		f, err := os.Create(sentinel.Path(ws))
		if err != nil {
			t.Fatal(err)
		}
		// A sparse 1 GiB file: reading it all would be slow.
		if err := f.Truncate(1 << 30); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		res := resolve(t, ws)
		if res.Status != sentinel.Oversized || res.Size != 1<<30 {
			t.Errorf("Resolution = %v size %d, want oversized size %d", res.Status, res.Size, 1<<30)
		}
	})
}

func TestResolveRefusesNonRegular(t *testing.T) {
	const valid = `{"question":"followed"}`
	tests := []struct {
		name   string
		setup  func(t *testing.T, ws string)
		reason string
	}{
		{"directory", func(t *testing.T, ws string) {
			mkAgora(t, ws)
			if err := os.Mkdir(sentinel.Path(ws), 0o700); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file (directory)"},
		{"symlink to a valid file", func(t *testing.T, ws string) {
			mkAgora(t, ws)
			target := filepath.Join(t.TempDir(), "real.json")
			if err := os.WriteFile(target, []byte(valid), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, sentinel.Path(ws)); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file (symlink)"},
		{"relative symlink inside .agora", func(t *testing.T, ws string) {
			mkAgora(t, ws)
			if err := os.WriteFile(filepath.Join(ws, ".agora", "real.json"), []byte(valid), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("real.json", sentinel.Path(ws)); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file (symlink)"},
		{"dangling symlink", func(t *testing.T, ws string) {
			mkAgora(t, ws)
			if err := os.Symlink(filepath.Join(ws, "nowhere.json"), sentinel.Path(ws)); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file (symlink)"},
		{"symlinked .agora", func(t *testing.T, ws string) {
			elsewhere := t.TempDir()
			if err := os.WriteFile(filepath.Join(elsewhere, "needs_input.json"), []byte(valid), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(elsewhere, filepath.Join(ws, ".agora")); err != nil {
				t.Fatal(err)
			}
		}, ".agora is not a directory (symlink)"},
		{"symlinked .agora inside workspace", func(t *testing.T, ws string) {
			if err := os.Mkdir(filepath.Join(ws, "real"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(ws, "real", "needs_input.json"), []byte(valid), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("real", filepath.Join(ws, ".agora")); err != nil {
				t.Fatal(err)
			}
		}, ".agora is not a directory (symlink)"},
		{".agora is a file", func(t *testing.T, ws string) {
			if err := os.WriteFile(filepath.Join(ws, ".agora"), []byte(valid), 0o600); err != nil {
				t.Fatal(err)
			}
		}, ".agora is not a directory (regular file)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := newWorkspace(t)
			tt.setup(t, ws)
			res := resolve(t, ws)
			wantMalformed(t, res, "", tt.reason)
			if res.Size != 0 {
				t.Errorf("Size = %d, want 0: nothing should have been read", res.Size)
			}
		})
	}
}
