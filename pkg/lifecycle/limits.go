package lifecycle

// Size limits of a dispatch request, enforced by the dispatcher at every
// door and checked by clients before they send one, since a request over
// them can never be accepted.
const (
	// MaxRequestBytes bounds a whole dispatch request as sent (the server's
	// default max payload is 1 MB, and the queued request grows a little).
	MaxRequestBytes = 900 << 10
	// MaxInputBytes bounds a request's input object.
	MaxInputBytes = 512 << 10
)
