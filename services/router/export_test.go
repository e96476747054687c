package router

// SetFanoutStep sets the function called before each joined question of a
// fan-out (nil: none). Call it before starting routers, and again with nil
// after they stopped.
func SetFanoutStep(f func(mid string)) { fanoutStep = f }
