package client_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// bigInput is a JSON object of about n bytes.
func bigInput(n int) json.RawMessage {
	return json.RawMessage(`{"data":"` + strings.Repeat("x", n) + `"}`)
}

// A request over a size limit is not sent: Dispatch says which limits and
// how to pass large data, never "retry", and no dispatch exists.
func TestDispatchTooLarge(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name  string
		input json.RawMessage
	}{
		{"input over its limit", bigInput(lifecycle.MaxInputBytes + 1)},
		{"over the max payload", bigInput(1 << 20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "big-" + strconv.Itoa(len(tc.input))
			_, err := e.c.Dispatch(t.Context(), lifecycle.Request{DispatchID: id, Subagent: "planner", Input: tc.input})
			var tl *client.TooLargeError
			if !errors.As(err, &tl) || !errors.Is(err, client.ErrInvalidRequest) {
				t.Fatalf("err = %v, want a *TooLargeError", err)
			}
			msg := err.Error()
			for _, want := range []string{strconv.Itoa(lifecycle.MaxInputBytes), strconv.Itoa(tl.RequestLimit), "by reference", "read_paths"} {
				if !strings.Contains(msg, want) {
					t.Errorf("the error does not say %q: %s", want, msg)
				}
			}
			if strings.Contains(strings.ToLower(msg), "retry") {
				t.Errorf("the error advises a retry: %s", msg)
			}
			if _, err := e.c.Status(t.Context(), id); !errors.Is(err, client.ErrNotFound) {
				t.Errorf("status of %s: %v, want not found", id, err)
			}
		})
	}
}
