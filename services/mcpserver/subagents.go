package mcpserver

import (
	"context"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/pkg/client"
)

// SubagentList is agora_subagents' result.
type SubagentList struct {
	Subagents []SubagentItem `json:"subagents"`
}

// SubagentItem is one sub-agent definition, as an orchestrator needs it.
type SubagentItem struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Runtime     string `json:"runtime"`
	Timeout     string `json:"timeout"`
	MaxRounds   int    `json:"max_rounds"`
}

func (t *tools) subagents(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, *SubagentList, error) {
	all, err := t.s.c.Subagents(ctx)
	var ue *client.UndecodableError
	if err != nil && !errors.As(err, &ue) {
		return nil, nil, t.explain(err)
	}
	out := &SubagentList{Subagents: []SubagentItem{}}
	for _, sa := range all {
		d := sa.Definition
		out.Subagents = append(out.Subagents, SubagentItem{Name: sa.Name, Description: d.Description, Runtime: d.Runtime,
			Timeout: d.TimeoutDuration().String(), MaxRounds: d.Rounds()})
	}
	return nil, out, nil
}
