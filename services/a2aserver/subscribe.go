package a2aserver

import (
	"context"
	"errors"
	"fmt"
	"iter"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
)

// handler is a2a-go's request handler, with SubscribeToTask served from
// Agora's records when no execution of this process follows the task
// (after a restart of the door, or for a task another process started or
// an answer through another door resumed).
type handler struct {
	a2asrv.RequestHandler
	s *Service
}

// SubscribeToTask implements a2asrv.RequestHandler.
func (h handler) SubscribeToTask(ctx context.Context, req *a2a.SubscribeToTaskRequest) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		first := true
		for ev, err := range h.RequestHandler.SubscribeToTask(ctx, req) {
			if first && errors.Is(err, a2a.ErrTaskNotFound) && req != nil {
				h.s.subscribe(ctx, req.ID, yield)
				return
			}
			first = false
			if !yield(ev, err) {
				return
			}
		}
	}
}

// subscribe streams task id from its thread: the task as its records
// show it, then, while it runs, its events from the lifecycle stream
// until it asks or ends. A task that has ended is UnsupportedOperation,
// as the protocol asks; one waiting for input is streamed as it is.
func (s *Service) subscribe(ctx context.Context, id a2a.TaskID, yield func(a2a.Event, error) bool) {
	who := principalOf(ctx)
	if who == nil {
		yield(nil, a2a.ErrUnauthenticated)
		return
	}
	th, err := s.thread(ctx, who, string(id))
	if err != nil {
		yield(nil, err)
		return
	}
	task, err := s.taskOf(ctx, th)
	if err != nil {
		yield(nil, err)
		return
	}
	if task.Status.State.Terminal() {
		yield(nil, a2a.NewError(a2a.ErrUnsupportedOperation, fmt.Sprintf("task %s has ended (%s): read it with GetTask", id, task.Status.State)))
		return
	}
	if !yield(task, nil) || task.Status.State == a2a.TaskStateInputRequired {
		return
	}
	ctx, stop := s.bound(ctx)
	defer stop()
	ec := &a2asrv.ExecutorContext{TaskID: task.ID, ContextID: task.ContextID}
	(&executor{s: s}).follow(ctx, ec, th.Latest().Round, yield)
}
