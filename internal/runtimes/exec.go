package runtimes

import (
	"errors"
	"slices"

	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// execSpec is the exec runtime's entry in the registry: it runs no CLI of
// its own.
var execSpec = Spec{Name: subagent.RuntimeExec, New: func(string) runtime.Runtime { return Exec{} }}

// Exec runs the definition's command line as it is; the run learns the
// convention from its environment (AGORA_NEEDS_INPUT_FILE and the rest).
type Exec struct{}

// Command implements runtime.Runtime.
func (Exec) Command(inv runtime.Invocation) (runtime.Command, error) {
	return runtime.Command{Args: slices.Clone(inv.Definition.Command)}, nil
}

// Validate implements runtime.Validator.
func (Exec) Validate(def subagent.Definition) error {
	if len(def.Command) == 0 {
		return errors.New("runtime exec needs a command")
	}
	return nil
}
