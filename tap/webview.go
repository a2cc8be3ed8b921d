package tap

import (
	"embed"
	"net/http"
)

// webFiles is the web view: one static page and its script, which read
// the group API, the event stream and /api/fleet.
//
//go:embed webview/static
var webFiles embed.FS

// webView serves the web view's files at /.
func webView() http.Handler {
	files := http.FileServerFS(webFiles)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/webview/static" + r.URL.Path
		r2.URL.RawPath = ""
		files.ServeHTTP(w, r2)
	})
}
