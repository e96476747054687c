package audit_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/pkg/audit"
)

// chain builds a log of n entries with a signed checkpoint as entry 4,
// returning its lines (no header) and the key.
func chain(t *testing.T, n int) ([][]byte, ed25519.PublicKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var lines [][]byte
	var prev *audit.Entry
	for i := range n {
		e := &audit.Entry{Kind: audit.KindAsked, At: "2026-01-02T03:04:05Z", QuestionID: "q-" + string(rune('a'+i)),
			Route: "human", ThreadID: "t1", Comment: "<b>&</b> \u2028 ünï \x01 \"q\" \\", CursorQuestions: int64(i + 1)}
		e.Link(prev)
		if e.Seq == 4 {
			*e = audit.Entry{Kind: audit.KindCheckpoint, At: e.At, Seq: e.Seq, PrevHash: e.PrevHash, HeadHash: e.PrevHash, Count: e.Seq - 1}
			audit.Sign(e, priv)
		}
		b, err := e.Seal()
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, b)
		prev = e
	}
	return lines, pub
}

func export(lines [][]byte) []byte {
	var b bytes.Buffer
	b.WriteString(`{"agora_audit_export":1,"complete":true}` + "\n")
	for _, l := range lines {
		b.Write(l)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func TestVerifyIntact(t *testing.T) {
	lines, pub := chain(t, 7)
	rep, err := audit.Verify(bytes.NewReader(export(lines)), audit.VerifyOptions{PublicKey: pub, RequireSigned: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Entries != 7 || rep.Checkpoints != 1 || rep.Signed != 1 || rep.LastSigned != 4 || rep.LastSeq != 7 || !rep.Complete {
		t.Fatalf("report %+v", rep)
	}
}

// edit changes entry seq's comment, optionally recomputing its hash.
func edit(t *testing.T, line []byte, rehash bool) []byte {
	t.Helper()
	e, err := audit.Parse(line)
	if err != nil {
		t.Fatal(err)
	}
	e.Comment = "approved"
	if rehash {
		b, err := e.Seal()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	b, _ := json.Marshal(e)
	return b
}

func forged(t *testing.T, seq int64, prevHash string) []byte {
	t.Helper()
	e := audit.Entry{Kind: audit.KindAnswered, At: "2026-01-02T03:04:05Z", Seq: seq, PrevHash: prevHash, QuestionID: "q-x", AnsweredBy: "mallory"}
	b, err := e.Seal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestVerifyNamesTheTampering(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, l [][]byte) [][]byte
		what   string
		seq    int64
		line   int // 1-based, the header being line 1
	}{
		{"edited", func(t *testing.T, l [][]byte) [][]byte { l[2] = edit(t, l[2], false); return l }, audit.ProblemAltered, 3, 4},
		{"edited and rehashed", func(t *testing.T, l [][]byte) [][]byte { l[1] = edit(t, l[1], true); return l }, audit.ProblemAltered, 2, 3},
		{"deleted", func(t *testing.T, l [][]byte) [][]byte { return append(l[:2:2], l[3:]...) }, audit.ProblemRemoved, 4, 4},
		{"deleted first", func(t *testing.T, l [][]byte) [][]byte { return l[1:] }, audit.ProblemRemoved, 2, 2},
		{"inserted, linked", func(t *testing.T, l [][]byte) [][]byte {
			e, _ := audit.Parse(l[1])
			return append(append(l[:2:2], forged(t, 3, e.Hash)), l[2:]...)
		}, audit.ProblemInserted, 3, 4},
		{"inserted, unlinked", func(t *testing.T, l [][]byte) [][]byte {
			return append(append(l[:2:2], forged(t, 9, audit.Genesis[:60]+"beef")), l[2:]...)
		}, audit.ProblemInserted, 9, 4},
		{"reordered", func(t *testing.T, l [][]byte) [][]byte { l[2], l[3] = l[3], l[2]; return l }, audit.ProblemReordered, 3, 5},
		{"moved to the end", func(t *testing.T, l [][]byte) [][]byte { return append(append(l[:1:1], l[2:]...), l[1]) }, audit.ProblemReordered, 2, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines, pub := chain(t, 7)
			_, err := audit.Verify(bytes.NewReader(export(tc.tamper(t, lines))), audit.VerifyOptions{PublicKey: pub})
			var p *audit.Problem
			if !errors.As(err, &p) {
				t.Fatalf("Verify = %v, want a Problem", err)
			}
			if p.What != tc.what || p.Seq != tc.seq || p.Line != tc.line {
				t.Fatalf("Verify = %v; want %s of seq %d at line %d", err, tc.what, tc.seq, tc.line)
			}
		})
	}
}

func TestVerifySignature(t *testing.T) {
	lines, _ := chain(t, 5)
	other, _, _ := ed25519.GenerateKey(rand.Reader)
	_, err := audit.Verify(bytes.NewReader(export(lines)), audit.VerifyOptions{PublicKey: other})
	var p *audit.Problem
	if !errors.As(err, &p) || p.What != audit.ProblemSignature || p.Seq != 4 {
		t.Fatalf("Verify with another key = %v, want a signature problem at seq 4", err)
	}
}

func TestVerifyFiltered(t *testing.T) {
	lines, pub := chain(t, 7)
	var b bytes.Buffer
	b.WriteString(`{"agora_audit_export":1,"complete":false,"filter":"thread=t1"}` + "\n")
	for _, i := range []int{1, 2, 5} { // seqs 2, 3, 6
		b.Write(lines[i])
		b.WriteByte('\n')
	}
	rep, err := audit.Verify(bytes.NewReader(b.Bytes()), audit.VerifyOptions{PublicKey: pub})
	if err != nil || rep.Complete || rep.Entries != 3 {
		t.Fatalf("filtered: %+v, %v", rep, err)
	}
	// The contiguous pair (2, 3) is still linked: a rewritten 2 is caught.
	b.Reset()
	b.WriteString(`{"agora_audit_export":1,"complete":false}` + "\n")
	b.Write(edit(t, lines[1], true))
	b.WriteByte('\n')
	b.Write(lines[2])
	if _, err := audit.Verify(bytes.NewReader(b.Bytes()), audit.VerifyOptions{}); err == nil || !strings.Contains(err.Error(), "seq 2 altered") {
		t.Fatalf("filtered, rewritten: %v", err)
	}
}

func TestKeyFiles(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	privPEM, pubPEM, err := audit.EncodeKeys(priv)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pp, pb := filepath.Join(dir, "k"), filepath.Join(dir, "k.pub")
	_ = os.WriteFile(pp, privPEM, 0o600)
	_ = os.WriteFile(pb, pubPEM, 0o644)
	p2, err := audit.ReadPrivateKey(pp)
	if err != nil || !p2.Equal(priv) {
		t.Fatalf("private key: %v", err)
	}
	pub, err := audit.ReadPublicKey(pb)
	if err != nil || !pub.Equal(priv.Public()) {
		t.Fatalf("public key: %v", err)
	}
}

func TestCanonical(t *testing.T) {
	e := audit.Entry{Seq: 1, Kind: "asked", At: "x", PrevHash: audit.Genesis, Comment: "<&> \u2028 \x1f é"}
	b, err := e.Seal()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"at":"x","comment":"<&> ` + "\u2028" + ` \u001f é","cursor_lifecycle":0,"cursor_questions":0,"hash":"` + e.Hash + `","kind":"asked","prev_hash":"` + audit.Genesis + `","seq":1}`
	if string(b) != want {
		t.Fatalf("canonical\n got %s\nwant %s", b, want)
	}
}
