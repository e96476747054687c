package audit

import (
	"bufio"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Header is the first line of an export: what it holds. It has no hash
// and is not an entry; a verifier reads from it whether the export is
// the whole log or a selection.
type Header struct {
	// Export is the export format's version, 1.
	Export int `json:"agora_audit_export"`
	// Complete is true when the export holds every entry from seq 1 to
	// the head; false for a filtered export.
	Complete bool `json:"complete"`
	// Filter says what a filtered export selected (route=…, thread=…,
	// since=…).
	Filter string `json:"filter,omitempty"`
}

// Problem kinds, as Problem.What names them.
const (
	ProblemMalformed = "malformed" // not an entry
	ProblemAltered   = "altered"   // an entry's content or hash changed
	ProblemRemoved   = "removed"   // entries are missing
	ProblemInserted  = "inserted"  // an entry that is not part of the chain
	ProblemReordered = "reordered" // an entry out of its place
	ProblemSignature = "signature" // a checkpoint's signature does not verify
)

// Problem is the first thing wrong with an export: the line (1-based, the
// header counting) and seq of the entry it names, and what.
type Problem struct {
	Line   int
	Seq    int64
	What   string
	Detail string
}

func (p *Problem) Error() string {
	return fmt.Sprintf("audit: line %d, entry seq %d %s: %s", p.Line, p.Seq, p.What, p.Detail)
}

// Report is what a verified export holds.
type Report struct {
	Complete    bool   // the export is the whole log (its header says so)
	Filter      string // a filtered export's selection
	Entries     int    // entries, checkpoints included
	Checkpoints int
	Signed      int   // checkpoints whose signature verified
	FirstSeq    int64 // of the first entry
	LastSeq     int64 // of the last entry
	HeadHash    string
	// LastSigned is the seq of the last checkpoint whose signature
	// verified; entries after it are vouched for by the chain alone.
	LastSigned int64
}

// VerifyOptions tune Verify.
type VerifyOptions struct {
	// PublicKey, when set, must have signed every signed checkpoint;
	// without it signatures are not checked.
	PublicKey ed25519.PublicKey
	// RequireSigned, with PublicKey, makes an unsigned checkpoint a
	// problem.
	RequireSigned bool
}

type line struct {
	n   int
	e   Entry
	obj map[string]any
}

// Verify reads an export (a Header line, then one entry per line) and
// checks it: every entry's hash against its content; in a complete
// export, that seq runs 1, 2, 3, … and each prev_hash is the hash of the
// entry before, from Genesis; in a filtered one, the same link wherever
// two exported entries are consecutive (a filtered export proves each
// entry unaltered against its own hash and its order where contiguous,
// not that nothing was left out); and every checkpoint's head_hash and
// count, and its signature when opts has a key. It returns the first
// Problem as the error, naming the entry that was altered, removed,
// inserted or reordered as far as the chain tells them apart.
func Verify(r io.Reader, opts VerifyOptions) (Report, error) {
	var rep Report
	lines, hdr, err := readLines(r)
	if err != nil {
		return rep, err
	}
	rep.Complete, rep.Filter = hdr.Complete, hdr.Filter
	byHash := map[string]int{}   // hash → index in lines
	linkedBy := map[string]int{} // prev_hash → how many entries name it
	bySeq := map[int64][]int{}
	for i, l := range lines {
		h, err := HashObject(l.obj)
		if err != nil {
			return rep, &Problem{l.n, l.e.Seq, ProblemMalformed, err.Error()}
		}
		if h != l.e.Hash {
			return rep, &Problem{l.n, l.e.Seq, ProblemAltered, "its content does not match its hash"}
		}
		byHash[l.e.Hash] = i
		linkedBy[l.e.PrevHash]++
		bySeq[l.e.Seq] = append(bySeq[l.e.Seq], i)
	}
	for i, l := range lines {
		if p := link(lines, i, hdr.Complete, byHash, linkedBy, bySeq); p != nil {
			return rep, p
		}
		if l.e.Kind == KindCheckpoint {
			rep.Checkpoints++
			if p := checkpoint(l, opts); p != nil {
				return rep, p
			}
			if opts.PublicKey != nil && l.e.Signature != "" {
				rep.Signed++
				rep.LastSigned = l.e.Seq
			}
		}
	}
	rep.Entries = len(lines)
	if len(lines) > 0 {
		rep.FirstSeq, rep.LastSeq, rep.HeadHash = lines[0].e.Seq, lines[len(lines)-1].e.Seq, lines[len(lines)-1].e.Hash
	}
	return rep, nil
}

func readLines(r io.Reader) ([]line, Header, error) {
	var hdr Header
	var lines []line
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	n := 0
	for sc.Scan() {
		n++
		b := sc.Bytes()
		if strings.TrimSpace(string(b)) == "" {
			continue
		}
		obj, err := decodeObject(b)
		if err != nil {
			return nil, hdr, &Problem{Line: n, What: ProblemMalformed, Detail: err.Error()}
		}
		if _, ok := obj["agora_audit_export"]; ok && n == 1 {
			if err := json.Unmarshal(b, &hdr); err != nil {
				return nil, hdr, &Problem{Line: n, What: ProblemMalformed, Detail: "header: " + err.Error()}
			}
			continue
		}
		e, err := Parse(b)
		if err != nil || e.Hash == "" || e.Kind == "" || e.Seq < 1 {
			return nil, hdr, &Problem{Line: n, Seq: e.Seq, What: ProblemMalformed, Detail: "not an entry (want seq, kind, prev_hash and hash)"}
		}
		lines = append(lines, line{n: n, e: e, obj: obj})
	}
	if err := sc.Err(); err != nil {
		return nil, hdr, fmt.Errorf("audit: read export: %w", err)
	}
	if n == 0 {
		return nil, hdr, errors.New("audit: empty export")
	}
	if hdr.Export == 0 {
		// No header: a bare copy of the stream, which is the whole log.
		hdr.Complete = true
	}
	return lines, hdr, nil
}

// link checks entry i against the one before it and, on a break, says
// which entry the break names and how.
func link(lines []line, i int, complete bool, byHash, linkedBy map[string]int, bySeq map[int64][]int) *Problem {
	e := lines[i].e
	n := lines[i].n
	if i == 0 {
		switch {
		case complete && e.Seq != 1:
			return &Problem{n, e.Seq, ProblemRemoved, fmt.Sprintf("the log starts at seq %d: entries 1 to %d are missing", e.Seq, e.Seq-1)}
		case e.Seq == 1 && e.PrevHash != Genesis:
			return &Problem{n, e.Seq, ProblemAltered, "the first entry's prev_hash is not the genesis hash"}
		}
		return nil
	}
	p := lines[i-1].e
	if e.Seq == p.Seq+1 && e.PrevHash == p.Hash {
		return nil
	}
	if !complete && e.Seq > p.Seq+1 {
		return nil // a selection skips entries; nothing links them
	}
	// An entry nobody links to, in the middle of the log, that the chain
	// runs around, was inserted.
	orphan := func(j int) bool { return j < len(lines)-1 && linkedBy[lines[j].e.Hash] == 0 }
	if i >= 2 && orphan(i-1) && e.PrevHash == lines[i-2].e.Hash {
		return &Problem{lines[i-1].n, p.Seq, ProblemInserted, fmt.Sprintf("no entry links to it; seq %d links past it to seq %d", e.Seq, lines[i-2].e.Seq)}
	}
	if _, known := byHash[e.PrevHash]; !known && orphan(i) && lines[i+1].e.PrevHash == p.Hash {
		return &Problem{n, e.Seq, ProblemInserted, fmt.Sprintf("it links to no entry and none links to it; seq %d links past it to seq %d", lines[i+1].e.Seq, p.Seq)}
	}
	switch {
	case e.Seq > p.Seq+1:
		if later := bySeq[p.Seq+1]; len(later) > 0 && later[0] > i {
			l := lines[later[0]]
			return &Problem{l.n, l.e.Seq, ProblemReordered, fmt.Sprintf("it belongs after seq %d (line %d) and is found at line %d", p.Seq, lines[i-1].n, l.n)}
		}
		return &Problem{n, e.Seq, ProblemRemoved, fmt.Sprintf("entries %d to %d are missing before it (after seq %d)", p.Seq+1, e.Seq-1, p.Seq)}
	case e.Seq <= p.Seq:
		return &Problem{n, e.Seq, ProblemReordered, fmt.Sprintf("it follows seq %d (line %d); it belongs earlier", p.Seq, lines[i-1].n)}
	}
	// Consecutive seqs, broken link: one side was rewritten (and its hash
	// recomputed).
	return &Problem{lines[i-1].n, p.Seq, ProblemAltered, fmt.Sprintf("entry seq %d links to a different hash: this entry (or that link) was rewritten", e.Seq)}
}

func checkpoint(l line, opts VerifyOptions) *Problem {
	e := l.e
	switch {
	case e.HeadHash != e.PrevHash:
		return &Problem{l.n, e.Seq, ProblemAltered, "checkpoint head_hash is not its prev_hash"}
	case e.Count != e.Seq-1:
		return &Problem{l.n, e.Seq, ProblemAltered, fmt.Sprintf("checkpoint count %d, want %d", e.Count, e.Seq-1)}
	case opts.PublicKey == nil:
		return nil
	case e.Signature == "":
		if opts.RequireSigned {
			return &Problem{l.n, e.Seq, ProblemSignature, "checkpoint is not signed"}
		}
		return nil
	case e.KeyID != KeyID(opts.PublicKey) || !checkSignature(e, opts.PublicKey):
		return &Problem{l.n, e.Seq, ProblemSignature, "checkpoint signature does not verify with the public key: the chain up to it was rewritten, or it was signed by another key"}
	}
	return nil
}
