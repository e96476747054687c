package router

// SetFanoutStep sets the function called before each joined question of a
// fan-out (nil: none). Call it before starting routers, and again with nil
// after they stopped.
func SetFanoutStep(f func(mid string)) { fanoutStep = f }

// SetMaxWaitingThreads sets how many threads one question lists at most
// and returns the previous bound. Call it before starting routers.
func SetMaxWaitingThreads(n int) int {
	old := maxWaitingThreads
	maxWaitingThreads = n
	return old
}

// SetSeatStep sets the function called as a joined question is about to
// be listed on the question it joined (nil: none); an error it returns
// fails the listing. Call it before starting routers, and again with nil
// after they stopped.
func SetSeatStep(f func(qid string) error) { seatStep = f }
