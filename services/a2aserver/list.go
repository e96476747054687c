package a2aserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/principal"
)

// Listing tasks (docs/a2a.md, "Listing tasks"): every task started
// through this door is indexed under task.<principal>.<task id> in the
// A2A bucket; ListTasks reads the caller's keys (every key for a
// principal that sees all) and derives each task from its thread, as
// GetTask does.

// maxListed bounds the tasks one ListTasks call reads: the newest ones.
const maxListed = 1000

// ownerToken is the key token of a principal's name (a name need not be
// a NATS token).
func ownerToken(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:12])
}

// index records that who started task id.
func (s *Service) index(ctx context.Context, who *principal.Principal, id a2a.TaskID) error {
	kv, err := s.bucket(ctx)
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, "task."+ownerToken(who.Name)+"."+string(id), []byte(who.Name)); err != nil {
		return fmt.Errorf("a2aserver: index task %s: %w", id, err)
	}
	return nil
}

// List implements taskstore.Store: the caller's tasks started through
// this door, newest first, filtered as the request asks and paged by task
// id.
func (st *store) List(ctx context.Context, req *a2a.ListTasksRequest) (*a2a.ListTasksResponse, error) {
	who := principalOf(ctx)
	if who == nil {
		return nil, a2a.ErrUnauthenticated
	}
	size := req.PageSize
	switch {
	case size == 0:
		size = 50
	case size < 0 || size > 100:
		return nil, invalid("pageSize %d: want 1 to 100", req.PageSize)
	}
	ids, err := st.s.listed(ctx, who)
	if err != nil {
		return nil, err
	}
	res := &a2a.ListTasksResponse{Tasks: []*a2a.Task{}, PageSize: size}
	for _, id := range ids {
		th, err := st.s.thread(ctx, who, id)
		if errors.Is(err, a2a.ErrTaskNotFound) {
			continue // its records expired
		}
		if err != nil {
			return nil, err
		}
		t, err := st.s.taskOf(ctx, th)
		if err != nil {
			return nil, err
		}
		if !matches(t, req) {
			continue
		}
		res.TotalSize++
		if (req.PageToken != "" && id >= req.PageToken) || len(res.Tasks) > size {
			continue
		}
		if !req.IncludeArtifacts {
			t.Artifacts = nil
		}
		if n := req.HistoryLength; n != nil && *n >= 0 && *n < len(t.History) {
			t.History = t.History[len(t.History)-*n:]
		}
		res.Tasks = append(res.Tasks, t)
	}
	if len(res.Tasks) > size {
		res.Tasks = res.Tasks[:size]
		res.NextPageToken = string(res.Tasks[size-1].ID)
	}
	return res, nil
}

// matches reports whether t passes the request's filters.
func matches(t *a2a.Task, req *a2a.ListTasksRequest) bool {
	switch {
	case req.ContextID != "" && t.ContextID != req.ContextID:
		return false
	case req.Status != "" && t.Status.State != req.Status:
		return false
	case req.StatusTimestampAfter != nil && (t.Status.Timestamp == nil || !t.Status.Timestamp.After(*req.StatusTimestampAfter)):
		return false
	}
	return true
}

// listed is the ids of the tasks who may list, newest first (task ids
// are UUIDv7, ordered by time), at most maxListed.
func (s *Service) listed(ctx context.Context, who *principal.Principal) ([]string, error) {
	kv, err := s.bucket(ctx)
	if err != nil {
		return nil, unavailable(err)
	}
	filter := "task." + ownerToken(who.Name) + ".*"
	if who.Admin || who.SeeAll {
		filter = "task.*.*"
	}
	keys, err := kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, nil
		}
		return nil, unavailable(err)
	}
	var ids []string
	for k := range keys.Keys() {
		ids = append(ids, k[strings.LastIndexByte(k, '.')+1:])
	}
	slices.Sort(ids)
	slices.Reverse(ids)
	if len(ids) > maxListed {
		ids = ids[:maxListed]
	}
	return ids, nil
}
