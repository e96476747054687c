package inbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/microcosm-cc/bluemonday"
	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/extension"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// What a question page shows of the run that asked (docs/inbox.md): the
// context as safe Markdown, the saved partial state, the files it left
// (text and diffs inline, images inline, anything else to download), and
// the thread's latest progress.

// md renders Markdown with raw HTML off (goldmark omits it), then
// sanitises the result: sub-agent text is untrusted.
var (
	md        = goldmark.New(goldmark.WithExtensions(extension.GFM))
	sanitizer = bluemonday.UGCPolicy()
)

// markdown renders a question's context as sanitised HTML.
func markdown(s string) template.HTML {
	var buf bytes.Buffer
	if err := md.Convert([]byte(s), &buf); err != nil {
		return template.HTML(template.HTMLEscapeString(s))
	}
	return template.HTML(sanitizer.SanitizeBytes(buf.Bytes()))
}

// Limits of what a question page shows inline.
const (
	maxStateShown   = 64 << 10
	maxInlineText   = 64 << 10
	maxInlineImage  = 8 << 20
	runDataTimeout  = 2 * time.Second
	inlineArtifacts = 20
)

// runView is what the question page shows of the run that asked.
type runView struct {
	State     string // pretty JSON
	StateCut  bool   // State was cut at maxStateShown
	StateSize string // the whole pretty state's size, for the note when cut
	Artifacts []artifactView
	Skipped   []lifecycle.SkippedArtifact
	Progress  string
}

// artifactView is one file the run left, as the page shows it.
type artifactView struct {
	Name, Type, Size, URL string
	Image                 bool
	Text                  string     // inline text (escaped by the template)
	Diff                  []diffLine // a unified diff, line by line
	Cut                   bool       // the inline text was cut
}

// diffLine is one line of a diff with its class: add, del, hunk, meta or
// "" for context.
type diffLine struct{ Class, Text string }

// runData reads the run's partial state and artifacts and the thread's
// latest progress; what does not answer in time is left out.
func (s *Server) runData(ctx context.Context, q *Question) runView {
	ctx, cancel := context.WithTimeout(ctx, runDataTimeout)
	defer cancel()
	var v runView
	if d, err := s.c.Terminal(ctx, q.DispatchID); err == nil {
		if ni, ok := d.(*lifecycle.NeedsInput); ok {
			state := ni.PartialState
			if ni.PartialStateRef != "" {
				state, _ = s.c.PartialState(ctx, q.DispatchID)
			}
			var n int
			v.State, n = prettyState(state)
			if v.StateCut = n > len(v.State); v.StateCut {
				v.StateSize = humanSize(int64(n))
			}
			v.Skipped = ni.ArtifactsSkipped
			for i, a := range ni.Artifacts {
				v.Artifacts = append(v.Artifacts, s.artifactView(ctx, q, a, i < inlineArtifacts))
			}
		}
	} else {
		s.log.Debug("run data unavailable", "question_id", q.QuestionID, "err", err)
	}
	if it, err := s.c.LatestProgress(ctx, q.ThreadID); err == nil && it != nil && it.Progress.Round >= q.Round {
		p := it.Progress
		v.Progress = fmt.Sprintf("round %d: %s", p.Round, client.ProgressLine(p))
	}
	return v
}

// prettyState indents a partial state for reading, cut at maxStateShown;
// n is the size of the whole indented state, or of the state as stored
// when it is too large to indent whole. The work is bounded by what is
// shown: a state up to maxStateShown is decoded and encoded again (numbers
// kept as written, no HTML escapes: the template escapes, so "<" reads as
// "<"); a larger one is indented as it streams and left once the page has
// enough, however large or deeply nested it is.
func prettyState(raw json.RawMessage) (s string, n int) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return "", 0
	}
	if len(raw) > maxStateShown {
		out, whole := indentPrefix(raw, maxStateShown)
		if whole {
			return out, len(out)
		}
		return clip.Prefix(out, maxStateShown), max(len(raw), maxStateShown+1)
	}
	var buf bytes.Buffer
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if dec.Decode(&v) != nil || enc.Encode(v) != nil {
		buf.Reset()
		buf.Write(raw)
	}
	return clip.Prefix(buf.String(), maxStateShown), buf.Len()
}

// indentPrefix indents raw, a JSON value, two spaces a level as
// json.Indent does, and stops once it has written limit bytes; whole
// reports that it wrote all of raw.
func indentPrefix(raw []byte, limit int) (string, bool) {
	var b strings.Builder
	depth, inString, escaped := 0, false, false
	newline := func() {
		b.WriteByte('\n')
		for range depth {
			b.WriteString("  ")
		}
	}
	for i := 0; i < len(raw); i++ {
		if b.Len() >= limit {
			return b.String(), false
		}
		c := raw[i]
		if inString {
			b.WriteByte(c)
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case ' ', '\t', '\n', '\r':
		case '"':
			inString = true
			b.WriteByte(c)
		case '{', '[':
			b.WriteByte(c)
			// An empty object or array stays on its line.
			j := i + 1
			for j < len(raw) && (raw[j] == ' ' || raw[j] == '\t' || raw[j] == '\n' || raw[j] == '\r') {
				j++
			}
			if j < len(raw) && (raw[j] == '}' || raw[j] == ']') {
				b.WriteByte(raw[j])
				i = j
				continue
			}
			depth++
			newline()
		case '}', ']':
			depth--
			newline()
			b.WriteByte(c)
		case ',':
			b.WriteByte(c)
			newline()
		case ':':
			b.WriteString(": ")
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

func (s *Server) artifactView(ctx context.Context, q *Question, a lifecycle.Artifact, inline bool) artifactView {
	v := artifactView{Name: a.Name, Type: a.ContentType, Size: humanSize(a.Size), URL: artifactURL(q.QuestionID, a.Name)}
	v.Image = inlineImage(a.ContentType) && a.Size <= maxInlineImage
	if !inline || !strings.Contains(a.ContentType, "charset=utf-8") {
		return v
	}
	r, _, err := s.c.OpenArtifact(ctx, q.DispatchID, a.Name)
	if err != nil {
		return v
	}
	defer r.Close()
	b, _ := io.ReadAll(io.LimitReader(r, maxInlineText+1))
	if len(b) > maxInlineText {
		b, v.Cut = b[:maxInlineText], true
	}
	text := strings.ToValidUTF8(string(b), "\uFFFD")
	if strings.HasPrefix(a.ContentType, "text/x-diff") {
		for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
			v.Diff = append(v.Diff, diffLine{Class: diffClass(l), Text: l})
		}
		return v
	}
	v.Text = text
	return v
}

func diffClass(l string) string {
	switch {
	case strings.HasPrefix(l, "+++"), strings.HasPrefix(l, "---"), strings.HasPrefix(l, "diff "), strings.HasPrefix(l, "index "):
		return "meta"
	case strings.HasPrefix(l, "@@"):
		return "hunk"
	case strings.HasPrefix(l, "+"):
		return "add"
	case strings.HasPrefix(l, "-"):
		return "del"
	}
	return ""
}

// inlineImage lists the image types shown in the page; SVG is not among
// them (it can carry script).
func inlineImage(ct string) bool {
	switch ct {
	case "image/png", "image/jpeg", "image/gif", "image/webp":
		return true
	}
	return false
}

func artifactURL(qid, name string) string {
	return questionURL(qid) + "/artifacts/" + (&url.URL{Path: name}).EscapedPath()
}

func humanSize(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

// artifactFile serves one artifact of a question's run to a person allowed
// on its route: an image of a safe type inline, anything else as a
// download; never rendered as a page of the inbox's origin.
func (s *Server) artifactFile(w http.ResponseWriter, r *http.Request, id *identity) {
	q, ok := s.findPage(w, r, id)
	if !ok {
		return
	}
	name := r.PathValue("name")
	rd, a, err := s.c.OpenArtifact(r.Context(), q.DispatchID, name)
	switch {
	case errors.Is(err, client.ErrArtifactExpired):
		s.errorPage(w, r, id, http.StatusGone, "Expired", "This file has expired: files are kept as long as the dispatch's history.")
		return
	case errors.Is(err, client.ErrNotFound), errors.Is(err, client.ErrNotEnded):
		s.errorPage(w, r, id, http.StatusNotFound, "File not found", "The run that asked this question left no file "+name+".")
		return
	case err != nil:
		s.errorPage(w, r, id, http.StatusServiceUnavailable, "File unavailable", err.Error())
		return
	}
	defer rd.Close()
	h := w.Header()
	h.Set("Content-Type", a.ContentType)
	h.Set("Content-Length", fmt.Sprint(a.Size))
	h.Set("Content-Security-Policy", "default-src 'none'; sandbox")
	h.Set("Cache-Control", "private, max-age=300")
	disp := "attachment"
	if inlineImage(a.ContentType) {
		disp = "inline"
	}
	h.Set("Content-Disposition", fmt.Sprintf("%s; filename=%q", disp, path.Base(name)))
	_, _ = io.Copy(w, rd)
}

// declineForm sends the question to its route's fallback, with a reason.
func (s *Server) declineForm(w http.ResponseWriter, r *http.Request, id *identity) {
	q, ok := s.findPage(w, r, id)
	if !ok {
		return
	}
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	var opts []client.AnswerOption
	if s.routes != nil {
		opts = append(opts, client.AnswerVia(q.Route))
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), answerTimeout)
	defer cancel()
	rep, err := s.c.Decline(ctx, q.QuestionID, id.user.name, reason, opts...)
	var ae *client.AnswerError
	var notice, kind string
	status := http.StatusOK
	switch {
	case err == nil:
		s.log.Info("question declined", "question_id", q.QuestionID, "by", id.user.name, "reason", reason)
		// The router has written the record (the decline is in its
		// history) before replying; once the watch shows that write, the
		// route says whether the question moved.
		wctx, wcancel := context.WithTimeout(ctx, settleWait)
		seen := s.store.waitUntil(wctx, q.QuestionID, func(x *Question) bool { return x == nil || x.Revision > q.Revision })
		wcancel()
		now, ok := s.store.get(q.QuestionID)
		switch {
		case seen && ok && now.Pending() && now.Route == q.Route:
			// No fallback took it: say so plainly, it still waits here.
			notice, kind = "Your decline is recorded, but nobody else takes this question: "+rep.Reason+".", "warn"
		default:
			notice, kind = "You declined this question: "+rep.Reason+".", "ok"
		}
	case errors.As(err, &ae):
		notice, kind, status = refusal(ae.Reply), "warn", replyStatus(ae.Reply.Status)
	default:
		notice, kind, status = "The decline did not get through ("+err.Error()+"). Nothing changed: try again.", "error", http.StatusServiceUnavailable
	}
	if now, ok := s.lookup(r.Context(), q.QuestionID); ok {
		q = now
	}
	d := s.questionData(r.Context(), id, q)
	d.Notice, d.NoticeKind = notice, kind
	v := s.baseView(id, clip.Line(q.Question.Question, 60))
	v.Data = d
	s.render(w, status, "question", v)
}
