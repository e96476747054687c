package slack

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	slackapi "github.com/slack-go/slack"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// replayWindow is how long a signature is remembered: longer than the
// five minutes a timestamp is accepted either side of now.
const replayWindow = 11 * time.Minute

// replays remembers the signatures of accepted requests, so the same
// signed request is accepted once. It is per process: with several
// replicas behind a load balancer a replay could reach another replica,
// where it is a repeated answer the router refuses as already answered.
type replays struct {
	mu        sync.Mutex
	seen      map[string]time.Time
	lastPrune time.Time
}

func newReplays() *replays { return &replays{seen: map[string]time.Time{}} }

// first records sig and reports whether it was new.
func (r *replays) first(sig string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.Sub(r.lastPrune) > time.Minute {
		for k, t := range r.seen {
			if now.Sub(t) > replayWindow {
				delete(r.seen, k)
			}
		}
		r.lastPrune = now
	}
	if _, ok := r.seen[sig]; ok {
		return false
	}
	r.seen[sig] = now
	return true
}

// maxPayload bounds an interactivity request's body.
const maxPayload = 1 << 20

// interactions serves Slack's interactivity requests: it checks the
// signature, then handles button clicks (block_actions) and modal
// submissions (view_submission).
func (s *Server) interactions(w http.ResponseWriter, r *http.Request) {
	select {
	case <-s.ready:
	default:
		http.Error(w, "starting", http.StatusServiceUnavailable)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPayload))
	if err != nil {
		http.Error(w, "body too large or unreadable", http.StatusBadRequest)
		return
	}
	// slack.NewSecretsVerifier does what Slack documents: HMAC-SHA256 of
	// "v0:<timestamp>:<raw body>" with the signing secret, compared in
	// constant time with the hex of X-Slack-Signature, and a timestamp
	// within five minutes of now (docs/slack.md).
	sv, err := slackapi.NewSecretsVerifier(r.Header, s.cfg.SigningSecret)
	if err == nil {
		_, _ = sv.Write(body)
		err = sv.Ensure()
	}
	if err != nil {
		reason := "signature"
		if errors.Is(err, slackapi.ErrExpiredTimestamp) {
			reason = "stale"
		}
		s.refuse(w, r, reason, err)
		return
	}
	if !s.replays.first(r.Header.Get("X-Slack-Signature"), time.Now()) {
		s.refuse(w, r, "replay", errors.New("signature seen before"))
		return
	}
	form, err := url.ParseQuery(string(body))
	if err != nil || form.Get("payload") == "" {
		http.Error(w, "want a form with a payload", http.StatusBadRequest)
		return
	}
	var cb slackapi.InteractionCallback
	if err := json.Unmarshal([]byte(form.Get("payload")), &cb); err != nil {
		http.Error(w, "payload is not an interaction", http.StatusBadRequest)
		return
	}
	reply := s.interact(r.Context(), &cb)
	if reply == nil {
		w.WriteHeader(http.StatusOK)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(reply)
}

// interact handles one authenticated interaction, from HTTP or Socket
// Mode, and returns what to reply to Slack: nil for an empty
// acknowledgement, or a response payload (a modal's errors).
func (s *Server) interact(ctx context.Context, cb *slackapi.InteractionCallback) any {
	switch cb.Type {
	case slackapi.InteractionTypeBlockActions:
		s.blockActions(cb)
	case slackapi.InteractionTypeViewSubmission:
		return s.viewSubmission(ctx, cb)
	}
	return nil
}

func (s *Server) refuse(w http.ResponseWriter, r *http.Request, reason string, err error) {
	s.metrics.refused.WithLabelValues(reason).Inc()
	s.log.Warn("interactivity request refused", "reason", reason, "err", err, "remote", r.RemoteAddr)
	http.Error(w, "invalid request signature", http.StatusUnauthorized)
}

// clicker is who acted, and where.
type clicker struct {
	team, user, name, channel string
}

func (c clicker) answeredBy() string { return "slack:" + c.team + "/" + c.user }

func clickerOf(cb *slackapi.InteractionCallback) clicker {
	return clicker{
		team: cmp.Or(cb.Team.ID, cb.User.TeamID), user: cb.User.ID, name: cmp.Or(cb.User.Name, cb.User.Username),
		channel: cmp.Or(cb.Channel.ID, cb.Container.ChannelID),
	}
}

// modalMeta is a modal's private_metadata: the question it answers.
type modalMeta struct {
	Route      string `json:"route"`
	QuestionID string `json:"question_id"`
	Channel    string `json:"channel,omitempty"`
	// ShownDigest is the shown digest of the message the modal was
	// opened from.
	ShownDigest string `json:"shown_digest,omitempty"`
}

// blockActions lets a click be acknowledged at once (Slack wants a reply
// within three seconds) and does the work after, on a goroutine Run
// waits for.
func (s *Server) blockActions(cb *slackapi.InteractionCallback) {
	if len(cb.ActionCallback.BlockActions) == 0 {
		return
	}
	act := *cb.ActionCallback.BlockActions[0]
	route, qid, shown, ok := parseActionsBlockID(act.BlockID)
	if !ok || act.ActionID == actionInbox {
		return
	}
	who, trigger := clickerOf(cb), cb.TriggerID
	s.goWork(func(ctx context.Context) {
		s.click(ctx, clickOn{route: route, qid: qid, shown: shown}, who, trigger, act)
	})
}

// clickOn is the question a click answers, as its message showed it.
type clickOn struct {
	route, qid string
	shown      string // the message's shown digest; "" on older messages
}

func (s *Server) click(ctx context.Context, on clickOn, c clicker, trigger string, act slackapi.BlockAction) {
	route, qid := on.route, on.qid
	log := s.log.With("route", route, "question_id", qid, "slack_user", c.user, "slack_team", c.team, "action", act.ActionID)
	rs, served := s.settings.Routes[route]
	if !served {
		s.ephemeral(ctx, c, "This answerer no longer serves route "+route+".")
		return
	}
	if !rs.allows(c.user) {
		s.metrics.refused.WithLabelValues("not_allowed").Inc()
		log.Warn("click by a user outside the route's allow-list: refused")
		s.ephemeral(ctx, c, "You are not on the list of people who may answer questions on route "+route+"; nothing was answered.")
		return
	}
	q, err := s.record(ctx, qid)
	if err != nil {
		log.Warn("question record unreadable", "err", err)
		s.ephemeral(ctx, c, "Agora could not be reached; nothing was answered. Try again in a moment.")
		return
	}
	// Bound to what the message showed (its options among it), not to
	// what the record holds now (docs/slack.md, "Bound answers").
	a := lifecycle.Answer{AnsweredBy: c.answeredBy(), ShownDigest: on.shown}
	switch {
	case act.ActionID == actionApprove:
		a.Answer, a.Decision = "approve", "approve"
	case act.ActionID == actionReject || act.ActionID == actionAnswer:
		if msg := closedText(q, route); msg != "" {
			s.ephemeral(ctx, c, msg)
			s.enqueue(qid)
			return
		}
		if on.shown != "" && on.shown != q.ShownDigest {
			// The modal would show the question as it stands, and its
			// answer would be bound to what the message showed.
			s.ephemeral(ctx, c, changedText)
			s.enqueue(qid)
			return
		}
		meta, _ := json.Marshal(modalMeta{Route: route, QuestionID: qid, Channel: c.channel, ShownDigest: on.shown})
		v := modal(callbackAnswer, "Answer", "Your answer", true, string(meta), q)
		if act.ActionID == actionReject {
			v = modal(callbackReject, "Reject", "Why? (goes to the sub-agent)", true, string(meta), q)
		}
		err := s.api.call(ctx, "views.open", 2, func(ctx context.Context) error {
			_, err := s.api.c.OpenViewContext(ctx, trigger, v)
			return err
		})
		if err != nil {
			log.Warn("modal not opened", "err", err)
			s.ephemeral(ctx, c, "The answer form could not be opened; try again, or answer in the inbox.")
		}
		return
	case strings.HasPrefix(act.ActionID, actionOption) || act.ActionID == actionSelect:
		v := act.Value
		if act.ActionID == actionSelect {
			v = act.SelectedOption.Value
		}
		i, err := strconv.Atoi(v)
		if err != nil || i < 0 || i >= len(q.Options) {
			s.ephemeral(ctx, c, "That option is not one of the question's; nothing was answered.")
			return
		}
		a.Answer = q.Options[i]
	default:
		return
	}
	rep, err := s.submit(ctx, route, qid, a)
	log.Info("answer from Slack", "display_name", c.name, "status", statusOf(rep, err), "err", err)
	if msg := refusalText(err); msg != "" {
		s.ephemeral(ctx, c, msg)
	}
	s.enqueue(qid)
}

// viewSubmission answers with a modal's text. It replies after the router
// did (well within Slack's three seconds): a refusal is shown in the
// modal itself; nil closes the modal.
func (s *Server) viewSubmission(ctx context.Context, cb *slackapi.InteractionCallback) any {
	var meta modalMeta
	if cb.View.CallbackID != callbackAnswer && cb.View.CallbackID != callbackReject ||
		json.Unmarshal([]byte(cb.View.PrivateMetadata), &meta) != nil || meta.QuestionID == "" {
		return nil
	}
	c := clickerOf(cb)
	log := s.log.With("route", meta.Route, "question_id", meta.QuestionID, "slack_user", c.user, "slack_team", c.team)
	rs, served := s.settings.Routes[meta.Route]
	if !served || !rs.allows(c.user) {
		s.metrics.refused.WithLabelValues("not_allowed").Inc()
		log.Warn("modal submitted by a user outside the route's allow-list: refused")
		return modalErrors("You may not answer questions on route " + meta.Route + ".")
	}
	var text string
	if cb.View.State != nil {
		text = strings.TrimSpace(cb.View.State.Values[inputBlock][inputAction].Value)
	}
	a := lifecycle.Answer{AnsweredBy: c.answeredBy(), Answer: text, ShownDigest: meta.ShownDigest}
	if cb.View.CallbackID == callbackReject {
		a = lifecycle.Answer{AnsweredBy: c.answeredBy(), Answer: "reject", Decision: "reject", Comment: text, ShownDigest: meta.ShownDigest}
	}
	sctx, cancel := context.WithTimeout(ctx, 2500*time.Millisecond)
	rep, err := s.submit(sctx, meta.Route, meta.QuestionID, a)
	cancel()
	log.Info("answer from Slack", "display_name", c.name, "status", statusOf(rep, err), "err", err)
	s.enqueue(meta.QuestionID)
	if msg := refusalText(err); msg != "" {
		return modalErrors(msg)
	}
	return nil // closes the modal
}

// modalErrors is the reply that shows msg under the modal's input
// (response_action errors).
func modalErrors(msg string) any {
	msg, _ = truncate(msg, 300)
	return map[string]any{"response_action": "errors", "errors": map[string]string{inputBlock: msg}}
}

// submit sends an answer through the route's endpoint.
func (s *Server) submit(ctx context.Context, route, qid string, a lifecycle.Answer) (*client.AnswerReply, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	a.Door = lifecycle.DoorSlack
	rep, err := s.c.Answer(ctx, qid, a, client.AnswerVia(route))
	s.metrics.answers.WithLabelValues(statusOf(rep, err)).Inc()
	return rep, err
}

func statusOf(rep *client.AnswerReply, err error) string {
	var ae *client.AnswerError
	switch {
	case err == nil && rep != nil:
		return string(rep.Status)
	case errors.As(err, &ae):
		return string(ae.Reply.Status)
	}
	return "error"
}

// changedText tells a person their answer was not taken because the
// question changed after the message showed it.
const changedText = "Not answered: this question changed after this message showed it (reworded, or asked anew). Look at the question again and answer what it asks now."

// refusalText tells a person why their answer did not count; "" when it
// was accepted.
func refusalText(err error) string {
	if err == nil {
		return ""
	}
	var ae *client.AnswerError
	if !errors.As(err, &ae) {
		return "Agora could not be reached; nothing was answered. Try again in a moment."
	}
	rep := ae.Reply
	switch rep.Status {
	case client.AnswerAlreadyAnswered:
		if rep.AnsweredBy != "" && rep.AnsweredAt != nil {
			return "Already answered by " + who(rep.AnsweredBy) + " at " + slackDate(*rep.AnsweredAt) + "; your answer was not used."
		}
		return "Not answered: " + escape(rep.Reason)
	case client.AnswerInvalid:
		return "Not accepted: " + escape(rep.Reason)
	case client.AnswerChanged:
		return changedText
	case client.AnswerNotFound:
		return "Agora no longer knows this question."
	}
	return "Agora is busy; nothing was answered. Try again in a moment."
}

// closedText is what a person who opens a form on a question that no
// longer waits on route is told; "" while it waits.
func closedText(q *lifecycle.Question, route string) string {
	switch {
	case q.Status == "answered" && q.AnsweredAt != nil:
		return "Already answered by " + who(q.AnsweredBy) + " at " + slackDate(*q.AnsweredAt) + "."
	case q.Status == "expired":
		return "This question expired."
	case q.Status == "withdrawn":
		return "This question was withdrawn."
	case q.Status != "asked":
		return "This question is " + q.Status + "."
	case q.Route != route:
		return "This question moved to route " + q.Route + "."
	}
	return ""
}

// ephemeral shows text to the person who acted, in the channel of the
// message.
func (s *Server) ephemeral(ctx context.Context, c clicker, text string) {
	if c.channel == "" || c.user == "" {
		return
	}
	err := s.api.call(ctx, "chat.postEphemeral", 3, func(ctx context.Context) error {
		_, err := s.api.c.PostEphemeralContext(ctx, c.channel, c.user, slackapi.MsgOptionText(text, false))
		return err
	})
	if err != nil {
		s.log.Warn("ephemeral message not sent", "channel", c.channel, "slack_user", c.user, "err", err)
	}
}
