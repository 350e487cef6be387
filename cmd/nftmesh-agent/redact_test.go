package main

import (
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/installer"
)

// TestRepairClientNeverShowsTheToken: the agent's API client, given an
// error page that echoes the request's Authorization header, returns an
// error without its token, and does not follow a redirect elsewhere.
func TestRepairClientNeverShowsTheToken(t *testing.T) {
	const token = "eyJhbGciOiJSUzI1NiJ9.YWdlbnQtc2VjcmV0.c2ln"
	var elsewhere int
	other := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { elsewhere++ }))
	t.Cleanup(other.Close)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.RawQuery, "limit=1") {
			http.Redirect(w, r, other.URL+"/x", http.StatusFound)
			return
		}
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprintf(w, "<html>upstream failed for Authorization: %s</html>", r.Header.Get("Authorization"))
	}))
	t.Cleanup(srv.Close)
	sa := t.TempDir()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(filepath.Join(sa, "ca.crt"), ca, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sa, "token"), []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := repairClient(&installer.Config{KubeAPIServer: srv.URL, ServiceAccountDir: sa})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Pods("shop").List(context.Background(), metav1.ListOptions{})
	if err == nil || !strings.Contains(err.Error(), "upstream failed") || strings.Contains(err.Error(), "YWdlbnQtc2VjcmV0") {
		t.Fatalf("err = %v, want the page without the token", err)
	}
	_, err = c.Pods("shop").List(context.Background(), metav1.ListOptions{Limit: 1})
	if err == nil || !strings.Contains(err.Error(), "redirect (HTTP 302)") || elsewhere != 0 {
		t.Fatalf("err = %v, %d requests elsewhere; want the redirect refused", err, elsewhere)
	}
}
