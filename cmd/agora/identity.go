package main

import (
	"cmp"
	"fmt"
	"net/url"
	"os"
	"strings"
	"unicode"

	"github.com/nats-io/jwt/v2"
)

// credentialName is who the NATS credentials of the client verbs prove
// (docs/security.md, "Who answered"): the name — else the public key — of
// a creds file's user JWT, the user of a URL's user:password, "token" for
// a URL's token, and "local" without credentials (a server that takes
// anyone, as agora dev's). $USER plays no part: setting it proves nothing.
func credentialName(natsURL, creds string) (string, error) {
	if creds != "" {
		data, err := os.ReadFile(creds)
		if err != nil {
			return "", fmt.Errorf("credentials file --creds %s: %w", creds, err)
		}
		tok, err := jwt.ParseDecoratedJWT(data)
		if err != nil {
			return "", fmt.Errorf("credentials file --creds %s: %w", creds, err)
		}
		uc, err := jwt.DecodeUserClaims(tok)
		if err != nil {
			return "", fmt.Errorf("credentials file --creds %s: not a user JWT: %w", creds, err)
		}
		return printable(cmp.Or(uc.Name, uc.Subject)), nil
	}
	for _, raw := range strings.Split(natsURL, ",") {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil || u.User == nil {
			continue
		}
		if _, hasPassword := u.User.Password(); hasPassword {
			return printable(u.User.Username()), nil
		}
		return "token", nil
	}
	return "local", nil
}

// attributed is the answered_by (or cancelled by) of a client verb: its
// door and the credentials' name, and before them the name --as gives,
// which the credentials vouch for: "alice (via cli:client)".
func attributed(door, name, as string) string {
	by := door + ":" + name
	if as = strings.TrimSpace(as); as != "" && as != by {
		return printable(as) + " (via " + by + ")"
	}
	return by
}

// printable drops control characters and bounds a name to 64 bytes.
func printable(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, s)
	if len(s) > 64 {
		s = strings.ToValidUTF8(s[:64], "")
	}
	return cmp.Or(s, "unnamed")
}
