package a2aserver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv/taskstore"

	"github.com/agora-dispatch/agora/internal/principal"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// store is a2a-go's task store, backed by Agora's thread state: a task is
// read from its thread's records (pkg/client's Thread and Question), so
// it survives a restart and follows answers given through other doors.
// What a2a-go writes (the history of messages, and states the executor
// saw on the lifecycle stream before the dispatcher's records show them)
// is kept in memory for keepFor after its last change; a read takes
// whichever of the two is further along (rank). Its methods are safe for
// concurrent use.
type store struct {
	s     *Service
	mu    sync.Mutex
	tasks map[a2a.TaskID]*kept
	swept time.Time // the last sweep of tasks past keepFor
	// held are tasks just answered, read as they were before the answer
	// until a2a-go writes to them (hold).
	held map[a2a.TaskID]heldTask
}

// heldTask is a task as it was before its answer, until a time.
type heldTask struct {
	task  *a2a.Task
	until time.Time
}

// holdFor bounds how long a task is held: past it, a2a-go has long
// started following the task again, or given up.
const holdFor = 30 * time.Second

// kept is what a2a-go last wrote of a task, and when.
type kept struct {
	task    *a2a.Task
	version taskstore.TaskVersion
	at      time.Time
}

// keepFor is how long what a2a-go wrote of a task is kept after its last
// change: long past the moment the dispatcher's records show as much.
const keepFor = 10 * time.Minute

var _ taskstore.Store = (*store)(nil)

func newStore(s *Service) *store {
	return &store{s: s, tasks: map[a2a.TaskID]*kept{}, held: map[a2a.TaskID]heldTask{}}
}

// hold makes task (as it was before the answer just given) the task's
// state until a2a-go next writes to it: a thread that runs its next round
// to its end before a2a-go loads the task would otherwise have a2a-go
// refuse the message that answered it, as one on an ended task.
func (st *store) hold(task *a2a.Task) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.held[task.ID] = heldTask{task: task, until: time.Now().Add(holdFor)}
}

// Create implements taskstore.Store; the thread exists already (the
// executor dispatched it).
func (st *store) Create(_ context.Context, task *a2a.Task) (taskstore.TaskVersion, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, ok := st.tasks[task.ID]; ok {
		return 0, taskstore.ErrTaskAlreadyExists
	}
	now := time.Now()
	if now.Sub(st.swept) > time.Minute {
		for id, k := range st.tasks {
			if now.Sub(k.at) > keepFor {
				delete(st.tasks, id)
			}
		}
		st.swept = now
	}
	st.tasks[task.ID] = &kept{task: task, version: 1, at: now}
	return 1, nil
}

// Update implements taskstore.Store with compare-and-set on the version.
// A task known only from Agora (after a restart) has version
// TaskVersionMissing, which any update follows.
func (st *store) Update(_ context.Context, u *taskstore.UpdateRequest) (taskstore.TaskVersion, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.held, u.Task.ID)
	k := st.tasks[u.Task.ID]
	if k == nil {
		st.tasks[u.Task.ID] = &kept{task: u.Task, version: 1, at: time.Now()}
		return 1, nil
	}
	if u.PrevVersion != taskstore.TaskVersionMissing && u.PrevVersion != k.version {
		return 0, taskstore.ErrConcurrentModification
	}
	k.task, k.version, k.at = u.Task, k.version+1, time.Now()
	return k.version, nil
}

// Get implements taskstore.Store: the task of thread id, as the caller
// (the principal in ctx) may see it; a thread of another principal is
// a2a.ErrTaskNotFound, as one that does not exist.
func (st *store) Get(ctx context.Context, id a2a.TaskID) (*taskstore.StoredTask, error) {
	who := principalOf(ctx)
	if who == nil {
		return nil, a2a.ErrTaskNotFound
	}
	th, err := st.s.thread(ctx, who, string(id))
	if err != nil {
		return nil, err
	}
	derived, err := st.s.taskOf(ctx, th)
	if err != nil {
		return nil, err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if h, ok := st.held[id]; ok {
		if time.Now().Before(h.until) {
			derived = h.task
		} else {
			delete(st.held, id)
		}
	}
	k := st.tasks[id]
	if k == nil {
		return &taskstore.StoredTask{Task: derived, Version: taskstore.TaskVersionMissing}, nil
	}
	t := *k.task
	t.Metadata = maps.Clone(t.Metadata)
	if rank(derived) >= rank(&t) {
		t.Status, t.Artifacts = derived.Status, derived.Artifacts
		for key, v := range derived.Metadata {
			t.SetMeta(key, v)
		}
	}
	if derived.Status.State.Terminal() && t.Status.State == derived.Status.State {
		// Agora holds all of it now; what a2a-go wrote goes.
		delete(st.tasks, id)
	}
	return &taskstore.StoredTask{Task: &t, Version: k.version}, nil
}

// rank orders the states a task passes through: round by round,
// submitted, working, input-required, then an end.
func rank(t *a2a.Task) int {
	round := 0
	switch v := t.Metadata[metaRound].(type) {
	case int:
		round = v
	case float64:
		round = int(v)
	}
	phase := 0
	switch s := t.Status.State; {
	case s == a2a.TaskStateWorking:
		phase = 1
	case s == a2a.TaskStateInputRequired:
		phase = 2
	case s.Terminal():
		phase = 3
	}
	return round*4 + phase
}

// thread reads thread id for who: a2a.ErrTaskNotFound when there is none,
// or it is another principal's that who may not see.
func (s *Service) thread(ctx context.Context, who *principal.Principal, id string) (*client.Thread, error) {
	if lifecycle.ValidToken(id) != nil {
		return nil, a2a.ErrTaskNotFound
	}
	th, err := s.c.Thread(ctx, id)
	switch {
	case errors.Is(err, client.ErrNotFound):
		return nil, a2a.ErrTaskNotFound
	case err != nil:
		return nil, unavailable(err)
	case len(th.Rounds) == 0 || !who.MaySee(th.Rounds[0].Principal):
		return nil, a2a.ErrTaskNotFound
	}
	return th, nil
}

// unavailable is the protocol error for Agora not answering.
func unavailable(err error) error {
	return a2a.NewError(a2a.ErrInternalError, fmt.Sprintf("Agora did not answer (%v): try again shortly", err))
}

// contextOf is the context id of a thread: the one its first round was
// dispatched with, else the thread id.
func contextOf(th *client.Thread) string {
	if r := th.Rounds[0].Request; r != nil && r.Labels[contextLabel] != "" {
		return r.Labels[contextLabel]
	}
	return th.ThreadID
}

// taskOf derives the task of a thread from its records: its latest
// round's status, the question it waits on, its output or why it ended.
func (s *Service) taskOf(ctx context.Context, th *client.Thread) (*a2a.Task, error) {
	last := th.Latest()
	info := a2a.TaskInfo{TaskID: a2a.TaskID(th.ThreadID), ContextID: contextOf(th)}
	t := &a2a.Task{ID: info.TaskID, ContextID: info.ContextID, Metadata: map[string]any{
		metaThreadID: th.ThreadID, metaRound: last.Round, metaSkill: last.Subagent}}
	at := last.UpdatedAt
	t.Status.Timestamp = &at
	res := last.Result
	if res == nil {
		res = &client.Result{}
	}
	switch last.Status {
	case lifecycle.KindAccepted:
		t.Status.State = a2a.TaskStateSubmitted
		if last.Round > 0 {
			t.Status.State = a2a.TaskStateWorking
		}
	case lifecycle.KindStarted:
		t.Status.State = a2a.TaskStateWorking
	case lifecycle.KindNeedsInput:
		q, err := s.waitedOn(ctx, res.QuestionID)
		if err != nil {
			return nil, err
		}
		if q.QuestionID == "" {
			q = lifecycle.Question{Common: last.Common(), QuestionID: res.QuestionID, Question: res.Question}
		}
		t.Status.State, t.Status.Message = a2a.TaskStateInputRequired, questionMessage(info, q)
	case lifecycle.KindFinished:
		t.Status.State = a2a.TaskStateCompleted
		t.Artifacts = []*a2a.Artifact{outputArtifact(last.DispatchID, res.Output)}
	case lifecycle.KindFailed:
		t.Status.State = a2a.TaskStateFailed
		t.Status.Message = endMessage(info, "end-"+last.DispatchID, failedText(res.Reason, res.Detail))
	case lifecycle.KindCancelled:
		t.Status.State = a2a.TaskStateCanceled
		t.Status.Message = endMessage(info, "end-"+last.DispatchID, cancelledText(res.By, res.Detail))
	default:
		t.Status.State = a2a.TaskStateWorking
	}
	h, err := s.historyOf(ctx, info, th)
	if err != nil {
		return nil, err
	}
	t.History = h
	return t, nil
}

// historyOf derives a task's messages from its thread's records: the
// input that started it, then for each round that asked, the question
// and the answer that resumed it. It is what a task's history is after
// a restart of the door, or in another process.
func (s *Service) historyOf(ctx context.Context, info a2a.TaskInfo, th *client.Thread) ([]*a2a.Message, error) {
	var h []*a2a.Message
	if r := th.Rounds[0].Request; r != nil && len(r.Input) > 0 {
		h = append(h, inputMessage(info, th.ThreadID, r.Input))
	}
	for _, rd := range th.Rounds {
		if rd.Result == nil || rd.Result.QuestionID == "" {
			continue
		}
		q, err := s.waitedOn(ctx, rd.Result.QuestionID)
		if err != nil {
			return nil, err
		}
		if q.QuestionID == "" {
			q = lifecycle.Question{Common: rd.Common(), QuestionID: rd.Result.QuestionID, Question: rd.Result.Question}
		}
		h = append(h, questionMessage(info, q))
		if a := cmp.Or(q.Decision, q.Answer); a != "" {
			m := a2a.NewMessageForTask(a2a.MessageRoleUser, info, a2a.NewTextPart(a))
			m.ID = "answer-" + q.QuestionID
			m.Metadata = map[string]any{metaQuestionID: q.QuestionID, "answered_by": q.AnsweredBy}
			h = append(h, m)
		}
	}
	return h, nil
}

// inputMessage is the message that started a thread, from its input: the
// text of an input that holds only a task, else the input as a data part.
func inputMessage(info a2a.TaskInfo, threadID string, input json.RawMessage) *a2a.Message {
	var obj map[string]any
	_ = json.Unmarshal(input, &obj)
	var p *a2a.Part
	if task, ok := obj["task"].(string); ok && len(obj) == 1 {
		p = a2a.NewTextPart(task)
	} else {
		p = a2a.NewDataPart(obj)
		p.MediaType = mediaJSON
	}
	m := a2a.NewMessageForTask(a2a.MessageRoleUser, info, p)
	m.ID = "input-" + threadID
	return m
}

// waitedOn is the question a paused round waits on: its own, or the one
// it joined (asked once for every thread waiting on it). A question the
// router has not recorded yet is the zero Question.
func (s *Service) waitedOn(ctx context.Context, qid string) (lifecycle.Question, error) {
	if qid == "" {
		return lifecycle.Question{}, nil
	}
	q, err := s.c.Question(ctx, qid)
	if errors.Is(err, client.ErrNotFound) {
		return lifecycle.Question{}, nil
	}
	if err != nil {
		return lifecycle.Question{}, unavailable(err)
	}
	if q.Status == lifecycle.StatusJoined && q.JoinedTo != "" {
		j, err := s.c.Question(ctx, q.JoinedTo)
		if err != nil {
			return lifecycle.Question{}, unavailable(err)
		}
		return j, nil
	}
	return q, nil
}

// eventTime is now, for the status of an event the executor yields.
func eventTime() *time.Time {
	t := time.Now().UTC()
	return &t
}
