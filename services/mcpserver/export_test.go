package mcpserver

import "time"

// SealForTest seals a request state with s's key, as ask would, so tests
// can make states that are expired or bound to another principal.
func SealForTest(s *Service, principal, threadID, questionID, kind string, expires time.Time) (string, error) {
	return s.seal.seal(state{ID: newStateID(), Principal: principal, ThreadID: threadID, QuestionID: questionID, Kind: kind, Expires: expires})
}
