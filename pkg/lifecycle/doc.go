// Package lifecycle defines Agora's wire contract: the CloudEvents that flow
// on every stream (dispatch requests, the six lifecycle kinds, question and
// answer events), their data types, the NATS subjects they travel on, and the
// codec that maps an event to and from a NATS message in CloudEvents binary
// content mode.
//
// The vocabulary is closed: producers emit only the kinds and failure reasons
// declared here, and [Parse] answers [ErrUnknownType] for anything else so a
// consumer can log and skip it.
//
// All functions are safe for concurrent use.
package lifecycle
