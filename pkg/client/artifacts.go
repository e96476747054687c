package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// ErrNotEnded is returned for the artifacts of a dispatch that has no
// terminal event yet: they are listed when it ends.
var ErrNotEnded = errors.New("client: the dispatch has not ended")

// ErrArtifactExpired is returned for an artifact its dispatch lists that
// the store no longer holds: it outlived the retention of agora_artifacts
// (the lifecycle history's, 7 days by default).
var ErrArtifactExpired = errors.New("client: the artifact has expired")

// ErrArtifactCorrupt is returned by a Read of an artifact whose bytes do
// not hash to the digest its dispatch lists.
var ErrArtifactCorrupt = errors.New("client: the artifact does not match its listed sha256")

// Artifacts lists the files a dispatch's run left (see docs/artifacts.md):
// uploaded ones and those skipped, as its terminal event records them. It
// returns ErrNotEnded while the dispatch runs and ErrNotFound for an
// unknown dispatch; a dispatch that ended without a run (cancelled while
// queued, say) has none.
func (c *Client) Artifacts(ctx context.Context, dispatchID string) (lifecycle.Outputs, error) {
	d, err := c.Terminal(ctx, dispatchID)
	if err != nil {
		return lifecycle.Outputs{}, err
	}
	if o := lifecycle.RunOutputs(d); o != nil {
		return *o, nil
	}
	return lifecycle.Outputs{}, nil
}

// terminalData reads a dispatch's terminal event from AGORA_LIFECYCLE.
func (c *Client) terminalData(ctx context.Context, threadID, dispatchID string) (lifecycle.Data, error) {
	filter := lifecycle.LifecycleFilter("", threadID, dispatchID)
	var terminal lifecycle.Data
	err := c.readKept(ctx, lifecycle.StreamLifecycle, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}}, "events of "+dispatchID, func(m jetstream.Msg) bool {
		if _, _, d, ok := decode(m); ok {
			if l, ok := d.(lifecycle.Lifecycle); ok && l.LifecycleKind().Terminal() {
				terminal = d
				return false
			}
		}
		return true
	})
	switch {
	case err != nil:
		return nil, err
	case terminal == nil:
		return nil, ErrNotEnded
	}
	return terminal, nil
}

// OpenArtifact opens one artifact of a dispatch by its listed name for
// reading, streamed from agora_artifacts; the caller closes it. Its Read
// returns ErrArtifactCorrupt at the end when the bytes do not hash to the
// listed sha256. It returns ErrNotFound for a name the dispatch does not
// list and ErrArtifactExpired for one the store no longer holds.
func (c *Client) OpenArtifact(ctx context.Context, dispatchID, name string) (io.ReadCloser, lifecycle.Artifact, error) {
	outs, err := c.Artifacts(ctx, dispatchID)
	if err != nil {
		return nil, lifecycle.Artifact{}, err
	}
	var a lifecycle.Artifact
	for _, x := range outs.Artifacts {
		if x.Name == name {
			a = x
		}
	}
	if a.Name == "" {
		return nil, a, fmt.Errorf("%w: dispatch %s lists no artifact %q", ErrNotFound, dispatchID, name)
	}
	obs, err := c.js.ObjectStore(ctx, lifecycle.BucketArtifacts)
	if err != nil {
		return nil, a, fmt.Errorf("client: object store %s: %w", lifecycle.BucketArtifacts, err)
	}
	r, err := obs.Get(ctx, a.Ref)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, a, fmt.Errorf("%w: %s of dispatch %s", ErrArtifactExpired, name, dispatchID)
	}
	if err != nil {
		return nil, a, fmt.Errorf("client: artifact %s: %w", a.Ref, err)
	}
	return &verifying{r: r, h: sha256.New(), want: a.SHA256, size: a.Size}, a, nil
}

// verifying hashes what is read and checks the digest at the end.
type verifying struct {
	r    jetstream.ObjectResult
	h    hash.Hash
	want string
	size int64
	n    int64
}

func (v *verifying) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	if errors.Is(err, io.EOF) && (v.n != v.size || hex.EncodeToString(v.h.Sum(nil)) != v.want) {
		return n, ErrArtifactCorrupt
	}
	return n, err
}

func (v *verifying) Close() error { return v.r.Close() }
