package hook_test

import (
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/hook"
)

// A delivery's settings out of range are refused, each error naming its
// setting; settings in range give none.
func TestCheckDelivery(t *testing.T) {
	for _, c := range []struct {
		attempts         int
		backoff, timeout time.Duration
		want             []string
	}{
		{attempts: 5, backoff: time.Second, timeout: 10 * time.Second},
		{attempts: 1, backoff: 10 * time.Millisecond, timeout: 100 * time.Millisecond},
		{attempts: 0, backoff: time.Second, timeout: time.Second, want: []string{"A=0: want 1 to 100"}},
		{attempts: 101, backoff: time.Second, timeout: time.Second, want: []string{"A=101: want 1 to 100"}},
		{attempts: 3, backoff: time.Millisecond, timeout: 50 * time.Millisecond, want: []string{"B=1ms: want at least 10ms", "T=50ms: want at least 100ms"}},
	} {
		errs := hook.CheckDelivery(c.attempts, c.backoff, c.timeout, "A", "B", "T")
		var got []string
		for _, err := range errs {
			got = append(got, err.Error())
		}
		if strings.Join(got, "|") != strings.Join(c.want, "|") {
			t.Errorf("CheckDelivery(%d, %s, %s) = %q, want %q", c.attempts, c.backoff, c.timeout, got, c.want)
		}
	}
}
