package schema

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"sync"
)

//go:generate go test -run=TestOpenAPIFileIsCurrent -update .

// OpenAPIName is the OpenAPI 3.1 document of the HTTP API inside [FS].
const OpenAPIName = "openapi/agora.json"

// OpenAPI returns the HTTP API's OpenAPI 3.1 document: the dispatcher's
// /v1 operations and the inbox's JSON API and answer links, exactly as
// committed in schema/openapi/agora.json. The file stands on its own:
// every reference is #/components/schemas/<name>, and the event schemas
// it uses are copied in from cloudevents/ (the nested $defs of common.json
// flattened into components named common.<def>), a copy this package's
// tests keep current (docs/api.md).
var OpenAPI = sync.OnceValues(func() ([]byte, error) {
	b, err := fs.ReadFile(files, OpenAPIName)
	if err != nil {
		return nil, err
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("schema: %s is not JSON", OpenAPIName)
	}
	return b, nil
})
