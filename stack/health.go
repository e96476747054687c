package stack

import (
	"cmp"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
)

// healthOf serves the stack's /healthz: every service's own health report
// under "services", and 200 only when all of them say ok (503 otherwise,
// naming which do not). paths maps a service to its health path when it
// is not /healthz.
func healthOf(services map[string]http.Handler, paths map[string]string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := map[string]any{}
		var down []string
		for name, h := range services {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequestWithContext(r.Context(), http.MethodGet, cmp.Or(paths[name], "/healthz"), nil))
			var body any
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				body = map[string]any{"status": "unavailable", "error": strings.TrimSpace(rec.Body.String())}
			}
			out[name] = body
			if rec.Code != http.StatusOK {
				down = append(down, name)
			}
		}
		code, status := http.StatusOK, "ok"
		if len(down) > 0 {
			slices.Sort(down)
			code, status = http.StatusServiceUnavailable, "unavailable: "+strings.Join(down, ", ")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(map[string]any{"status": status, "services": out})
	})
}
