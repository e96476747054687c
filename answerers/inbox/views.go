package inbox

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"path"
	"slices"
	"time"

	"github.com/agora-dispatch/agora/internal/answertext"
	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

//go:embed templates/*.html static/*
var files embed.FS

// asset is one embedded static file.
type asset struct {
	data    []byte
	ctype   string
	version string // short content hash, in the URL and the ETag
}

func loadAssets() map[string]asset {
	out := map[string]asset{}
	entries, _ := fs.ReadDir(files, "static")
	for _, e := range entries {
		b, err := files.ReadFile("static/" + e.Name())
		if err != nil {
			continue
		}
		sum := sha256.Sum256(b)
		ct := mime.TypeByExtension(path.Ext(e.Name()))
		if ct == "" {
			ct = "application/octet-stream"
		}
		out[e.Name()] = asset{data: b, ctype: ct, version: hex.EncodeToString(sum[:6])}
	}
	return out
}

// staticURL is the versioned URL of an embedded file.
func (s *Server) staticURL(name string) string {
	a, ok := s.assets[name]
	if !ok {
		return Prefix + "/static/" + name
	}
	return Prefix + "/static/" + name + "?v=" + a.version
}

func (s *Server) serveStatic(w http.ResponseWriter, r *http.Request) {
	a, ok := s.assets[r.PathValue("file")]
	if !ok {
		http.NotFound(w, r)
		return
	}
	h := w.Header()
	h.Set("Content-Type", a.ctype)
	h.Set("ETag", `"`+a.version+`"`)
	if r.URL.Query().Get("v") == a.version {
		h.Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		h.Set("Cache-Control", "no-cache")
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.data))
}

// pageNames are the page templates, each rendered inside layout.html.
var pageNames = []string{"pending", "question", "history", "login", "error", "link", "decisions"}

func parsePages(static func(string) string) (map[string]*template.Template, error) {
	out := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(template.FuncMap{"static": static, "sel": newSelect}).ParseFS(files, "templates/layout.html", "templates/parts.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("inbox: templates: %w", err)
		}
		out[name] = t
	}
	return out, nil
}

// view is what every page template gets.
type view struct {
	Title string
	Page  string
	// User is the signed-in user's name; empty on the login page.
	User string
	CSRF string
	// Pending counts the questions waiting for this user (every filter off).
	Pending int
	Data    any
}

// render executes a page. Output is buffered, so a template error becomes a
// 500 instead of half a page.
func (s *Server) render(w http.ResponseWriter, status int, page string, v view) {
	t := s.pages[page]
	v.Page = page
	var buf bytes.Buffer
	err := t.ExecuteTemplate(&buf, "layout", v)
	if err != nil {
		s.log.Error("render page", "page", page, "err", err)
		http.Error(w, "inbox: the page could not be rendered", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// baseView fills the parts of a view every signed-in page has.
func (s *Server) baseView(id *identity, title string) view {
	v := view{Title: title}
	if id != nil {
		v.User, v.CSRF = id.user.name, id.csrf()
		v.Pending = s.pendingFor(id.user)
	}
	return v
}

func (s *Server) errorPage(w http.ResponseWriter, _ *http.Request, id *identity, status int, title, detail string) {
	v := s.baseView(id, title)
	v.Data = struct{ Title, Detail string }{title, detail}
	s.render(w, status, "error", v)
}

// filter selects questions by the query of a page or API call. Empty
// fields match anything.
type filter struct {
	Route, Kind, Subagent, Thread string
}

func filterFrom(q url.Values) filter {
	return filter{Route: q.Get("route"), Kind: q.Get("kind"), Subagent: q.Get("subagent"), Thread: q.Get("thread")}
}

func (f filter) match(q *Question) bool {
	return (f.Route == "" || q.Route == f.Route) && (f.Kind == "" || kindOf(q) == f.Kind) &&
		(f.Subagent == "" || q.Subagent == f.Subagent) && (f.Thread == "" || q.ThreadID == f.Thread)
}

// Active reports whether any filter is set.
func (f filter) Active() bool { return f != filter{} }

// values is f as a query.
func (f filter) values() url.Values {
	v := url.Values{}
	for k, x := range map[string]string{"route": f.Route, "kind": f.Kind, "subagent": f.Subagent, "thread": f.Thread} {
		if x != "" {
			v.Set(k, x)
		}
	}
	return v
}

// kindOf is the question's kind; a question without one is a
// clarification.
func kindOf(q *Question) string {
	if q.Kind == "" {
		return "clarification"
	}
	return string(q.Kind)
}

var kindLabels = map[string]string{
	"clarification": "Clarification", "decision": "Decision",
	"information": "Information", "approval": "Approval",
}

func kindLabel(k string) string {
	if l, ok := kindLabels[k]; ok {
		return l
	}
	return k
}

// timeFormat is how the pages write a time (the script shows it in the
// reader's zone).
const timeFormat = "2006-01-02 15:04:05 UTC"

func fmtTime(t time.Time) string { return t.UTC().Format(timeFormat) }

// isoTime is a machine-readable time for datetime attributes and the
// script: fixed width, so the script orders rows by comparing strings.
func isoTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// span writes a duration the way people read one: 45s, 12m, 3h 5m, 2d 4h.
func span(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 24*time.Hour:
		h, m := int(d/time.Hour), int(d%time.Hour/time.Minute)
		if m == 0 {
			return fmt.Sprintf("%dh", h)
		}
		return fmt.Sprintf("%dh %dm", h, m)
	}
	days, h := int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour)
	if h == 0 {
		return fmt.Sprintf("%dd", days)
	}
	return fmt.Sprintf("%dd %dh", days, h)
}

func ago(t, now time.Time) string {
	d := now.Sub(t)
	if d < time.Minute {
		return "just now"
	}
	return span(d) + " ago"
}

// timeLeft describes a deadline: the text and an urgency class (soon
// within the hour, overdue after it passed).
func timeLeft(deadline *time.Time, now time.Time) (text, urgency string) {
	if deadline == nil {
		return "no deadline", "none"
	}
	d := deadline.Sub(now)
	switch {
	case d <= 0:
		return "overdue by " + span(d), "overdue"
	case d < time.Hour:
		return span(d) + " left", "soon"
	}
	return span(d) + " left", ""
}

// qview is a question as the templates show it.
type qview struct {
	ID, URL, Text, Context  string
	ShownDigest             string // what the page shows, sent back with the answer
	Kind, KindLabel         string
	Subagent, Route, Target string
	Answerer                string
	Human                   bool
	Status, StatusLabel     string
	Round                   int
	ThreadID, DispatchID    string
	Labels                  []label
	Options                 []option
	Approval                bool

	AskedISO, AskedAt, AskedAgo string
	DeadlineISO, DeadlineAt     string
	Left, Urgency               string
	Escalation                  int

	Answer, Decision, Comment string
	AnswerText                string
	AnsweredBy                string
	AnsweredISO, AnsweredAt   string
	ClosedISO, ClosedAt       string
	Detail, Outcome           string

	// AnswerSnippet is AnswerText on one line, cut for a list row: a
	// free-text answer may be long.
	AnswerSnippet string
	// Declines say who declined the question, where and why.
	Declines []declineView

	// Threads is how many threads wait on the question: every thread of
	// Waiting, or the asking thread alone (docs/inbox.md, "Asked once").
	Threads int
	// Waiting are the threads waiting on a question asked by more than
	// one, the asking thread first.
	Waiting []waitingView
	// JoinedTo is, on a question that joined another, that question's id
	// and page.
	JoinedTo, JoinedToURL string
	// Reused says whose remembered decision answered the question.
	Reused *reusedView
	// Suggestion is an answerer's suggestion the question waits with
	// (not accepted): the form shows it preselected.
	Suggestion *suggestionView
	// Machine says who made the answer when no person did (an accepted
	// suggestion); Reversed who reversed such an answer, and the
	// suggestion's answer.
	Machine        string
	Reversed       string
	ReversedAnswer string
	ReversedFromBy string
}

// waitingView is one thread waiting on a question.
type waitingView struct {
	QuestionID, QuestionURL string
	DispatchID, ThreadID    string
	Subagent                string
	ISO, At                 string
	// Asking is the thread that asked the question the others joined.
	Asking bool
}

// reusedView names the decision a question was answered from.
type reusedView struct {
	QuestionID, QuestionURL string
	AnsweredBy              string
	ISO, At                 string
}

// suggestionView is a suggested answer as the answer form shows it.
type suggestionView struct {
	Answer, Decision string
	// Text is the suggestion as one line (answertext.Line).
	Text string
	// Confidence is a percentage, as "72%".
	Confidence string
	Rationale  string
	By         string
	// Option is set when the suggestion is one of the options (or, for
	// an approval, a decision alone); otherwise it fills the text field.
	Option bool
}

// declineView is one decline as the question page shows it.
type declineView struct {
	Route, By, Reason string
	ISO, At           string
}

type label struct{ Name, Value string }

// option is one option button; Key is its keyboard shortcut (1-9).
type option struct {
	Value string
	Key   string
}

func questionURL(id string) string { return Prefix + "/questions/" + url.PathEscape(id) }

func newQView(q *Question, now time.Time) qview {
	v := qview{
		ID: q.QuestionID, URL: questionURL(q.QuestionID), Text: q.Question.Question, Context: q.Context, ShownDigest: q.ShownDigest,
		Kind: kindOf(q), Subagent: q.Subagent, Route: q.Route, Target: q.Target,
		Answerer: q.Answerer, Human: q.Answerer == "" || q.Answerer == "human",
		Status: q.Status, StatusLabel: statusLabel(q.Status), Round: q.Round, ThreadID: q.ThreadID, DispatchID: q.DispatchID,
		Approval: q.KindIs(lifecycle.QuestionApproval), Escalation: q.Escalation,
		AskedISO: isoTime(q.AskedAt), AskedAt: fmtTime(q.AskedAt), AskedAgo: ago(q.AskedAt, now),
		Answer: q.Answer, Decision: q.Decision, Comment: q.Comment, AnsweredBy: q.AnsweredBy,
		Detail: q.Detail, Outcome: q.Outcome, AnswerText: answertext.Line(q.Answer, q.Decision),
	}
	v.KindLabel = kindLabel(v.Kind)
	v.AnswerSnippet = clip.Line(v.AnswerText, answerSnippetRunes)
	for _, d := range q.Declines {
		v.Declines = append(v.Declines, declineView{Route: d.Route, By: cmp.Or(d.DeclinedBy, "an answerer"), Reason: d.Reason, ISO: isoTime(d.At), At: fmtTime(d.At)})
	}
	for _, k := range slices.Sorted(maps.Keys(q.Labels)) {
		v.Labels = append(v.Labels, label{k, q.Labels[k]})
	}
	for i, o := range q.Options {
		opt := option{Value: o}
		if i < 9 {
			opt.Key = fmt.Sprint(i + 1)
		}
		v.Options = append(v.Options, opt)
	}
	if q.Deadline != nil {
		v.DeadlineISO, v.DeadlineAt = isoTime(*q.Deadline), fmtTime(*q.Deadline)
	}
	v.Left, v.Urgency = timeLeft(q.Deadline, now)
	if q.AnsweredAt != nil {
		v.AnsweredISO, v.AnsweredAt = isoTime(*q.AnsweredAt), fmtTime(*q.AnsweredAt)
	}
	if !q.Pending() {
		c := q.closedAt()
		v.ClosedISO, v.ClosedAt = isoTime(c), fmtTime(c)
	}
	v.Threads = threadsWaiting(q)
	if len(q.WaitingThreads) > 1 {
		for i, t := range q.WaitingThreads {
			v.Waiting = append(v.Waiting, waitingView{QuestionID: t.QuestionID, QuestionURL: questionURL(t.QuestionID),
				DispatchID: t.DispatchID, ThreadID: t.ThreadID, Subagent: t.Subagent, ISO: isoTime(t.AskedAt), At: fmtTime(t.AskedAt),
				Asking: i == 0})
		}
	}
	if q.JoinedTo != "" {
		v.JoinedTo, v.JoinedToURL = q.JoinedTo, questionURL(q.JoinedTo)
	}
	if r := q.Reused; r != nil {
		v.Reused = &reusedView{QuestionID: r.QuestionID, QuestionURL: questionURL(r.QuestionID), AnsweredBy: r.AnsweredBy,
			ISO: isoTime(r.AnsweredAt), At: fmtTime(r.AnsweredAt)}
	}
	if q.Machine() {
		v.Machine = machineText(q)
	}
	if rv := q.Reversal; rv != nil {
		v.Reversed, v.ReversedAnswer, v.ReversedFromBy = rv.By, clip.Line(rv.SuggestionAnswer, answerSnippetRunes), rv.SuggestionBy
	}
	if sg := q.Suggestion; sg != nil && !sg.Accepted {
		sv := &suggestionView{Answer: sg.Answer, Decision: sg.Decision, Text: answertext.Line(sg.Answer, sg.Decision),
			Confidence: fmt.Sprintf("%.0f%%", sg.Confidence*100), Rationale: sg.Rationale, By: sg.By}
		if q.KindIs(lifecycle.QuestionApproval) && sv.Decision == "" && (sv.Answer == "approve" || sv.Answer == "reject") {
			sv.Decision, sv.Answer = sv.Answer, ""
		}
		sv.Option = slices.Contains(q.Options, sv.Answer) || (q.KindIs(lifecycle.QuestionApproval) && sv.Answer == "" && sv.Decision != "")
		v.Suggestion = sv
	}
	return v
}

// threadsWaiting is how many threads wait on q: those it lists, or the
// asking thread alone.
func threadsWaiting(q *Question) int { return max(1, len(q.WaitingThreads)) }

func statusLabel(s string) string {
	switch s {
	case StatusAsked:
		return "Waiting"
	case StatusAnswered:
		return "Answered"
	case StatusExpired:
		return "Expired"
	case StatusWithdrawn:
		return "Withdrawn"
	case StatusJoined:
		return "Joined"
	}
	return s
}

// closedMessage says how a question closed, for people.
func closedMessage(q *Question) string {
	switch q.Status {
	case StatusAnswered:
		at := ""
		if q.AnsweredAt != nil {
			at = " at " + fmtTime(*q.AnsweredAt)
		}
		msg := fmt.Sprintf("Answered by %s%s: %s", q.AnsweredBy, at, answertext.Line(q.Answer, q.Decision))
		if r := q.Reused; r != nil {
			msg += " (" + reusedText(r) + ")"
		}
		return msg
	case StatusJoined:
		return "Joined question " + q.JoinedTo + ", asked earlier on the same route: one answer to it answers this thread too"
	case StatusExpired:
		if q.Detail != "" {
			return "Expired: " + q.Detail
		}
		return "Expired without an answer"
	case StatusWithdrawn:
		if q.Detail != "" {
			return "Withdrawn: " + q.Detail
		}
		return "Withdrawn"
	}
	return "No longer waiting (" + q.Status + ")"
}

// reusedText says whose remembered decision answered a question.
func reusedText(r *lifecycle.Reused) string {
	return fmt.Sprintf("answered from the decision of %s by %s at %s", r.QuestionID, r.AnsweredBy, fmtTime(r.AnsweredAt))
}

// sortClosed orders closed questions by when they closed, latest first.
func sortClosed(qs []*Question) {
	slices.SortFunc(qs, func(a, b *Question) int {
		if c := b.closedAt().Compare(a.closedAt()); c != 0 {
			return c
		}
		return cmp.Compare(b.QuestionID, a.QuestionID)
	})
}

// pendingFor counts the questions waiting for u.
func (s *Server) pendingFor(u *user) int {
	return s.store.pendingOf(func(route string) bool { return s.shows(route) && u.may(route) })
}

// threadView is a thread's rounds as the dispatcher reports them.
type threadView struct {
	ID     string
	Status string
	Active bool
	Rounds []roundView
}

type roundView struct {
	Round       int
	DispatchID  string
	Status      string
	StatusLabel string
	QuestionURL string
	This        bool
}

// roundLabel says what a round's status means for the person reading.
func roundLabel(r Round) string {
	switch r.Status {
	case lifecycle.KindAccepted:
		return "queued"
	case lifecycle.KindStarted:
		return "running"
	case lifecycle.KindNeedsInput:
		return "asked a question"
	case lifecycle.KindFinished:
		return "finished"
	case lifecycle.KindFailed:
		if r.Reason != "" {
			return "failed: " + string(r.Reason)
		}
		return "failed"
	case lifecycle.KindCancelled:
		return "cancelled"
	}
	return string(r.Status)
}

func newThreadView(th *Thread, this string) *threadView {
	if th == nil {
		return nil
	}
	v := &threadView{ID: th.ThreadID, Status: string(th.Status), Active: th.Active()}
	for _, r := range th.Rounds {
		rv := roundView{Round: r.Round, DispatchID: r.DispatchID, Status: string(r.Status), StatusLabel: roundLabel(r), This: r.QuestionID != "" && r.QuestionID == this}
		if r.QuestionID != "" {
			rv.QuestionURL = questionURL(r.QuestionID)
		}
		v.Rounds = append(v.Rounds, rv)
	}
	return v
}

// Thread is a thread's rounds as the dispatcher reports them (client.Thread),
// summarised: what the question page shows under "Thread".
type Thread struct {
	ThreadID string `json:"thread_id"`
	// Status is the latest round's status.
	Status lifecycle.Kind `json:"status"`
	Rounds []Round        `json:"rounds"`
}

// Round is one dispatch of a thread.
type Round struct {
	Round      int            `json:"round"`
	DispatchID string         `json:"dispatch_id"`
	Status     lifecycle.Kind `json:"status"`
	// QuestionID is the question this round asked (needs_input).
	QuestionID string `json:"question_id,omitempty"`
	// Reason and Detail explain a failed or cancelled round.
	Reason lifecycle.Reason `json:"reason,omitempty"`
	Detail string           `json:"detail,omitempty"`
}

// Active reports whether the thread may still change: its latest round has
// not ended, or it waits on a question.
func (t *Thread) Active() bool {
	return !t.Status.Terminal() || t.Status == lifecycle.KindNeedsInput
}

func summarize(th *client.Thread) *Thread {
	out := &Thread{ThreadID: th.ThreadID, Status: th.Status, Rounds: []Round{}}
	for _, r := range th.Rounds {
		rd := Round{Round: r.Round, DispatchID: r.DispatchID, Status: r.Status}
		if res := r.Result; res != nil {
			rd.QuestionID, rd.Reason, rd.Detail = res.QuestionID, res.Reason, res.Detail
		}
		out.Rounds = append(out.Rounds, rd)
	}
	return out
}

// distinct returns the sorted distinct non-empty values of f over qs, plus
// keep (the value selected now).
func distinct(qs []*Question, f func(*Question) string, keep string) []string {
	set := map[string]bool{}
	if keep != "" {
		set[keep] = true
	}
	for _, q := range qs {
		if v := f(q); v != "" {
			set[v] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// with returns the sorted values with keep added (the selected value
// stays a choice when nothing has it any more).
func with(values []string, keep string) []string {
	if keep != "" && !slices.Contains(values, keep) {
		values = append(slices.Clone(values), keep)
		slices.Sort(values)
	}
	return values
}

// selectView is a filter's select.
type selectView struct {
	Name, Label string
	Choices     []choice
}

func newSelect(name, label string, cs []choice) selectView {
	return selectView{Name: name, Label: label, Choices: cs}
}

// choice is one option of a filter's select.
type choice struct {
	Value, Label string
	Selected     bool
}

func choices(values []string, selected string, label func(string) string) []choice {
	out := make([]choice, 0, len(values))
	for _, v := range values {
		l := v
		if label != nil {
			l = label(v)
		}
		out = append(out, choice{Value: v, Label: l, Selected: v == selected})
	}
	return out
}

// answerSnippetRunes is how much of an answer a history row shows.
const answerSnippetRunes = 80
