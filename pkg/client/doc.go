// Package client is the Go SDK of Agora: dispatch work to sub-agents, wait
// for it (across the rounds of a thread that stops to ask questions), watch
// lifecycle events, cancel, read status, list questions and answer them.
//
// A Client talks to Agora only through NATS: the dispatcher's NATS micro
// endpoints (agora.api.dispatch, .cancel, .status), the router's
// agora.api.answer (or agora.api.answer.<route>, see [AnswerVia]), ordered
// consumers on the AGORA_LIFECYCLE stream and the
// agora_questions key-value bucket. It also defines the JSON documents those
// endpoints and the dispatcher's HTTP API exchange: the dispatch [Record],
// the [Thread] view, the RFC 9457 [Problem] returned for a refused request
// and the [AnswerReply] of agora.api.answer.
//
// A Client is safe for concurrent use by multiple goroutines.
package client
