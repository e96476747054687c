package genclient_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/internal/testkit"
)

// Every route of the inbox that a program calls — its JSON API under
// /inbox/api and the answer links under /inbox/a — is an operation of the
// document, and every documented /inbox operation is one the inbox
// registers (answerers/inbox/pages.go). The dispatcher's /v1 routes are
// held to the document by its own tests.
func TestDocumentCoversInboxAPI(t *testing.T) {
	src, err := os.ReadFile("../../../answerers/inbox/pages.go")
	if err != nil {
		t.Fatal(err)
	}
	registered := map[string]bool{}
	for _, m := range regexp.MustCompile(`mux\.Handle(?:Func)?\("(GET|POST|PUT|DELETE|PATCH) "\+Prefix\+"(/(?:api|a)/[^"]+)"`).FindAllStringSubmatch(string(src), -1) {
		registered[m[1]+" /inbox"+m[2]] = true
	}
	if len(registered) < 7 {
		t.Fatalf("found %d /inbox/api and /inbox/a routes in pages.go; the pattern no longer matches the registration", len(registered))
	}
	doc := loadDoc(t)
	documented := map[string]bool{}
	for p, item := range doc.Paths.Map() {
		if !strings.HasPrefix(p, "/inbox/") {
			continue
		}
		for method := range item.Operations() {
			documented[method+" "+p] = true
		}
	}
	testkit.SameRoutes(t, registered, documented)
}
