package a2aserver

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// How messages and parts map to Agora and back (docs/a2a.md, "Parts").

// Metadata keys this door reads and writes.
const (
	// metaSkill, in a message's (or the request's) metadata, names the
	// sub-agent to start.
	metaSkill = "skill"
	// metaQuestionID is the question an input-required message asks; a
	// client may echo it on its answer.
	metaQuestionID = "question_id"
	metaKind       = "kind"
	// metaShownDigest is the shown digest of the question an
	// input-required message asks; a client echoes it on its answer to
	// bind it to what it showed (docs/a2a.md, "Bound answers").
	metaShownDigest = "shown_digest"
	metaThreadID    = "agora_thread_id"
	metaRound       = "agora_round"
	metaPart        = "agora_part" // on a part: question, context, options or output
)

// contextLabel is the dispatch label that keeps a task's context id with
// its thread.
const contextLabel = "a2a_context_id"

// maxContext bounds the context text of a question put in a message.
const maxContext = 8000

// invalid is the protocol's invalid-params error with message.
func invalid(format string, args ...any) error {
	return a2a.NewError(a2a.ErrInvalidParams, fmt.Sprintf(format, args...))
}

// unsupportedPart is the protocol's error for a part this agent does not
// take: files (raw bytes or URLs).
func unsupportedPart(i int) error {
	return a2a.NewError(a2a.ErrUnsupportedContentType,
		fmt.Sprintf("part %d is a file: this agent takes text parts and JSON object data parts", i))
}

// contents splits parts into their text (joined by blank lines) and at
// most one JSON object (a data part).
func contents(parts []*a2a.Part) (text string, data map[string]any, err error) {
	var texts []string
	for i, p := range parts {
		if p == nil {
			return "", nil, invalid("part %d is empty", i)
		}
		switch c := p.Content.(type) {
		case a2a.Text:
			if s := strings.TrimSpace(string(c)); s != "" {
				texts = append(texts, s)
			}
		case a2a.Data:
			obj, ok := c.Value.(map[string]any)
			if !ok {
				return "", nil, invalid("part %d: a data part must hold a JSON object", i)
			}
			if data != nil {
				return "", nil, invalid("part %d: one data part at most", i)
			}
			data = obj
		case a2a.Raw, a2a.URL:
			return "", nil, unsupportedPart(i)
		default:
			return "", nil, invalid("part %d has no content", i)
		}
	}
	return strings.Join(texts, "\n\n"), data, nil
}

// inputOf is the sub-agent's input for a message that starts a task: the
// data part's object, with the text as its "task" field.
func inputOf(parts []*a2a.Part) (json.RawMessage, error) {
	text, data, err := contents(parts)
	if err != nil {
		return nil, err
	}
	if text == "" && data == nil {
		return nil, invalid("the message is empty: send the task as text, or a JSON object as a data part")
	}
	in := map[string]any{}
	for k, v := range data {
		in[k] = v
	}
	if text != "" {
		if _, ok := in["task"]; ok {
			return nil, invalid(`the data part has a "task" field and the message has text: send one or the other`)
		}
		in["task"] = text
	}
	b, err := json.Marshal(in)
	if err != nil {
		return nil, invalid("input: %v", err)
	}
	return b, nil
}

// answerOf reads a message that answers q: the text is the answer (for an
// approval, approve or reject), or a data part sets answer, decision and
// comment.
func answerOf(parts []*a2a.Part, q lifecycle.Question) (lifecycle.Answer, error) {
	text, data, err := contents(parts)
	if err != nil {
		return lifecycle.Answer{}, err
	}
	str := func(k string) (string, error) {
		v, ok := data[k]
		if !ok || v == nil {
			return "", nil
		}
		s, ok := v.(string)
		if !ok {
			return "", invalid("the data part's %q must be a string", k)
		}
		return strings.TrimSpace(s), nil
	}
	var a lifecycle.Answer
	for k, dst := range map[string]*string{"answer": &a.Answer, "decision": &a.Decision, "comment": &a.Comment} {
		if *dst, err = str(k); err != nil {
			return lifecycle.Answer{}, err
		}
	}
	if q.KindIs(lifecycle.QuestionApproval) {
		if d := strings.ToLower(text); a.Decision == "" && (d == "approve" || d == "reject") {
			a.Decision = d
		} else if a.Comment == "" {
			a.Comment = text
		}
		if a.Decision != "approve" && a.Decision != "reject" {
			return lifecycle.Answer{}, invalid("question %s is an approval: answer approve or reject (as text, or the data part's decision)", q.QuestionID)
		}
		return a, nil
	}
	if a.Answer == "" {
		a.Answer = text
	}
	if a.Answer == "" {
		return lifecycle.Answer{}, invalid("the answer is empty: send it as text, or as the data part's answer")
	}
	return a, nil
}

// questionMessage is the agent's message of an input-required task: the
// question as text, its context as a second text part, and a data part
// with the question id, kind and options; the question id and kind are
// in the message's metadata too.
func questionMessage(info a2a.TaskInfoProvider, q lifecycle.Question) *a2a.Message {
	parts := []*a2a.Part{a2a.NewTextPart(q.Question)}
	parts[0].SetMeta(metaPart, "question")
	if q.Context != "" {
		p := a2a.NewTextPart(clip.String(q.Context, maxContext))
		p.SetMeta(metaPart, "context")
		parts = append(parts, p)
	}
	options := []any{}
	for _, o := range q.Options {
		options = append(options, o)
	}
	d := a2a.NewDataPart(map[string]any{"question_id": q.QuestionID, "kind": string(q.Kind), "options": options})
	d.MediaType = mediaJSON
	d.SetMeta(metaPart, "options")
	parts = append(parts, d)
	m := a2a.NewMessageForTask(a2a.MessageRoleAgent, info, parts...)
	m.ID = "question-" + q.QuestionID
	m.Metadata = map[string]any{metaQuestionID: q.QuestionID, metaKind: string(q.Kind), metaRound: q.Round}
	if q.ShownDigest != "" {
		m.Metadata[metaShownDigest] = q.ShownDigest
	}
	return m
}

// outputArtifact is a finished round's output as an artifact of one data
// part (an empty object when the sub-agent wrote none); the same dispatch
// always gives the same artifact id.
func outputArtifact(dispatchID string, output json.RawMessage) *a2a.Artifact {
	var v any
	if len(output) > 0 {
		if err := json.Unmarshal(output, &v); err != nil {
			v = string(output)
		}
	}
	if v == nil {
		v = map[string]any{}
	}
	p := a2a.NewDataPart(v)
	p.MediaType = mediaJSON
	p.SetMeta(metaPart, "output")
	return &a2a.Artifact{ID: a2a.ArtifactID("output-" + dispatchID), Name: "output", Description: "the sub-agent's output (.agora/output.json)", Parts: a2a.ContentParts{p}}
}

// endMessage is the agent's message of a failed or cancelled task.
func endMessage(info a2a.TaskInfoProvider, id, text string) *a2a.Message {
	m := a2a.NewMessageForTask(a2a.MessageRoleAgent, info, a2a.NewTextPart(text))
	m.ID = id
	return m
}

// failedText and cancelledText say why a thread ended.
func failedText(reason lifecycle.Reason, detail string) string {
	if detail == "" {
		return string(reason)
	}
	return string(reason) + ": " + clip.String(detail, 2000)
}

func cancelledText(by, reason string) string {
	s := "cancelled"
	if by != "" {
		s += " by " + by
	}
	if reason != "" {
		s += ": " + clip.String(reason, 2000)
	}
	return s
}
