package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/kvsnap"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Subagent is a registered sub-agent definition (the agora_subagents
// bucket, docs/subagents.md, "Definition rules").
type Subagent struct {
	Name string `json:"name"`
	// Revision is the bucket's sequence at the definition's last write:
	// what a dispatch of it records as subagent_revision. It is shared by
	// every definition, so a first version's revision is seldom 1.
	Revision   uint64              `json:"revision"`
	UpdatedAt  time.Time           `json:"updated_at"`
	Definition subagent.Definition `json:"definition"`
}

// What ApplySubagent did (Applied.Result).
const (
	AppliedCreated   = "created"
	AppliedUpdated   = "updated"
	AppliedUnchanged = "unchanged"
)

// Applied is what ApplySubagent stored: the definition as it now stands
// and whether it was created, updated or already so.
type Applied struct {
	Subagent
	Result string `json:"result"`
}

// ErrSubagentChanged: the definition was written by someone else between
// ApplySubagent's read and its write; nothing was stored. Apply again.
var ErrSubagentChanged = errors.New("client: the sub-agent was changed by someone else meanwhile; apply again")

// UndecodableError names stored definitions that do not decode (written to
// the bucket by hand). Subagents returns it with the ones that do.
type UndecodableError struct {
	Names []string
}

func (e *UndecodableError) Error() string {
	return "client: stored sub-agent definitions that do not decode: " + strings.Join(e.Names, ", ")
}

func (c *Client) subagents(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := c.js.KeyValue(ctx, lifecycle.BucketSubagents)
	if err != nil {
		return nil, fmt.Errorf("client: bucket %s: %w", lifecycle.BucketSubagents, err)
	}
	return kv, nil
}

// Subagents lists every registered definition, sorted by name. A stored
// value that does not decode is left out and named by an
// *UndecodableError returned with the rest.
func (c *Client) Subagents(ctx context.Context) ([]Subagent, error) {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	// Every definition stored before the call (pkg/kvsnap: a listing
	// from a watch can leave out one being replaced). A missing bucket is
	// named by kvsnap's error.
	es, err := kvsnap.Read(ctx, c.js, lifecycle.BucketSubagents, ">")
	if err != nil {
		return nil, fmt.Errorf("client: list sub-agents: %w", err)
	}
	var out []Subagent
	var bad []string
	for _, e := range es {
		var d subagent.Definition
		if err := json.Unmarshal(e.Value, &d); err != nil {
			bad = append(bad, e.Key)
			continue
		}
		out = append(out, Subagent{Name: e.Key, Revision: e.Revision, UpdatedAt: e.Created, Definition: d})
	}
	slices.SortFunc(out, func(a, b Subagent) int { return strings.Compare(a.Name, b.Name) })
	if len(bad) > 0 {
		slices.Sort(bad)
		return out, &UndecodableError{Names: bad}
	}
	return out, nil
}

// Subagent returns the definition registered as name; ErrNotFound when
// there is none.
func (c *Client) Subagent(ctx context.Context, name string) (Subagent, error) {
	if !subagent.ValidName(name) {
		return Subagent{}, fmt.Errorf("client: %q is not a sub-agent name: 1-64 letters, digits, '-' or '_'", name)
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	kv, err := c.subagents(ctx)
	if err != nil {
		return Subagent{}, err
	}
	e, err := kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Subagent{}, fmt.Errorf("%w: no sub-agent %s", ErrNotFound, name)
	}
	if err != nil {
		return Subagent{}, fmt.Errorf("client: sub-agent %s: %w", name, err)
	}
	s, err := decodeSubagent(e)
	if err != nil {
		return Subagent{}, fmt.Errorf("client: sub-agent %s: the stored definition does not decode: %w", name, err)
	}
	return s, nil
}

// ApplySubagent registers d, or updates the definition of its name, after
// checking it (subagent.Definition.Validate) and that a worker offers its
// runtime (Runtimes). An identical stored
// definition is left alone, so revisions change only with the definition.
// A write that raced another is refused with ErrSubagentChanged. The
// operator's sandbox floor is not checked here: dispatchers and workers
// enforce their own (docs/sandbox.md, "The operator's floor").
func (c *Client) ApplySubagent(ctx context.Context, d subagent.Definition) (Applied, error) {
	if err := errors.Join(d.Validate(), c.checkRuntime(ctx, d.Runtime)); err != nil {
		return Applied{}, fmt.Errorf("client: sub-agent %s: %w", d.Name, err)
	}
	b, err := json.Marshal(d)
	if err != nil {
		return Applied{}, fmt.Errorf("client: sub-agent %s: %w", d.Name, err)
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	kv, err := c.subagents(ctx)
	if err != nil {
		return Applied{}, err
	}
	res := Applied{Subagent: Subagent{Name: d.Name, Definition: d}}
	cur, err := kv.Get(ctx, d.Name)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		res.Revision, err = kv.Create(ctx, d.Name, b)
		res.Result = AppliedCreated
	case err != nil:
		return res, fmt.Errorf("client: sub-agent %s: %w", d.Name, err)
	case bytes.Equal(cur.Value(), b):
		res.Revision, res.UpdatedAt, res.Result = cur.Revision(), cur.Created(), AppliedUnchanged
		return res, nil
	default:
		res.Revision, err = kv.Update(ctx, d.Name, b, cur.Revision())
		res.Result = AppliedUpdated
	}
	var apiErr *jetstream.APIError
	if errors.Is(err, jetstream.ErrKeyExists) || errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return res, ErrSubagentChanged
	}
	if err != nil {
		return res, fmt.Errorf("client: sub-agent %s: %w", d.Name, err)
	}
	res.UpdatedAt = time.Now().UTC()
	return res, nil
}

func decodeSubagent(e jetstream.KeyValueEntry) (Subagent, error) {
	var d subagent.Definition
	if err := json.Unmarshal(e.Value(), &d); err != nil {
		return Subagent{}, err
	}
	return Subagent{Name: e.Key(), Revision: e.Revision(), UpdatedAt: e.Created(), Definition: d}, nil
}

// withTimeout bounds ctx by the client's timeout when it has no deadline.
func (c *Client) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.timeout)
}
