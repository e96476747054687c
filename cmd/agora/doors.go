package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agora-dispatch/agora/pkg/client"
)

// checkListenAddr reports a listen address that is not HOST:PORT, naming
// the flag: net.Listen would take "localhost:" as a random port.
func checkListenAddr(flag, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		if n, perr := strconv.Atoi(port); perr != nil || n < 0 || n > 65535 {
			err = fmt.Errorf("bad port %q", port)
		}
	}
	if err != nil {
		return fmt.Errorf("%s %q: %v — want HOST:PORT, e.g. 127.0.0.1:8080", flag, addr, unwrapAddrErr(err))
	}
	return nil
}

func unwrapAddrErr(err error) string {
	var ae *net.AddrError
	if errors.As(err, &ae) {
		return ae.Err
	}
	return err.Error()
}

// listenError words a failure to listen on addr (given with flag): only an
// address in use suggests that another process holds it.
func listenError(flag, addr, holder string, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s %s: the address is in use (is another %s running?)", flag, addr, holder)
	}
	if cerr := checkListenAddr(flag, addr); cerr != nil {
		return cerr
	}
	return fmt.Errorf("%s %s: %w", flag, addr, err)
}

// parseRetention parses a retention as a Go duration or a whole number of
// days ("7d").
func parseRetention(s string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(d); err == nil && n > 0 && n < 1<<20 {
			return time.Duration(n) * 24 * time.Hour, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q: want a duration such as 168h, 30m or 7d", s)
	}
	return d, nil
}

// retentionFlag is a duration flag that also takes days (7d).
type retentionFlag struct{ d *time.Duration }

func (f retentionFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f retentionFlag) Set(s string) error {
	d, err := parseRetention(s)
	if err != nil {
		return err
	}
	*f.d = d
	return nil
}

func (retentionFlag) Type() string { return "duration" }

// registeredSubagents lists the names in the sub-agent bucket, sorted, as
// `agora subagent list` reads them; nil when they cannot be read.
func registeredSubagents(ctx context.Context, g *globals) []string {
	c, ctx, done, err := g.call(ctx, io.Discard)
	if err != nil {
		return nil
	}
	defer done()
	all, err := c.Subagents(ctx)
	var ue *client.UndecodableError
	if err != nil && !errors.As(err, &ue) {
		return nil
	}
	var names []string
	for _, sa := range all {
		names = append(names, sa.Name)
	}
	return names
}

// suggestQuestionID is a hint for a question id given without its q-
// prefix ("" when it has one).
func suggestQuestionID(qid string) string {
	if strings.HasPrefix(qid, "q-") {
		return ""
	}
	return " (question ids start with q-: did you mean q-" + qid + "?)"
}
