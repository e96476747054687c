package slack

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	slackapi "github.com/slack-go/slack"

	"github.com/agora-dispatch/agora/internal/answertext"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Slack's Block Kit limits this file respects
// (https://docs.slack.dev/reference/block-kit/blocks).
const (
	maxButtons       = 5    // more options become a static select menu
	maxSelectOptions = 100  // a static select holds at most 100 options
	maxButtonText    = 75   // button and option text
	maxSectionText   = 3000 // a section's text
	maxBlockID       = 255
	maxModalTitle    = 24
)

// Action ids of the message's and modals' elements.
const (
	actionOption  = "option-" // + index: one button per option
	actionSelect  = "select"  // the static select of many options
	actionApprove = "approve"
	actionReject  = "reject" // opens the reject modal
	actionAnswer  = "answer" // opens the free-text modal
	actionInbox   = "inbox"  // the link button; nothing to do

	callbackAnswer = "agora_answer"
	callbackReject = "agora_reject"
	inputBlock     = "agora_input"
	inputAction    = "text"
)

// actionsBlockID names the question a message's buttons answer and what
// the message showed of it: agora|<route>|<question_id>|<shown_digest>
// (docs/slack.md, "Bound answers").
func actionsBlockID(route, qid, shown string) string {
	id := "agora|" + route + "|" + qid
	if shown != "" {
		id += "|" + shown
	}
	return id
}

// parseActionsBlockID reads an actions block id; shown is "" in the
// messages posted before they carried it.
func parseActionsBlockID(id string) (route, qid, shown string, ok bool) {
	rest, ok := strings.CutPrefix(id, "agora|")
	if !ok {
		return "", "", "", false
	}
	route, rest, ok = strings.Cut(rest, "|")
	qid, shown, _ = strings.Cut(rest, "|")
	return route, qid, shown, ok && route != "" && qid != ""
}

// escape makes text safe for mrkdwn: no mention, channel ping or link
// can be smuggled in through a question.
func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// truncate cuts s to at most n characters, marking a cut with "…".
func truncate(s string, n int) (string, bool) {
	if utf8.RuneCountInString(s) <= n {
		return s, false
	}
	r := []rune(s)
	return string(r[:max(n-1, 0)]) + "…", true
}

func plain(s string) *slackapi.TextBlockObject {
	return slackapi.NewTextBlockObject(slackapi.PlainTextType, s, false, false)
}

func mrkdwn(s string) *slackapi.TextBlockObject {
	return slackapi.NewTextBlockObject(slackapi.MarkdownType, s, false, false)
}

// slackDate renders t in each reader's own time zone.
func slackDate(t time.Time) string {
	return fmt.Sprintf("<!date^%d^{date_short_pretty} {time}|%s>", t.Unix(), t.UTC().Format(time.RFC3339))
}

// who renders an answered_by: a Slack user as a mention, anyone else as
// text.
func who(answeredBy string) string {
	if rest, ok := strings.CutPrefix(answeredBy, "slack:"); ok {
		if _, user, ok := strings.Cut(rest, "/"); ok && userIDRE.MatchString(user) {
			return "<@" + user + ">"
		}
	}
	if answeredBy == "" {
		return "someone"
	}
	return "*" + escape(answeredBy) + "*"
}

// left renders a duration as "3h 59m".
func left(d time.Duration) string {
	if d <= 0 {
		return "no time"
	}
	d = d.Round(time.Minute)
	if d < time.Minute {
		return "under a minute"
	}
	h, m := int(d.Hours()), int(d.Minutes())%60
	switch {
	case h == 0:
		return fmt.Sprintf("%dm", m)
	case m == 0:
		return fmt.Sprintf("%dh", h)
	}
	return fmt.Sprintf("%dh %dm", h, m)
}

// inboxLink is the question's page in the inbox, or "".
func (s *Server) inboxLink(qid string) string {
	if s.cfg.InboxURL == "" {
		return ""
	}
	return strings.TrimRight(s.cfg.InboxURL, "/") + "/questions/" + url.PathEscape(qid)
}

// questionBlocks are the blocks every copy of the message keeps: the
// question, its context (plain text, cut), and who asks.
func (s *Server) questionBlocks(q *lifecycle.Question, now time.Time, open bool) []slackapi.Block {
	text, _ := truncate(escape(q.Question), maxSectionText-40)
	blocks := []slackapi.Block{slackapi.NewSectionBlock(mrkdwn(":question: *Question*\n"+text), nil, nil)}
	var cut bool
	if c := strings.TrimSpace(q.Context); c != "" {
		var ctx string
		ctx, cut = truncate(c, s.cfg.ContextChars)
		blocks = append(blocks, slackapi.NewSectionBlock(plain(ctx), nil, nil))
	}
	facts := []string{"sub-agent *" + escape(q.Subagent) + "*", "thread `" + escape(q.ThreadID) + "`", "route *" + escape(q.Route) + "*"}
	if n := threadsWaiting(q); open && n > 1 {
		// One answer resumes every thread waiting on the question
		// (docs/inbox.md, "Asked once").
		facts = append([]string{fmt.Sprintf(":busts_in_silhouette: *asked by %d threads*", n)}, facts...)
	}
	if q.Kind != "" {
		facts = append(facts, escape(string(q.Kind)))
	}
	if open && q.Deadline != nil {
		facts = append(facts, ":hourglass: answer by "+slackDate(*q.Deadline)+" ("+left(q.Deadline.Sub(now))+" left)")
	}
	if link := s.inboxLink(q.QuestionID); link != "" {
		label := "Open in inbox"
		if cut {
			label = "Open in inbox (full context)"
		}
		facts = append(facts, "<"+link+"|"+label+">")
	}
	blocks = append(blocks, slackapi.NewContextBlock("", mrkdwn(strings.Join(facts, " · "))))
	return blocks
}

// threadsWaiting is how many threads wait on q: those its record lists,
// or the asking thread alone.
func threadsWaiting(q *lifecycle.Question) int { return max(1, len(q.WaitingThreads)) }

// pendingSuggestion is the suggestion q waits with, as an answer and a
// decision (approve or reject for an approval); ok is false when there is
// none, or it was accepted (it answered the question).
func pendingSuggestion(q *lifecycle.Question) (answer, decision string, ok bool) {
	sg := q.Suggestion
	if sg == nil || sg.Accepted {
		return "", "", false
	}
	answer, decision = sg.Answer, sg.Decision
	if q.KindIs(lifecycle.QuestionApproval) && decision == "" && (answer == "approve" || answer == "reject") {
		decision = answer
	}
	return answer, decision, true
}

// suggestionBlock shows a pending suggestion: what, by whom, how sure and
// why.
func suggestionBlock(q *lifecycle.Question) slackapi.Block {
	sg := q.Suggestion
	text := ":bulb: Suggested by " + who(sg.By) + ": *" + escape(clipped(answertext.Line(sg.Answer, sg.Decision), 500)) + "*" +
		fmt.Sprintf(" · confidence *%.0f%%*", sg.Confidence*100)
	if r := strings.TrimSpace(sg.Rationale); r != "" {
		text += "\n>" + strings.ReplaceAll(escape(clipped(r, 1500)), "\n", "\n>")
	}
	return slackapi.NewSectionBlock(mrkdwn(text), nil, nil)
}

func clipped(s string, n int) string {
	s, _ = truncate(s, n)
	return s
}

// askedBlocks is the message of a question waiting for an answer. A
// pending suggestion is shown above the controls and preselected: its
// button is the primary one, the menu starts on it, the modal's text box
// holds it.
func (s *Server) askedBlocks(q *lifecycle.Question, now time.Time) []slackapi.Block {
	blocks := s.questionBlocks(q, now, true)
	suggested, decision, hasSuggestion := pendingSuggestion(q)
	if hasSuggestion {
		blocks = append(blocks, suggestionBlock(q))
	}
	var elems []slackapi.BlockElement
	switch {
	case q.KindIs(lifecycle.QuestionApproval):
		approve := slackapi.NewButtonBlockElement(actionApprove, "approve", plain("Approve")).WithStyle(slackapi.StylePrimary)
		reject := slackapi.NewButtonBlockElement(actionReject, "reject", plain("Reject…")).WithStyle(slackapi.StyleDanger)
		if hasSuggestion && decision == "reject" {
			approve.Style, reject.Style = slackapi.StyleDefault, slackapi.StylePrimary
		}
		elems = append(elems, approve, reject)
	case len(q.Options) > 0 && len(q.Options) <= maxButtons:
		for i, o := range q.Options {
			t, _ := truncate(o, maxButtonText)
			b := slackapi.NewButtonBlockElement(actionOption+strconv.Itoa(i), strconv.Itoa(i), plain(t))
			if hasSuggestion && o == suggested {
				b = b.WithStyle(slackapi.StylePrimary)
			}
			elems = append(elems, b)
		}
	case len(q.Options) > maxButtons:
		var opts []*slackapi.OptionBlockObject
		var initial *slackapi.OptionBlockObject
		for i, o := range q.Options[:min(len(q.Options), maxSelectOptions)] {
			t, _ := truncate(o, maxButtonText)
			opt := slackapi.NewOptionBlockObject(strconv.Itoa(i), plain(t), nil)
			if hasSuggestion && o == suggested && initial == nil {
				initial = opt
			}
			opts = append(opts, opt)
		}
		sel := slackapi.NewOptionsSelectBlockElement(slackapi.OptTypeStatic, plain("Choose an answer"), actionSelect, opts...)
		if initial != nil {
			sel = sel.WithInitialOption(initial)
		}
		elems = append(elems, sel)
		if len(q.Options) > maxSelectOptions {
			// The rest cannot be listed: type one of them.
			elems = append(elems, slackapi.NewButtonBlockElement(actionAnswer, "answer", plain("Other option…")))
		}
	default:
		elems = append(elems, slackapi.NewButtonBlockElement(actionAnswer, "answer", plain("Answer…")).WithStyle(slackapi.StylePrimary))
	}
	if id := actionsBlockID(q.Route, q.QuestionID, q.ShownDigest); len(id) <= maxBlockID {
		blocks = append(blocks, slackapi.NewActionBlock(id, elems...))
	} else {
		blocks = append(blocks, slackapi.NewSectionBlock(mrkdwn("_This question's id is too long to answer here: use the inbox._"), nil, nil))
	}
	return blocks
}

// closedBlocks is the message once its question closed or left the
// route: the question, what became of it, no buttons.
func (s *Server) closedBlocks(q *lifecycle.Question, route string) ([]slackapi.Block, string) {
	var line, event string
	switch {
	case q.Status == "answered":
		event = "answered"
		line = ":white_check_mark: Answered"
		if ans := q.Decision; ans != "" {
			line += " *" + escape(ans) + "*"
		} else if q.Answer != "" {
			a, _ := truncate(q.Answer, 500)
			line += " *" + escape(a) + "*"
		}
		line += " by " + who(q.AnsweredBy)
		if q.AnsweredAt != nil {
			line += " at " + slackDate(*q.AnsweredAt)
		}
		if n := len(q.WaitingThreads); n > 1 {
			line += fmt.Sprintf(", for the %d threads waiting", n)
		}
	case q.Status == "expired":
		event = "expired"
		line = ":hourglass: Expired"
		if q.AnsweredAt != nil {
			line += " at " + slackDate(*q.AnsweredAt)
		} else if q.Deadline != nil {
			line += " at " + slackDate(*q.Deadline)
		}
		if q.Answer != "" {
			line += "; the default *" + escape(q.Answer) + "* was used"
		}
	case q.Status == "withdrawn":
		event = "withdrawn"
		line = ":no_entry_sign: Withdrawn"
	case q.Route != route:
		event = "escalated"
		line = ":arrow_right: Moved to route *" + escape(q.Route) + "*"
	default:
		event = q.Status
		line = "Closed: " + escape(q.Status)
	}
	if d := strings.TrimSpace(q.Detail); d != "" && q.Status != "answered" {
		d, _ = truncate(d, 500)
		line += " — " + escape(d)
	}
	qq := *q
	qq.Route = route
	blocks := s.questionBlocks(&qq, time.Now(), false)
	blocks = append(blocks, slackapi.NewSectionBlock(mrkdwn(line), nil, nil))
	return blocks, event
}

// fallbackText is the message's notification text.
func fallbackText(q *lifecycle.Question) string {
	t, _ := truncate("Question from "+q.Subagent+": "+q.Question, 300)
	return t
}

// modal is the free-text answer or the reject comment form.
func modal(callback, title, label string, required bool, meta string, q *lifecycle.Question) slackapi.ModalViewRequest {
	title, _ = truncate(title, maxModalTitle)
	in := slackapi.NewPlainTextInputBlockElement(nil, inputAction)
	in.Multiline = true
	in.MaxLength = 4000
	if answer, _, ok := pendingSuggestion(q); ok && callback == callbackAnswer {
		in.InitialValue = clipped(answer, in.MaxLength)
	}
	input := slackapi.NewInputBlock(inputBlock, plain(label), nil, in)
	input.Optional = !required
	qt, _ := truncate(escape(q.Question), maxSectionText-10)
	return slackapi.ModalViewRequest{
		Type:            slackapi.VTModal,
		Title:           plain(title),
		Submit:          plain("Send"),
		Close:           plain("Cancel"),
		CallbackID:      callback,
		PrivateMetadata: meta,
		Blocks:          slackapi.Blocks{BlockSet: []slackapi.Block{slackapi.NewSectionBlock(mrkdwn(qt), nil, nil), input}},
	}
}
