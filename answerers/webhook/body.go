package webhook

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/pkg/answerlink"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Body is what each POST carries (docs/webhook.md).
type Body struct {
	Type       string            `json:"type"` // "question.asked"
	QuestionID string            `json:"question_id"`
	ThreadID   string            `json:"thread_id"`
	DispatchID string            `json:"dispatch_id"`
	Round      int               `json:"round"`
	Subagent   string            `json:"subagent"`
	Route      string            `json:"route"`
	Kind       string            `json:"kind,omitempty"`
	Question   string            `json:"question"`
	Context    string            `json:"context,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	// Options are the question's options (approve and reject for an
	// approval), each with its signed answer link when links are on.
	Options []Option `json:"options,omitempty"`
	// OpenURL is the link that opens a form for an answer in the person's
	// own words, where one is allowed.
	OpenURL string `json:"open_url,omitempty"`
	// Audience is who the links answer as (answered_by).
	Audience string `json:"audience,omitempty"`
	// LinksExpireAt is when the links stop working.
	LinksExpireAt *time.Time `json:"links_expire_at,omitempty"`
	// QuestionURL is the question's page in the inbox.
	QuestionURL string     `json:"question_url,omitempty"`
	AskedAt     time.Time  `json:"asked_at"`
	Deadline    *time.Time `json:"deadline,omitempty"`
}

// Option is one option of a question.
type Option struct {
	Option string `json:"option"`
	URL    string `json:"url,omitempty"`
}

func (s *Server) body(route string, q *lifecycle.Question) ([]byte, error) {
	b := Body{
		Type: "question.asked", QuestionID: q.QuestionID, ThreadID: q.ThreadID, DispatchID: q.DispatchID, Round: q.Round,
		Subagent: q.Subagent, Route: route, Kind: string(q.Kind), Question: q.Question, Context: q.Context, Labels: q.Labels,
		AskedAt: q.AskedAt, Deadline: q.Deadline,
	}
	options, _ := answerlink.Choices(*q)
	for _, o := range options {
		b.Options = append(b.Options, Option{Option: o})
	}
	if s.cfg.InboxURL != "" {
		b.QuestionURL = strings.TrimSuffix(s.cfg.InboxURL, "/") + "/questions/" + q.QuestionID
	}
	if s.links != nil {
		b.Audience = s.audience(q)
		exp := answerlink.Expiry(*q, time.Now())
		links, err := s.links.ForQuestion(s.cfg.InboxURL, *q, b.Audience, "webhook:"+route, exp)
		if err != nil {
			return nil, err
		}
		for _, l := range links {
			if l.Open {
				b.OpenURL = l.URL
				continue
			}
			for i := range b.Options {
				if b.Options[i].Option == l.Option {
					b.Options[i].URL = l.URL
				}
			}
		}
		t := exp.UTC().Truncate(time.Second)
		b.LinksExpireAt = &t
	}
	return json.Marshal(b)
}

// audience is who a question's links are for: its AudienceLabel label
// when set, else Config.Audience.
func (s *Server) audience(q *lifecycle.Question) string {
	if l := s.cfg.AudienceLabel; l != "" {
		if v := strings.TrimSpace(q.Labels[l]); v != "" {
			return v
		}
	}
	return s.cfg.Audience
}
