package svc

import (
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/micro"
)

// Pool runs a service's handlers, at most n at once, and waits for them.
type Pool struct {
	sem chan struct{}
	wg  sync.WaitGroup
}

// NewPool returns a pool of n slots.
func NewPool(n int) *Pool { return &Pool{sem: make(chan struct{}, n)} }

// Size is the pool's number of slots.
func (p *Pool) Size() int { return cap(p.sem) }

// Go runs f on a goroutine once a slot is free; it blocks the caller until
// then, which pushes back on the subscription that feeds it.
func (p *Pool) Go(f func()) {
	p.sem <- struct{}{}
	p.wg.Go(func() {
		defer func() { <-p.sem }()
		f()
	})
}

// Do runs f on the caller's goroutine once a slot is free and returns when
// f has: a micro lane (AddLanes) handles its request where micro times it.
func (p *Pool) Do(f func()) {
	p.sem <- struct{}{}
	p.wg.Add(1)
	defer func() {
		<-p.sem
		p.wg.Done()
	}()
	f()
}

// Wait returns once every handler started by Go or Do has returned.
func (p *Pool) Wait() { p.wg.Wait() }

// MaxMicroLanes bounds the lanes of one micro endpoint: every lane is a
// subscription and a row of $SRV.INFO and $SRV.STATS, whose replies must
// stay within a message.
const MaxMicroLanes = 64

// AddLanes serves one micro endpoint, name on subject, by lanes: endpoints
// in the group's queue group, each running h through p.Do to the end
// before it returns. micro times a request from the handler's call to its
// return and counts an error answered with Request.Error, and NATS
// delivers one subscription's messages one at a time, so lanes keep both
// the stats true and requests handled side by side, sharing p's bound
// (docs/dispatcher.md, "The micro service"). There are min(p.Size(),
// MaxMicroLanes) of them; meta is added to each lane's metadata.
func AddLanes(g micro.Group, p *Pool, name, subject string, meta map[string]string, h func(micro.Request)) error {
	handler := micro.HandlerFunc(func(r micro.Request) { p.Do(func() { h(r) }) })
	lanes := min(p.Size(), MaxMicroLanes)
	for lane := 1; lane <= lanes; lane++ {
		md := map[string]string{"lane": fmt.Sprintf("%d/%d", lane, lanes)}
		for k, v := range meta {
			md[k] = v
		}
		if err := g.AddEndpoint(fmt.Sprintf("%s-%d", name, lane), handler, micro.WithEndpointSubject(subject), micro.WithEndpointMetadata(md)); err != nil {
			return fmt.Errorf("micro endpoint %s lane %d: %w", name, lane, err)
		}
	}
	return nil
}
