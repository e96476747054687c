package mcpserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// QuestionsArgs are agora_questions' arguments.
type QuestionsArgs struct {
	Route    string `json:"route,omitempty" jsonschema:"only questions on this route"`
	Status   string `json:"status,omitempty" jsonschema:"asked (default), joined, answered, expired, withdrawn or all"`
	ThreadID string `json:"thread_id,omitempty" jsonschema:"only this thread's questions"`
	Limit    int    `json:"limit,omitempty" jsonschema:"waiting questions per page: 1-1000, default 100"`
	Cursor   string `json:"cursor,omitempty" jsonschema:"next_cursor of the previous page of waiting questions"`
}

// QuestionList is agora_questions' result.
type QuestionList struct {
	Questions []QuestionItem `json:"questions"`
	// Count is how many waiting questions match, on every page (status
	// asked only).
	Count int `json:"count,omitempty"`
	// NextCursor continues a list of waiting questions; absent on the
	// last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// QuestionItem is one question in a QuestionList.
type QuestionItem struct {
	QuestionID string   `json:"question_id"`
	Status     string   `json:"status"`
	Route      string   `json:"route"`
	Kind       string   `json:"kind,omitempty"`
	Question   string   `json:"question"`
	Options    []string `json:"options,omitempty"`
	Context    string   `json:"context,omitempty"`
	Subagent   string   `json:"subagent"`
	ThreadID   string   `json:"thread_id"`
	Round      int      `json:"round"`
	AskedAt    string   `json:"asked_at"`
	Answer     string   `json:"answer,omitempty"`
	AnsweredBy string   `json:"answered_by,omitempty"`
	// The question asked once (docs/router.md, "Ask once").
	ThreadsWaiting int             `json:"threads_waiting,omitempty" jsonschema:"an asked question: how many threads wait on it; one answer resumes them all"`
	WaitingThreads []WaitingThread `json:"waiting_threads,omitempty" jsonschema:"the threads waiting on it, the asking thread first; absent when only the asking thread waits"`
	JoinedTo       string          `json:"joined_to,omitempty" jsonschema:"a joined question: the question it waits on and is answered with"`
	Suggestion     *SuggestionItem `json:"suggestion,omitempty" jsonschema:"an answerer's suggested answer"`
	Reused         *ReusedItem     `json:"reused,omitempty" jsonschema:"the remembered decision that answered it"`
}

// WaitingThread is one thread waiting on a question.
type WaitingThread struct {
	QuestionID string `json:"question_id" jsonschema:"the thread's own question (joined to this one, or this one)"`
	ThreadID   string `json:"thread_id"`
	DispatchID string `json:"dispatch_id"`
	Subagent   string `json:"subagent,omitempty"`
	AskedAt    string `json:"asked_at"`
}

// SuggestionItem is an answerer's suggested answer.
type SuggestionItem struct {
	Answer     string  `json:"answer"`
	Decision   string  `json:"decision,omitempty"`
	Confidence float64 `json:"confidence" jsonschema:"0 to 1"`
	Rationale  string  `json:"rationale,omitempty"`
	By         string  `json:"by" jsonschema:"the answerer that suggested it"`
	Accepted   bool    `json:"accepted" jsonschema:"true: it answered the question (its confidence reached the route's auto_accept); false: it waits for a person to confirm or override"`
}

// ReusedItem names the remembered decision that answered a question.
type ReusedItem struct {
	QuestionID string `json:"question_id" jsonschema:"the question whose answer was remembered"`
	AnsweredBy string `json:"answered_by"`
	AnsweredAt string `json:"answered_at"`
}

func suggestionOf(s *lifecycle.Suggestion) *SuggestionItem {
	if s == nil {
		return nil
	}
	return &SuggestionItem{Answer: s.Answer, Decision: s.Decision, Confidence: s.Confidence, Rationale: clip.String(s.Rationale, 2000), By: s.By, Accepted: s.Accepted}
}

func questionItem(q lifecycle.Question) QuestionItem {
	it := QuestionItem{QuestionID: q.QuestionID, Status: q.Status, Route: q.Route, Kind: string(q.Kind),
		Question: q.Question, Options: q.Options, Context: clip.String(q.Context, 2000), Subagent: q.Subagent, ThreadID: q.ThreadID,
		Round: q.Round, AskedAt: q.AskedAt.UTC().Format(time.RFC3339), Answer: cmp.Or(q.Answer, q.Decision), AnsweredBy: q.AnsweredBy,
		JoinedTo: q.JoinedTo, Suggestion: suggestionOf(q.Suggestion)}
	if q.Status == "asked" {
		it.ThreadsWaiting = max(1, len(q.WaitingThreads))
	}
	for _, w := range q.WaitingThreads {
		it.WaitingThreads = append(it.WaitingThreads, WaitingThread{QuestionID: w.QuestionID, ThreadID: w.ThreadID, DispatchID: w.DispatchID,
			Subagent: w.Subagent, AskedAt: w.AskedAt.UTC().Format(time.RFC3339)})
	}
	if r := q.Reused; r != nil {
		it.Reused = &ReusedItem{QuestionID: r.QuestionID, AnsweredBy: r.AnsweredBy, AnsweredAt: r.AnsweredAt.UTC().Format(time.RFC3339)}
	}
	return it
}

func (t *tools) questions(ctx context.Context, _ *mcp.CallToolRequest, in QuestionsArgs) (*mcp.CallToolResult, *QuestionList, error) {
	f := client.QuestionFilter{Route: in.Route, Status: in.Status, ThreadID: in.ThreadID}
	switch in.Status {
	case "":
		f.Status = "asked"
	case "all":
		f.Status = ""
	case "asked", lifecycle.StatusJoined, "answered", "expired", "withdrawn":
	default:
		return nil, nil, fmt.Errorf("status %q: want asked, joined, answered, expired, withdrawn or all", in.Status)
	}
	if in.Limit < 0 || in.Limit > client.MaxWaitingLimit {
		return nil, nil, fmt.Errorf("limit %d: want 1 to %d (default %d)", in.Limit, client.MaxWaitingLimit, client.DefaultWaitingLimit)
	}
	if f.Status != "asked" && (in.Cursor != "" || in.Limit != 0) {
		return nil, nil, fmt.Errorf("limit and cursor page waiting questions (status asked), not status %q", in.Status)
	}
	own := !t.who.Admin && !t.who.SeeAll
	if own && (in.Cursor != "" || in.Limit != 0) {
		return nil, nil, fmt.Errorf("principal %s lists the questions of its own threads whole: leave out limit and cursor", t.who.Name)
	}
	out := &QuestionList{Questions: []QuestionItem{}}
	var qs []lifecycle.Question
	var err error
	if f.Status == "asked" && !own {
		// A page at a time from the router's index of waiting questions
		// (docs/mcp.md); the bucket whole only when no router answers.
		var p *client.WaitingPage
		if p, err = t.s.c.Waiting(ctx, f, in.Limit, in.Cursor); err == nil {
			qs, out.Count, out.NextCursor = p.Questions, p.Count, p.NextCursor
		} else if errors.Is(err, client.ErrUnavailable) && in.Cursor == "" {
			qs, err = t.s.c.Questions(ctx, f)
			out.Count = len(qs)
		}
	} else {
		qs, err = t.s.c.Questions(ctx, f)
	}
	if err != nil {
		return nil, nil, t.explain(err)
	}
	if own {
		if qs, err = t.filterQuestions(ctx, qs); err != nil {
			return nil, nil, err
		}
		out.Count = len(qs)
	}
	for _, q := range qs {
		out.Questions = append(out.Questions, questionItem(q))
	}
	return nil, out, nil
}
