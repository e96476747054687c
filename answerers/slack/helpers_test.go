package slack_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/answerers/slack"
	"github.com/agora-dispatch/agora/harness/systemtest"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

const (
	botToken      = "xoxb-test-token"
	signingSecret = "8f742231b10e8888abcd99yyyzzz85a5"
	team          = "T0AGORA"
	appToken      = "xapp-1-test-app-token"
)

// call is one Web API call the fake received, as Slack would read it.
type call struct {
	Method string
	Form   url.Values     // form-encoded calls
	JSON   map[string]any // JSON calls (views.open)
	At     time.Time
}

// fakeSlack is an httptest fake of the Slack Web API: it checks every
// call's bearer token, HTTP method and payload shape against Slack's
// documented limits, keeps the messages posted, and can fail on demand.
type fakeSlack struct {
	t   *testing.T
	srv *httptest.Server

	mu       sync.Mutex
	calls    []call
	messages map[string]*postedMessage // by ts
	seq      int
	// failures are the status codes to answer the next calls of a
	// method with (0 ends the list early); 429s carry Retry-After: 1.
	failures map[string][]int

	// Socket Mode: envelopes to send on the WebSocket, acks received.
	envelopes chan []byte
	acks      chan map[string]any
}

// postedMessage is a message as it is in the fake's channel now.
type postedMessage struct {
	Channel string
	TS      string
	Text    string
	Blocks  []map[string]any
	Updates int
}

func newFakeSlack(t *testing.T) *fakeSlack {
	t.Helper()
	f := &fakeSlack{t: t, messages: map[string]*postedMessage{}, failures: map[string][]int{},
		envelopes: make(chan []byte, 8), acks: make(chan map[string]any, 8)}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeSlack) url() string { return f.srv.URL + "/api/" }

func (f *fakeSlack) fail(method string, codes ...int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures[method] = codes
}

func (f *fakeSlack) serve(w http.ResponseWriter, r *http.Request) {
	method := strings.TrimPrefix(r.URL.Path, "/api/")
	switch r.URL.Path {
	case "/api/apps.connections.open":
		f.openSocket(w, r)
		return
	case "/socket":
		f.socket(w, r)
		return
	}
	bad := func(format string, a ...any) {
		f.t.Errorf("slack fake: %s: "+format, append([]any{method}, a...)...)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error": "invalid_arguments"})
	}
	if r.Method != http.MethodPost {
		bad("HTTP method %s, want POST", r.Method)
		return
	}
	if got := r.Header.Get("Authorization"); got != "Bearer "+botToken {
		f.t.Errorf("slack fake: %s: Authorization %q, want the bot token as a bearer token", method, got)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error": "not_authed"})
		return
	}
	body, _ := io.ReadAll(r.Body)
	c := call{Method: method, At: time.Now()}
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch ct {
	case "application/x-www-form-urlencoded":
		c.Form, _ = url.ParseQuery(string(body))
		if c.Form.Has("token") {
			bad("the token travels in the body as well")
			return
		}
	case "application/json":
		if err := json.Unmarshal(body, &c.JSON); err != nil {
			bad("body is not JSON: %v", err)
			return
		}
	default:
		bad("Content-Type %q", r.Header.Get("Content-Type"))
		return
	}
	f.mu.Lock()
	f.calls = append(f.calls, c)
	var code int
	if fl := f.failures[method]; len(fl) > 0 {
		code, f.failures[method] = fl[0], fl[1:]
	}
	f.mu.Unlock()
	switch code {
	case 0:
	case http.StatusTooManyRequests:
		w.Header().Set("Retry-After", "1")
		http.Error(w, "rate limited", code)
		return
	default:
		http.Error(w, "<html>down</html>", code)
		return
	}
	var reply map[string]any
	var problem string
	switch method {
	case "chat.postMessage":
		reply, problem = f.postMessage(c.Form)
	case "chat.update":
		reply, problem = f.update(c.Form)
	case "chat.postEphemeral":
		problem = need(c.Form, "channel", "user", "text")
		reply = map[string]any{"ok": true, "message_ts": "1700000000.999999"}
	case "views.open":
		problem = checkView(c.JSON)
		reply = map[string]any{"ok": true, "view": map[string]any{"id": "V0VIEW"}}
	default:
		problem = "unexpected method"
	}
	if problem != "" {
		bad("%s", problem)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(reply)
}

func need(form url.Values, keys ...string) string {
	for _, k := range keys {
		if form.Get(k) == "" {
			return "missing " + k
		}
	}
	return ""
}

func (f *fakeSlack) postMessage(form url.Values) (map[string]any, string) {
	blocks, p := checkMessage(form, "channel", "text", "blocks")
	if p != "" {
		return nil, p
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	ts := fmt.Sprintf("1700000000.%06d", f.seq)
	ch := form.Get("channel")
	if strings.HasPrefix(ch, "U") {
		ch = "D" + ch[1:] // a direct message lands in the bot's DM channel
	}
	f.messages[ts] = &postedMessage{Channel: ch, TS: ts, Text: form.Get("text"), Blocks: blocks}
	return map[string]any{"ok": true, "channel": ch, "ts": ts, "message": map[string]any{"text": form.Get("text"), "ts": ts}}, ""
}

func (f *fakeSlack) update(form url.Values) (map[string]any, string) {
	blocks, p := checkMessage(form, "channel", "ts", "text", "blocks")
	if p != "" {
		return nil, p
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.messages[form.Get("ts")]
	if !ok || m.Channel != form.Get("channel") {
		return map[string]any{"ok": false, "error": "message_not_found"}, ""
	}
	m.Text, m.Blocks = form.Get("text"), blocks
	m.Updates++
	return map[string]any{"ok": true, "channel": m.Channel, "ts": m.TS, "text": m.Text}, ""
}

// checkMessage checks a chat.postMessage or chat.update form: keys are
// present and its blocks keep a message's limits.
func checkMessage(form url.Values, keys ...string) ([]map[string]any, string) {
	if p := need(form, keys...); p != "" {
		return nil, p
	}
	return checkBlocks(form.Get("blocks"), 50)
}

// checkBlocks checks blocks against Block Kit's documented limits.
func checkBlocks(raw string, maxBlocks int) ([]map[string]any, string) {
	var blocks []map[string]any
	if err := json.Unmarshal([]byte(raw), &blocks); err != nil {
		return nil, "blocks is not a JSON array: " + err.Error()
	}
	if len(blocks) == 0 || len(blocks) > maxBlocks {
		return nil, fmt.Sprintf("%d blocks", len(blocks))
	}
	text := func(v any, types string, limit int) string {
		o, ok := v.(map[string]any)
		if !ok {
			return "text object missing"
		}
		typ, _ := o["type"].(string)
		s, _ := o["text"].(string)
		switch {
		case !strings.Contains(types, typ):
			return "text type " + typ
		case s == "":
			return "empty text"
		case len([]rune(s)) > limit:
			return fmt.Sprintf("text of %d characters, limit %d", len([]rune(s)), limit)
		}
		return ""
	}
	for _, b := range blocks {
		if id, _ := b["block_id"].(string); len(id) > 255 {
			return nil, "block_id over 255 characters"
		}
		switch b["type"] {
		case "section":
			if p := text(b["text"], "plain_text mrkdwn", 3000); p != "" {
				return nil, "section: " + p
			}
		case "context":
			els, _ := b["elements"].([]any)
			if len(els) == 0 || len(els) > 10 {
				return nil, "context elements"
			}
			for _, e := range els {
				if p := text(e, "plain_text mrkdwn", 3000); p != "" {
					return nil, "context: " + p
				}
			}
		case "actions":
			els, _ := b["elements"].([]any)
			if len(els) == 0 || len(els) > 25 {
				return nil, "actions elements"
			}
			ids := map[string]bool{}
			for _, e := range els {
				el := e.(map[string]any)
				id, _ := el["action_id"].(string)
				if id == "" || len(id) > 255 || ids[id] {
					return nil, "action_id missing, long or repeated: " + id
				}
				ids[id] = true
				switch el["type"] {
				case "button":
					if p := text(el["text"], "plain_text", 75); p != "" {
						return nil, "button: " + p
					}
					if v, _ := el["value"].(string); len(v) > 2000 {
						return nil, "button value over 2000"
					}
				case "static_select":
					opts, _ := el["options"].([]any)
					if len(opts) == 0 || len(opts) > 100 {
						return nil, fmt.Sprintf("static_select with %d options", len(opts))
					}
					for _, o := range opts {
						om := o.(map[string]any)
						if p := text(om["text"], "plain_text", 75); p != "" {
							return nil, "option: " + p
						}
						if v, _ := om["value"].(string); v == "" || len(v) > 150 {
							return nil, "option value empty or over 150"
						}
					}
				default:
					return nil, fmt.Sprintf("unexpected element %v", el["type"])
				}
			}
		case "input":
			if p := text(b["label"], "plain_text", 2000); p != "" {
				return nil, "input label: " + p
			}
			if _, ok := b["element"].(map[string]any); !ok {
				return nil, "input without element"
			}
		default:
			return nil, fmt.Sprintf("unexpected block type %v", b["type"])
		}
	}
	return blocks, ""
}

// checkView checks a views.open body.
func checkView(body map[string]any) string {
	if tr, _ := body["trigger_id"].(string); tr == "" {
		return "missing trigger_id"
	}
	v, ok := body["view"].(map[string]any)
	if !ok {
		return "missing view"
	}
	if v["type"] != "modal" {
		return "view type is not modal"
	}
	for k, limit := range map[string]int{"title": 24, "submit": 24, "close": 24} {
		o, _ := v[k].(map[string]any)
		s, _ := o["text"].(string)
		if o["type"] != "plain_text" || s == "" || len([]rune(s)) > limit {
			return "view " + k + " is not plain_text of 1-24 characters"
		}
	}
	if m, _ := v["private_metadata"].(string); len(m) > 3000 {
		return "private_metadata over 3000"
	}
	if c, _ := v["callback_id"].(string); c == "" || len(c) > 255 {
		return "callback_id"
	}
	raw, _ := json.Marshal(v["blocks"])
	if _, p := checkBlocks(string(raw), 100); p != "" {
		return "view blocks: " + p
	}
	return ""
}

func (f *fakeSlack) callsOf(method string) []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []call
	for _, c := range f.calls {
		if c.Method == method {
			out = append(out, c)
		}
	}
	return out
}

// message returns the one message posted to channel (a copy).
func (f *fakeSlack) messageIn(channel string) (postedMessage, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.messages {
		if m.Channel == channel {
			return *m, true
		}
	}
	return postedMessage{}, false
}

// actions returns the message's actions block: its block_id and elements.
func (m postedMessage) actions() (string, []map[string]any) {
	for _, b := range m.Blocks {
		if b["type"] == "actions" {
			var els []map[string]any
			for _, e := range b["elements"].([]any) {
				els = append(els, e.(map[string]any))
			}
			return b["block_id"].(string), els
		}
	}
	return "", nil
}

// all is the message's text, blocks included, for matching.
func (m postedMessage) all() string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(m.Blocks)
	return m.Text + "\n" + b.String()
}

// sign signs body as Slack does: v0=hex(HMAC-SHA256(secret, "v0:<ts>:<body>")).
func sign(secret string, ts int64, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(mac, "v0:%d:", ts)
	mac.Write(body)
	return "v0=" + hex.EncodeToString(mac.Sum(nil))
}

// interaction is a signed interactivity request, as Slack sends it.
type interaction struct {
	body      []byte
	signature string
	ts        int64
}

func newInteraction(payload any, secret string, at time.Time) interaction {
	p, _ := json.Marshal(payload)
	body := []byte(url.Values{"payload": {string(p)}}.Encode())
	return interaction{body: body, ts: at.Unix(), signature: sign(secret, at.Unix(), body)}
}

func (it interaction) send(t *testing.T, base string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+slack.InteractionsPath, bytes.NewReader(it.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Slack-Request-Timestamp", strconv.FormatInt(it.ts, 10))
	req.Header.Set("X-Slack-Signature", it.signature)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// click is the block_actions payload of user pressing element el of
// message m.
func click(m postedMessage, user string, el map[string]any) map[string]any {
	blockID, _ := m.actions()
	act := map[string]any{
		"type": el["type"], "action_id": el["action_id"], "block_id": blockID, "action_ts": "1700000001.000001",
	}
	if el["type"] == "button" {
		act["value"], act["text"] = el["value"], el["text"]
	}
	return map[string]any{
		"type": "block_actions", "api_app_id": "A0AGORA", "token": "legacy-verification-token",
		"team":         map[string]any{"id": team, "domain": "agora"},
		"user":         map[string]any{"id": user, "username": strings.ToLower(user), "name": strings.ToLower(user), "team_id": team},
		"container":    map[string]any{"type": "message", "message_ts": m.TS, "channel_id": m.Channel, "is_ephemeral": false},
		"channel":      map[string]any{"id": m.Channel, "name": "agora"},
		"message":      map[string]any{"type": "message", "ts": m.TS, "text": m.Text},
		"trigger_id":   "13345224609.738474920.8088930838d88f008e0",
		"response_url": "https://hooks.slack.com/actions/T0AGORA/1/abc",
		"actions":      []any{act},
	}
}

// selectClick is the block_actions payload of choosing option value in
// the message's static select.
func selectClick(m postedMessage, user, value string) map[string]any {
	p := click(m, user, map[string]any{"type": "static_select", "action_id": "select"})
	act := p["actions"].([]any)[0].(map[string]any)
	act["selected_option"] = map[string]any{"text": map[string]any{"type": "plain_text", "text": "x"}, "value": value}
	return p
}

// submission is the view_submission payload of user sending the modal
// opened with views.open body v, with text typed in its input.
func submission(v map[string]any, user, text string) map[string]any {
	view := v["view"].(map[string]any)
	return map[string]any{
		"type": "view_submission", "api_app_id": "A0AGORA", "token": "legacy-verification-token",
		"team":       map[string]any{"id": team, "domain": "agora"},
		"user":       map[string]any{"id": user, "username": strings.ToLower(user), "name": strings.ToLower(user), "team_id": team},
		"trigger_id": "13345224609.738474920.8088930838d88f008e1",
		"view": map[string]any{
			"id": "V0VIEW", "type": "modal", "callback_id": view["callback_id"], "private_metadata": view["private_metadata"],
			"state": map[string]any{"values": map[string]any{"agora_input": map[string]any{"text": map[string]any{"type": "plain_text_input", "value": text}}}},
		},
	}
}

// world is the real Agora, the fake Slack and the answerer between them.
type world struct {
	*systemtest.System
	slack *fakeSlack
	s     *slack.Server
	http  *httptest.Server
	reg   *prometheus.Registry
	o     worldOptions
}

type worldOptions struct {
	routes     string // the routing file
	settings   string // the Slack settings file
	attempts   int
	beforeRun  func(*fakeSlack)
	contextLen int
	manual     bool   // start no answerer: the test runs its own
	appToken   string // Socket Mode
}

func startWorld(t *testing.T, o worldOptions) *world {
	t.Helper()
	sys := systemtest.Start(t, systemtest.Options{Routes: o.routes, WorkerConcurrency: 2})
	f := newFakeSlack(t)
	if o.beforeRun != nil {
		o.beforeRun(f)
	}
	w := &world{System: sys, slack: f, o: o}
	if o.manual {
		return w
	}
	w.s, w.reg = w.newAnswerer(t)
	w.http = httptest.NewServer(w.s.Handler())
	t.Cleanup(w.http.Close)
	sys.Go("slack answerer", w.s.Run)
	w.ready(t, w.s)
	return w
}

// newAnswerer builds a Slack answerer on its own connection and
// registry.
func (w *world) newAnswerer(t *testing.T) (*slack.Server, *prometheus.Registry) {
	t.Helper()
	settings := filepath.Join(t.TempDir(), "slack.yaml")
	if err := os.WriteFile(settings, []byte(w.o.settings), 0o600); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := slack.New(slack.Config{
		BotToken: botToken, SigningSecret: signingSecret, SettingsFile: settings, APIURL: w.slack.url(),
		InboxURL: "https://agora.example.com/inbox", PostAttempts: w.o.attempts, RetryBackoff: 20 * time.Millisecond,
		ShutdownTimeout: 2 * time.Second, ContextChars: w.o.contextLen, AppToken: w.o.appToken,
	}, slack.Deps{Conn: w.Server.Conn(t), Logger: systemtest.Logger(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return s, reg
}

func (w *world) ready(t *testing.T, s *slack.Server) {
	t.Helper()
	select {
	case <-s.Ready():
	case <-time.After(time.Minute):
		t.Fatal("the slack answerer was not ready within a minute")
	}
}

// eventually polls cond every 20ms until it holds or d passes.

// asks registers a sub-agent that asks sentinel in round 0 and, resumed,
// copies its input to its output.
func (w *world) asks(name, sentinel string) {
	w.Shell(name, `if [ "$AGORA_ROUND" = "0" ]; then printf '%s' '`+sentinel+`' > "$AGORA_NEEDS_INPUT_FILE"; else cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"; fi`)
}

// dispatch starts name and waits for its question to be posted in
// channel; it returns the thread and the message.
func (w *world) dispatch(t *testing.T, name, channel string, labels map[string]string) (*client.Dispatch, postedMessage) {
	t.Helper()
	d, err := w.Client.Dispatch(t.Context(), lifecycle.Request{Subagent: name, Input: json.RawMessage(`{"task":"t"}`), Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	var m postedMessage
	testkit.Eventually(t, time.Minute, "the question's message in "+channel, func() bool {
		var ok bool
		m, ok = w.slack.messageIn(channel)
		return ok
	})
	return d, m
}

// updated waits for the message in channel to be updated (what names the
// message in the failure) and returns it.
func (w *world) updated(t *testing.T, channel, what string) postedMessage {
	t.Helper()
	var m postedMessage
	testkit.Eventually(t, 30*time.Second, what+" to be updated", func() bool {
		m, _ = w.slack.messageIn(channel)
		return m.Updates > 0
	})
	return m
}

// question returns the thread's one question record.
func (w *world) question(t *testing.T, threadID string) lifecycle.Question {
	t.Helper()
	qs, err := w.Client.Questions(t.Context(), client.QuestionFilter{ThreadID: threadID})
	if err != nil || len(qs) != 1 {
		t.Fatalf("questions of %s = %+v, %v", threadID, qs, err)
	}
	return qs[0]
}

func waitThread(t *testing.T, c *client.Client, threadID string) lifecycle.Data {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	end, err := c.Follow(ctx, threadID, nil)
	if err != nil {
		t.Fatal(err)
	}
	return end.Data
}

// openSocket is apps.connections.open: it needs the app-level token.
func (f *fakeSlack) openSocket(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.Method != http.MethodPost || r.Header.Get("Authorization") != "Bearer "+appToken {
		f.t.Errorf("slack fake: apps.connections.open: %s with Authorization %q", r.Method, r.Header.Get("Authorization"))
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error": "invalid_auth"})
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "url": "ws" + strings.TrimPrefix(f.srv.URL, "http") + "/socket"})
}

// socket is the Socket Mode WebSocket: hello, then the test's envelopes;
// acknowledgements go to f.acks.
func (f *fakeSlack) socket(w http.ResponseWriter, r *http.Request) {
	conn, err := (&websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}).Upgrade(w, r, nil)
	if err != nil {
		f.t.Logf("slack fake: websocket upgrade: %v", err)
		return
	}
	defer conn.Close()
	hello := `{"type":"hello","num_connections":1,"debug_info":{"host":"fake","approximate_connection_time":3600},"connection_info":{"app_id":"A0AGORA"}}`
	if conn.WriteMessage(websocket.TextMessage, []byte(hello)) != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			var ack map[string]any
			if err := conn.ReadJSON(&ack); err != nil {
				return
			}
			f.acks <- ack
		}
	}()
	for {
		select {
		case <-done:
			return
		case env := <-f.envelopes:
			if conn.WriteMessage(websocket.TextMessage, env) != nil {
				return
			}
		}
	}
}
