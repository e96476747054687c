package audit

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"slices"
)

// ShownDigest is the Digest of what a question showed: the canonical
// encoding of {"context","kind","options","partial_state","question"},
// partial_state being the partial state's Digest (or "" when it had none).
func ShownDigest(question, context, kind string, options []string, partialState string) string {
	opts := make([]any, len(options))
	for i, o := range options {
		opts[i] = clean(o)
	}
	c, _ := Canonical(map[string]any{
		"question": clean(question), "context": clean(context), "kind": clean(kind),
		"options": opts, "partial_state": clean(partialState),
	})
	return Digest(c)
}

// KeyID names a public key in checkpoints: the first 16 hex digits of the
// SHA-256 of its 32 bytes.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// Sign signs checkpoint e (its Count and HeadHash set) with priv.
func Sign(e *Entry, priv ed25519.PrivateKey) {
	e.Signature = base64.StdEncoding.EncodeToString(ed25519.Sign(priv, CheckpointMessage(e.Count, e.HeadHash)))
	e.KeyID = KeyID(priv.Public().(ed25519.PublicKey))
}

// checkSignature reports whether checkpoint e is signed by pub.
func checkSignature(e Entry, pub ed25519.PublicKey) bool {
	sig, err := base64.StdEncoding.DecodeString(e.Signature)
	return err == nil && ed25519.Verify(pub, CheckpointMessage(e.Count, e.HeadHash), sig)
}

// ReadPrivateKey reads an Ed25519 private key from a PEM file holding
// PKCS #8 ("PRIVATE KEY", what `openssl genpkey -algorithm ed25519`
// writes).
func ReadPrivateKey(path string) (ed25519.PrivateKey, error) {
	der, err := readPEM(path, "PRIVATE KEY")
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("audit: key %s: %w", path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("audit: key %s: %T, want an Ed25519 key", path, k)
	}
	return priv, nil
}

// ReadPublicKey reads an Ed25519 public key from a PEM file holding PKIX
// ("PUBLIC KEY", what `openssl pkey -pubout` writes).
func ReadPublicKey(path string) (ed25519.PublicKey, error) {
	der, err := readPEM(path, "PUBLIC KEY")
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("audit: key %s: %w", path, err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("audit: key %s: %T, want an Ed25519 key", path, k)
	}
	return pub, nil
}

// EncodeKeys returns priv and its public key as the PEM files
// ReadPrivateKey and ReadPublicKey read.
func EncodeKeys(priv ed25519.PrivateKey) (private, public []byte, err error) {
	d, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, nil, err
	}
	p, err := x509.MarshalPKIXPublicKey(priv.Public())
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: d}), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: p}), nil
}

func readPEM(path, typ string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, fmt.Errorf("audit: key %s: no %q PEM block", path, typ)
		}
		if blk.Type == typ {
			return slices.Clip(blk.Bytes), nil
		}
	}
}
