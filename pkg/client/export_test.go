package client

import "time"

// SetOrderedInactive sets the inactive threshold of the client's ordered
// consumers and returns the previous one. Call it before any watch starts.
func SetOrderedInactive(d time.Duration) time.Duration {
	old := orderedInactive
	orderedInactive = d
	return old
}
