package worker

import (
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// cancels routes agora.control.cancel.<id> messages from the worker's one
// wildcard subscription to the run of that dispatch, if it runs here.
type cancels struct {
	mu   sync.Mutex
	runs map[string]chan *nats.Msg
}

func (c *cancels) register(id string) chan *nats.Msg {
	ch := make(chan *nats.Msg, 1)
	c.mu.Lock()
	if c.runs == nil {
		c.runs = map[string]chan *nats.Msg{}
	}
	c.runs[id] = ch
	c.mu.Unlock()
	return ch
}

func (c *cancels) unregister(id string) {
	c.mu.Lock()
	delete(c.runs, id)
	c.mu.Unlock()
}

func (c *cancels) deliver(m *nats.Msg) {
	id, err := lifecycle.ParseCancelSubject(m.Subject)
	if err != nil {
		return
	}
	c.mu.Lock()
	ch := c.runs[id]
	c.mu.Unlock()
	if ch != nil {
		select {
		case ch <- m:
		default: // a cancel is already pending for this run
		}
	}
}

// defCache keeps definitions by name and revision; a revision never
// changes, so entries never go stale.
type defCache struct {
	mu sync.Mutex
	m  map[defKey]subagent.Definition
}

type defKey struct {
	name string
	rev  uint64
}

func (c *defCache) get(name string, rev uint64) (subagent.Definition, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.m[defKey{name, rev}]
	return d, ok
}

func (c *defCache) put(name string, rev uint64, d subagent.Definition) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) > 1024 {
		c.m = map[defKey]subagent.Definition{}
	}
	c.m[defKey{name, rev}] = d
}
