package inbox

import (
	"github.com/agora-dispatch/agora/internal/buildinfo"
	"strings"

	"github.com/nats-io/nats.go/micro"
)

// ServiceName is the NATS micro service a running inbox registers, with
// its public URL in the metadata key "url", so clients find where people
// answer: `nats micro info agora-inbox`, or the CLI's printed links. See
// docs/inbox.md.
const ServiceName = "agora-inbox"

// announce registers ServiceName with url; the returned func removes it.
// The service has no endpoints: micro's own PING and INFO subjects carry
// the metadata.
func (s *Server) announce(url string) (func(), error) {
	svc, err := micro.AddService(s.nc, micro.Config{
		Name:        ServiceName,
		Version:     buildinfo.Version(),
		Description: "Agora's web inbox, where people answer questions",
		Metadata:    map[string]string{"url": strings.TrimRight(url, "/")},
	})
	if err != nil {
		return func() {}, err
	}
	return func() { _ = svc.Stop() }, nil
}
