package apierr

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// OpenAI's error object always carries "param"; clients written against it
// read error.param and expect null when no parameter is at fault.
func TestParam(t *testing.T) {
	tests := []struct {
		name  string
		write func(http.ResponseWriter)
		want  any
	}{
		{"none", func(w http.ResponseWriter) { Write(w, 400, TypeInvalidRequest, "invalid_sdp", "bad", 0) }, nil},
		{"named", func(w http.ResponseWriter) {
			WriteParam(w, 400, TypeInvalidRequest, "session_field_not_allowed", "no", "session.model")
		}, "session.model"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			tc.write(rec)
			var body struct {
				Error map[string]any `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			p, ok := body.Error["param"]
			if !ok {
				t.Fatalf("no param in %s", rec.Body)
			}
			if p != tc.want {
				t.Fatalf("param = %v, want %v", p, tc.want)
			}
		})
	}
}
