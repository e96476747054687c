package a2aserver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/agora-dispatch/agora/internal/buildinfo"
	"github.com/agora-dispatch/agora/pkg/client"
)

// bearerScheme names the security scheme of the card: the HTTP API's
// bearer token.
const bearerScheme a2a.SecuritySchemeName = "bearerAuth"

// Media types of the parts the agent takes and gives.
const (
	mediaText = "text/plain"
	mediaJSON = "application/json"
)

// cardHandler serves the public agent card, read afresh from the
// registered sub-agents on every request: Agora's, or with one (the
// request's {name}), that sub-agent's alone.
func (s *Service) cardHandler(one bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		endpoint, name := s.publicURL(r)+Path, ""
		if one {
			name = r.PathValue("name")
			endpoint += agentsPath + name
		}
		card, err := s.card(r.Context(), endpoint, name)
		if errors.Is(err, errNoSkill) {
			http.Error(w, "no sub-agent "+name+": "+CardPath+" lists them", http.StatusNotFound)
			return
		}
		if err != nil {
			s.log.Error("a2a agent card", "err", err)
			http.Error(w, "the sub-agents could not be read: is NATS reachable?", http.StatusServiceUnavailable)
			return
		}
		b, err := json.Marshal(card)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(b)
	})
}

// errNoSkill is card's error for a sub-agent that is not registered.
var errNoSkill = errors.New("a2aserver: no such skill")

// card is the agent card for an agent reached at endpoint: every
// registered sub-agent a skill (or only the one called only, when set),
// both bindings at the same URL, and the bearer scheme when callers
// authenticate.
func (s *Service) card(ctx context.Context, endpoint, only string) (*a2a.AgentCard, error) {
	subs, err := s.c.Subagents(ctx)
	var ue *client.UndecodableError
	if err != nil && !errors.As(err, &ue) {
		return nil, err
	}
	card := &a2a.AgentCard{
		Name:        "Agora",
		Description: "Agora's sub-agents. Pick one by its skill id in the message's metadata.skill; a sub-agent that needs input asks (input-required) and resumes with the answer sent on the same task.",
		Version:     buildinfo.Version(),
		SupportedInterfaces: []*a2a.AgentInterface{
			a2a.NewAgentInterface(endpoint, a2a.TransportProtocolJSONRPC),
			a2a.NewAgentInterface(endpoint, a2a.TransportProtocolHTTPJSON),
		},
		Capabilities:       s.capabilities(),
		DefaultInputModes:  []string{mediaText, mediaJSON},
		DefaultOutputModes: []string{mediaJSON, mediaText},
		DocumentationURL:   "https://github.com/agora-dispatch/agora/blob/main/docs/a2a.md",
		Skills:             []a2a.AgentSkill{},
	}
	for _, sa := range subs {
		if only != "" && sa.Name != only {
			continue
		}
		d := sa.Definition
		card.Skills = append(card.Skills, a2a.AgentSkill{
			ID:          sa.Name,
			Name:        sa.Name,
			Description: cmp.Or(d.Description, "Agora sub-agent "+sa.Name+" ("+d.Runtime+" runtime)"),
			Tags:        []string{"agora", d.Runtime},
			InputModes:  []string{mediaText, mediaJSON},
			OutputModes: []string{mediaJSON},
		})
	}
	if only != "" {
		if len(card.Skills) == 0 {
			return nil, errNoSkill
		}
		card.Name, card.Description = "Agora: "+only, card.Skills[0].Description+" (an Agora sub-agent: a question it asks comes as input-required; answer on the same task.)"
	}
	if s.owned() {
		card.SecuritySchemes = a2a.NamedSecuritySchemes{bearerScheme: a2a.HTTPAuthSecurityScheme{
			Scheme:      "Bearer",
			Description: "The HTTP API's bearer token: one of AGORA_API_TOKENS, or a principal's of AGORA_PRINCIPALS_FILE (the same token as /v1).",
		}}
		card.SecurityRequirements = a2a.SecurityRequirementsOptions{{bearerScheme: a2a.SecuritySchemeScopes{}}}
	}
	return card, nil
}
