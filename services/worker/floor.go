package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// The operator's floor, enforced again where the sub-agent would run
// (docs/sandbox.md, "The operator's floor"). The dispatcher refuses a
// request whose definition is below the floor; a worker checks once more,
// so that a definition stored after acceptance, a floor raised meanwhile,
// a dispatcher configured with a lower floor or a work message published
// by something other than the dispatcher never runs below this worker's
// floor.

// belowFloor returns the failed rejected event of a delivery whose
// definition is below the worker's floor, naming each setting that would
// allow it; nil when the definition may run.
func (s *Service) belowFloor(j *job, def subagent.Definition) *lifecycle.Failed {
	var fe *subagent.FloorError
	if !errors.As(def.Sandbox.CheckFloor(s.cfg.Floor()), &fe) {
		return nil
	}
	detail := fmt.Sprintf("sub-agent %q (revision %d) is below the operator's sandbox floor: %s", def.Name, j.req.SubagentRevision, fe.Error())
	j.log.Warn("refused: the definition is below the operator's sandbox floor", "detail", detail)
	return &lifecycle.Failed{Common: j.common, Reason: lifecycle.ReasonRejected, Detail: clip.String(detail, 1024), BelowFloor: floorProblems(fe.Problems)}
}

// floorProblems bounds the settings a refusal names: the definition is
// the sub-agent author's text, and the event reaches logs and screens.
func floorProblems(ps []string) []string {
	const maxProblems, maxBytes = 16, 512
	out := make([]string, 0, min(len(ps), maxProblems))
	for _, p := range ps[:min(len(ps), maxProblems)] {
		out = append(out, clip.String(p, maxBytes))
	}
	return out
}

// runTimeout is how long a run may take: the request's timeout when it is
// shorter than the definition's, else the definition's. A request can only
// shorten it (the dispatcher refuses a root asking for more); the worker
// holds to that whatever the work message says, and so does the CPU time
// limit it defaults to.
func runTimeout(def subagent.Definition, req *lifecycle.Request) time.Duration {
	t := def.TimeoutDuration()
	if d, err := time.ParseDuration(req.Timeout); err == nil && d > 0 && d < t {
		return d
	}
	return t
}
