package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/agora-dispatch/agora/pkg/kvsnap"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Runtimes lists the runtimes a definition may name, sorted: the ones
// every worker offers (subagent.BuiltinRuntimes) and those a worker has
// announced.
func (c *Client) Runtimes(ctx context.Context) ([]string, error) {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	names := slices.Clone(subagent.BuiltinRuntimes)
	es, err := kvsnap.Read(ctx, c.js, lifecycle.BucketRuntimes, ">")
	switch {
	case errors.Is(err, kvsnap.ErrNoStream):
		// Provisioned before workers announced their runtimes.
	case err != nil:
		return nil, fmt.Errorf("client: list runtimes: %w", err)
	}
	for _, e := range es {
		var a lifecycle.RuntimeAnnouncement
		if json.Unmarshal(e.Value, &a) == nil && subagent.ValidRuntime(e.Key) && !slices.Contains(names, e.Key) {
			names = append(names, e.Key)
		}
	}
	slices.Sort(names)
	return names, nil
}

// checkRuntime refuses a definition's runtime that no worker offers,
// naming the ones offered.
func (c *Client) checkRuntime(ctx context.Context, name string) error {
	if !subagent.ValidRuntime(name) || slices.Contains(subagent.BuiltinRuntimes, name) {
		return nil // Validate names a malformed one
	}
	offered, err := c.Runtimes(ctx)
	if err != nil {
		return err
	}
	if slices.Contains(offered, name) {
		return nil
	}
	if near := subagent.Closest(name, offered); near != "" {
		return fmt.Errorf("runtime: %q is offered by no worker; did you mean %s? (the workers offer %s)", name, near, strings.Join(offered, ", "))
	}
	return fmt.Errorf("runtime: %q is offered by no worker; the workers offer %s (a worker announces each runtime it runs when it starts: start one built with %q, docs/subagents.md \"Writing a runtime\")", name, strings.Join(offered, ", "), name)
}
