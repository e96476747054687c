package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/kvwatch"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Sub-agent definitions (docs/dispatcher.md, "Definitions"). The
// dispatcher keeps a copy of agora_subagents, kept current by a KV watch,
// so accepting a request reads no definition over the network. A name the
// copy lacks is read from the bucket (a sub-agent registered a moment ago
// is never refused), and so is a definition about to refuse a request's
// env, so a refusal always reflects the stored revision. While no watch
// runs (before Run, while it is being started again, or after Run) every
// lookup reads the bucket.

// definition is one entry of the copy.
type definition struct {
	def subagent.Definition
	rev uint64
	err error // the stored value cannot be decoded
	// gone marks a deletion at rev, so a read of an older revision that
	// finishes after it does not bring the definition back.
	gone bool
}

// defs is the watched copy of agora_subagents.
type defs struct {
	mu   sync.RWMutex
	live bool // a watch keeps m current
	m    map[string]definition
}

func (d *defs) get(name string) (definition, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if !d.live {
		return definition{}, false
	}
	e, ok := d.m[name]
	return e, ok && !e.gone
}

// set stores an entry unless the copy already holds a later revision.
func (d *defs) set(name string, e definition) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.live {
		return
	}
	if old, ok := d.m[name]; ok && old.rev > e.rev {
		return
	}
	d.m[name] = e
}

func (d *defs) remove(name string, rev uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.live {
		return
	}
	if old, ok := d.m[name]; !ok || old.rev < rev {
		d.m[name] = definition{rev: rev, gone: true}
	}
}

func (d *defs) setLive(live bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.live, d.m = live, map[string]definition{}
}

func decodeDefinition(e jetstream.KeyValueEntry) definition {
	var def subagent.Definition
	if err := json.Unmarshal(e.Value(), &def); err != nil {
		return definition{rev: e.Revision(), err: err}
	}
	return definition{def: def, rev: e.Revision()}
}

// keepDefinitions keeps s.defs current until ctx ends. The watch starts
// again when it cannot start or ends (after defsRetry), and at once after a
// reconnect to NATS; from a disconnect until the new watch has read the
// stored definitions the copy is dropped, so nothing changed meanwhile is
// missed. The first attempt's error, or nil once the stored definitions
// are in the copy, is sent on started.
func (s *Service) keepDefinitions(ctx context.Context, b *bindings, started chan<- error) {
	status := s.nc.StatusChanged(nats.DISCONNECTED, nats.CONNECTED)
	defer s.nc.RemoveStatusListener(status)
	for first := true; ; first = false {
		wctx, stop := context.WithCancel(ctx)
		stopped, err := s.watchDefinitions(wctx, b)
		switch {
		case first:
			started <- err
		case err != nil:
			s.log.Debug("watch of the sub-agent definitions: not started yet", "err", err)
		}
		reconnected := false
		if err == nil {
			select {
			case <-ctx.Done():
			case <-stopped: // ended by itself
				s.log.Warn("watch of the sub-agent definitions ended: definitions are read from the bucket per request until it starts again")
			case st := <-status:
				stop()
				<-stopped // the copy is dropped
				for st != nats.CONNECTED && ctx.Err() == nil {
					select {
					case <-ctx.Done():
					case st = <-status:
					}
				}
				reconnected = true
			}
		}
		stop()
		if ctx.Err() != nil {
			return
		}
		if reconnected {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(defsRetry):
		}
	}
}

// defsRetry is how long the dispatcher waits before starting a failed or
// ended watch of the definitions again.
const defsRetry = time.Second

// watchDefinitions watches agora_subagents into s.defs until ctx ends or
// the watch does (stopped is closed then, and the copy dropped: every
// lookup reads the bucket). It returns once the stored definitions are in
// the copy.
func (s *Service) watchDefinitions(ctx context.Context, b *bindings) (stopped <-chan struct{}, err error) {
	s.defs.setLive(true)
	done, err := kvwatch.Start(ctx, b.subagents, func(e jetstream.KeyValueEntry) {
		if e.Operation() == jetstream.KeyValuePut {
			s.defs.set(e.Key(), decodeDefinition(e))
		} else {
			s.defs.remove(e.Key(), e.Revision())
		}
	})
	if err != nil {
		s.defs.setLive(false)
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	dropped := make(chan struct{})
	go func() {
		<-done
		s.defs.setLive(false)
		close(dropped)
	}()
	return dropped, nil
}

// lookup returns a sub-agent's definition and its revision:
// jetstream.ErrKeyNotFound when none is registered. fresh reads the bucket
// whatever the copy holds.
func (s *Service) lookup(ctx context.Context, b *bindings, name string, fresh bool) (definition, error) {
	if !fresh {
		if e, ok := s.defs.get(name); ok {
			return e, nil
		}
	}
	e, err := b.subagents.Get(ctx, name)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return definition{}, err
		}
		return definition{}, fmt.Errorf("dispatcher: read sub-agent %q: %w", name, err)
	}
	d := decodeDefinition(e)
	s.defs.set(name, d)
	return d, nil
}
