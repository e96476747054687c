package mcpserver

import (
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Servers whose sessions ended are forgotten: neither the count's map
// nor the array behind a principal's slice keeps them reachable.
func TestSessionCountForgetsEndedServers(t *testing.T) {
	c := &sessionCount{m: map[string][]*mcp.Server{}}
	impl := &mcp.Implementation{Name: "test", Version: "1"}
	for range 8 {
		c.add("alice", mcp.NewServer(impl, nil))
	}
	all := c.m["alice"]
	if n := c.live("alice"); n != 0 {
		t.Fatalf("%d sessions live, want 0", n)
	}
	if _, ok := c.m["alice"]; ok {
		t.Error("a principal with no session open is still in the map")
	}
	for i, srv := range all[:cap(all)] {
		if srv != nil {
			t.Fatalf("server %d, with no session, is still held", i)
		}
	}
}
