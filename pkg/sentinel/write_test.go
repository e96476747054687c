package sentinel_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/pkg/sentinel"
)

func TestWriteModes(t *testing.T) {
	ws := newWorkspace(t)
	if err := sentinel.Write(ws, sentinel.Request{Question: "q"}); err != nil {
		t.Fatal(err)
	}
	dir, err := os.Lstat(filepath.Join(ws, ".agora"))
	if err != nil {
		t.Fatal(err)
	}
	if !dir.IsDir() || dir.Mode().Perm() != 0o700 {
		t.Errorf(".agora mode = %v, want a directory with 0700", dir.Mode())
	}
	file, err := os.Lstat(sentinel.Path(ws))
	if err != nil {
		t.Fatal(err)
	}
	if !file.Mode().IsRegular() || file.Mode().Perm() != 0o600 {
		t.Errorf("sentinel mode = %v, want a regular file with 0600", file.Mode())
	}
	entries, err := os.ReadDir(filepath.Join(ws, ".agora"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf(".agora holds %d entries, want only the sentinel (no temporary files left)", len(entries))
	}
}

func TestWriteRejectsInvalid(t *testing.T) {
	tests := []struct {
		name  string
		req   sentinel.Request
		field string
	}{
		{"question empty", sentinel.Request{}, "question"},
		{"question blank", sentinel.Request{Question: "  "}, "question"},
		{"option empty", sentinel.Request{Question: "q", Options: []string{"A", ""}}, "options[1]"},
		{"kind invalid", sentinel.Request{Question: "q", Kind: "maybe"}, "kind"},
		{"partial state invalid", sentinel.Request{Question: "q", PartialState: json.RawMessage(`{`)}, "partial_state"},
		{"question invalid UTF-8", sentinel.Request{Question: "\xff"}, "question"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := newWorkspace(t)
			err := sentinel.Write(ws, tt.req)
			var me *sentinel.MalformedError
			if !errors.As(err, &me) {
				t.Fatalf("Write error = %T %v, want *MalformedError", err, err)
			}
			if me.Field != tt.field || !strings.Contains(err.Error(), tt.field+": ") {
				t.Errorf("error = %q (Field %q), want it to name %q", err, me.Field, tt.field)
			}
			if _, err := os.Lstat(filepath.Join(ws, ".agora")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("Write created .agora for an invalid request (lstat: %v)", err)
			}
		})
	}
}

func TestWriteRejectsOversized(t *testing.T) {
	ws := newWorkspace(t)
	err := sentinel.Write(ws, sentinel.Request{Question: strings.Repeat("q", sentinel.MaxSize)})
	var oe *sentinel.OversizedError
	if !errors.As(err, &oe) {
		t.Fatalf("Write error = %T %v, want *OversizedError", err, err)
	}
	if oe.Size <= sentinel.MaxSize || oe.Limit != sentinel.MaxSize {
		t.Errorf("OversizedError = %+v", oe)
	}
	if _, err := os.Lstat(sentinel.Path(ws)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Write left a file behind (lstat: %v)", err)
	}
}

func TestWriteRefusesSymlinkedAgora(t *testing.T) {
	ws := newWorkspace(t)
	elsewhere := t.TempDir()
	if err := os.Symlink(elsewhere, filepath.Join(ws, ".agora")); err != nil {
		t.Fatal(err)
	}
	if err := sentinel.Write(ws, sentinel.Request{Question: "q"}); err == nil {
		t.Fatal("Write through a symlinked .agora: want an error")
	}
	entries, err := os.ReadDir(elsewhere)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("Write followed the symlink and wrote %d entries", len(entries))
	}
}

func TestWriteMissingWorkspace(t *testing.T) {
	if err := sentinel.Write(filepath.Join(t.TempDir(), "nope"), sentinel.Request{Question: "q"}); err == nil {
		t.Error("Write into a missing workspace: want an error")
	}
}

func TestWriteResolveRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		in   sentinel.Request
		want sentinel.Request
	}{
		{"minimal",
			sentinel.Request{Question: "q"},
			sentinel.Request{Question: "q"}},
		{"all fields",
			sentinel.Request{
				Question: "Rewrite <A> or B & C?", Options: []string{"A", "B & C"},
				Context: "line 1\nline 2 \u2028 é", Kind: sentinel.KindApproval,
				PartialState: json.RawMessage(`{ "n": 1e400, "big": 123456789012345678901234567890, "html": "<b>" }`),
				DedupeKey:    "deploy <prod> & é", Reuse: new(bool),
			},
			sentinel.Request{
				Question: "Rewrite <A> or B & C?", Options: []string{"A", "B & C"},
				Context: "line 1\nline 2 \u2028 é", Kind: sentinel.KindApproval,
				PartialState: json.RawMessage(`{ "n": 1e400, "big": 123456789012345678901234567890, "html": "<b>" }`),
				DedupeKey:    "deploy <prod> & é", Reuse: new(bool),
			}},
		{"empty options become nil",
			sentinel.Request{Question: "q", Options: []string{}},
			sentinel.Request{Question: "q"}},
		{"null partial state is omitted",
			sentinel.Request{Question: "q", PartialState: json.RawMessage(" null ")},
			sentinel.Request{Question: "q"}},
		{"whitespace around partial state is dropped",
			sentinel.Request{Question: "q", PartialState: json.RawMessage("\n [ 1 ,2 ] \t")},
			sentinel.Request{Question: "q", PartialState: json.RawMessage("[ 1 ,2 ]")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := newWorkspace(t)
			if err := sentinel.Write(ws, tt.in); err != nil {
				t.Fatal(err)
			}
			res := resolve(t, ws)
			if res.Status != sentinel.Valid {
				t.Fatalf("Status = %v, Err = %v; want valid", res.Status, res.Err)
			}
			if !reflect.DeepEqual(res.Request, tt.want) {
				t.Errorf("Request = %#v\nwant      %#v", res.Request, tt.want)
			}
		})
	}
}

func TestWriteReplacesExisting(t *testing.T) {
	ws := newWorkspace(t)
	for _, q := range []string{"first", "second"} {
		if err := sentinel.Write(ws, sentinel.Request{Question: q}); err != nil {
			t.Fatal(err)
		}
	}
	if got := resolve(t, ws).Request.Question; got != "second" {
		t.Errorf("Question = %q, want %q", got, "second")
	}
}

func TestWriteMaxSizeFile(t *testing.T) {
	// A request whose encoding is exactly MaxSize bytes is written and read
	// back; one byte more is refused.
	empty := len(`{"question":"q","partial_state":""}` + "\n")
	state := func(n int) json.RawMessage { return json.RawMessage(`"` + strings.Repeat("x", n) + `"`) }

	ws := newWorkspace(t)
	if err := sentinel.Write(ws, sentinel.Request{Question: "q", PartialState: state(sentinel.MaxSize - empty)}); err != nil {
		t.Fatalf("Write of exactly MaxSize bytes: %v", err)
	}
	res := resolve(t, ws)
	if res.Status != sentinel.Valid || res.Size != sentinel.MaxSize {
		t.Errorf("Resolution = %v size %d, want valid size %d", res.Status, res.Size, sentinel.MaxSize)
	}
	var oe *sentinel.OversizedError
	if err := sentinel.Write(ws, sentinel.Request{Question: "q", PartialState: state(sentinel.MaxSize - empty + 1)}); !errors.As(err, &oe) {
		t.Errorf("Write of MaxSize+1 bytes: error = %v, want *OversizedError", err)
	} else if oe.Size != sentinel.MaxSize+1 {
		t.Errorf("OversizedError.Size = %d, want %d", oe.Size, sentinel.MaxSize+1)
	}
}
