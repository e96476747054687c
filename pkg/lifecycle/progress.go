package lifecycle

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Progress: a running sub-agent appends JSON lines to .agora/progress.jsonl
// (AGORA_PROGRESS_FILE); the worker tails the file and publishes the
// latest, coalesced and rate-limited, as dev.agora.progress.reported on
// agora.progress.<thread_id>.<dispatch_id> (stream AGORA_PROGRESS). It is
// telemetry beside the lifecycle, not a seventh lifecycle kind. See
// docs/progress.md.

// TypeProgress is the CloudEvents type of a progress report.
const TypeProgress = "dev.agora.progress.reported"

// StreamProgress holds progress reports; SubjectProgressAll its subjects.
const (
	StreamProgress     = "AGORA_PROGRESS"
	SubjectProgressAll = "agora.progress.>"
)

// ProgressFile is where a sub-agent appends progress lines, relative to
// its workspace.
const ProgressFile = ".agora/progress.jsonl"

// Limits of a progress line and of what a report carries.
const (
	MaxProgressLine    = 4 << 10 // a longer line is skipped
	MaxProgressMessage = 1 << 10 // a message is cut to this
	MaxProgressTodo    = 50      // todo items kept
)

// Progress is the data of dev.agora.progress.reported: the latest line a
// run reported, with the counts of the lines seen.
type Progress struct {
	Common
	Attempt int `json:"attempt"`
	// Seq numbers the reports of an attempt from 1; a consumer keeps the
	// highest.
	Seq     int            `json:"seq"`
	Message string         `json:"message,omitempty"`
	Percent *float64       `json:"percent,omitempty"`
	Todo    []ProgressTodo `json:"todo,omitempty"`
	// Lines counts the valid lines read so far, Skipped the malformed or
	// oversized ones; lines between two reports are coalesced into the
	// later.
	Lines   int `json:"lines"`
	Skipped int `json:"skipped,omitempty"`
}

// ProgressTodo is one item of a reported to-do list.
type ProgressTodo struct {
	Text string `json:"text"`
	Done bool   `json:"done"`
}

func (*Progress) eventType() string { return TypeProgress }

// ProgressSubject returns agora.progress.<thread_id>.<dispatch_id>.
func ProgressSubject(threadID, dispatchID string) (string, error) {
	return join("agora", "progress", threadID, dispatchID)
}

// ProgressFilter returns the subject filter of progress reports: of one
// thread, of one dispatch, or all ("" matches any).
func ProgressFilter(threadID, dispatchID string) string {
	or := func(s string) string {
		if s == "" {
			return "*"
		}
		return s
	}
	return "agora.progress." + or(threadID) + "." + or(dispatchID)
}

// ParseProgressLine reads one line of .agora/progress.jsonl: a JSON object
// {"message": "…", "percent": 40, "todo": [{"text": "…", "done": true}]}
// with at least one of them, or a bare JSON string as the message.
func ParseProgressLine(line []byte) (message string, percent *float64, todo []ProgressTodo, err error) {
	if len(line) > MaxProgressLine {
		return "", nil, nil, fmt.Errorf("line of %d bytes; the limit is %d", len(line), MaxProgressLine)
	}
	var v struct {
		Message *string        `json:"message"`
		Percent *float64       `json:"percent"`
		Todo    []ProgressTodo `json:"todo"`
	}
	if s := strings.TrimSpace(string(line)); strings.HasPrefix(s, `"`) {
		m, err := strconv.Unquote(s)
		if err != nil {
			return "", nil, nil, fmt.Errorf("not a JSON string")
		}
		return Clip(m, MaxProgressMessage), nil, nil, nil
	}
	if err := json.Unmarshal(line, &v); err != nil {
		return "", nil, nil, fmt.Errorf("not a JSON object with message, percent or todo")
	}
	if v.Message == nil && v.Percent == nil && v.Todo == nil {
		return "", nil, nil, fmt.Errorf("none of message, percent, todo")
	}
	if v.Percent != nil && (*v.Percent < 0 || *v.Percent > 100) {
		return "", nil, nil, fmt.Errorf("percent %v is not in 0..100", *v.Percent)
	}
	if len(v.Todo) > MaxProgressTodo {
		v.Todo = v.Todo[:MaxProgressTodo]
	}
	for i := range v.Todo {
		v.Todo[i].Text = Clip(v.Todo[i].Text, 200)
	}
	if v.Message != nil {
		message = Clip(*v.Message, MaxProgressMessage)
	}
	return message, v.Percent, v.Todo, nil
}
