// Package statedigest names a question's partial state by digest, as the
// shown digest of a question and the decision log's entries carry it
// (docs/audit.md, "Bound answers"): never the state itself.
package statedigest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/audit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Of is the digest of a partial state: of its JSON (compacted) when it
// travelled inline, or, for a large state kept in agora_state under ref,
// the object's own SHA-256; "unavailable:<ref>" when that object cannot
// be read, "" when there is none.
func Of(ctx context.Context, js jetstream.JetStream, state json.RawMessage, ref string) string {
	if len(state) > 0 && string(state) != "null" {
		var b bytes.Buffer
		if err := json.Compact(&b, state); err != nil {
			return audit.Digest(state)
		}
		return audit.Digest(b.Bytes())
	}
	if ref == "" {
		return ""
	}
	unavailable := "unavailable:" + ref
	obs, err := js.ObjectStore(ctx, lifecycle.BucketState)
	if err != nil {
		return unavailable
	}
	info, err := obs.GetInfo(ctx, ref)
	if err != nil {
		return unavailable
	}
	// The object store names it SHA-256=<base64url>.
	sum, err := base64.URLEncoding.DecodeString(strings.TrimPrefix(info.Digest, "SHA-256="))
	if err != nil {
		return unavailable
	}
	return "sha256:" + hex.EncodeToString(sum)
}
