package installer

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nftmesh/nftmesh/internal/kubeconf"
)

// KubeconfigMode keeps the plugin's credentials readable by root only.
const KubeconfigMode fs.FileMode = 0o600

// RenderKubeconfig builds the plugin's kubeconfig from the service-account
// dir (token, ca.crt or caFile) and the API server URL.
func RenderKubeconfig(server, saDir, caFile string) ([]byte, error) {
	tok, err := os.ReadFile(filepath.Join(saDir, "token"))
	if err != nil {
		return nil, fmt.Errorf("reading service-account token: %w", err)
	}
	token := strings.TrimSpace(string(tok))
	if token == "" {
		return nil, fmt.Errorf("reading service-account token: %s is empty", filepath.Join(saDir, "token"))
	}
	if caFile == "" {
		caFile = filepath.Join(saDir, "ca.crt")
	}
	cluster := &clientcmdapi.Cluster{Server: server}
	ca, err := os.ReadFile(caFile)
	switch {
	case err == nil && len(bytes.TrimSpace(ca)) > 0:
		cluster.CertificateAuthorityData = ca
	case strings.HasPrefix(server, "https:"):
		if err == nil {
			err = errors.New("file is empty")
		}
		return nil, fmt.Errorf("reading the API server CA %s: %w", caFile, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = cluster
	cfg.AuthInfos[PluginName] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[PluginName] = &clientcmdapi.Context{Cluster: "local", AuthInfo: PluginName}
	cfg.CurrentContext = PluginName
	return kubeconf.JSON(*cfg)
}

// syncKubeconfig writes want to path (0600, atomically) unless it already
// holds exactly that; it reports whether it wrote. A symlink there is
// replaced, whatever it leads to: the plugin would read that file.
func syncKubeconfig(path string, want []byte) (bool, error) {
	if have, err := os.ReadFile(path); err == nil && bytes.Equal(have, want) {
		if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() == KubeconfigMode {
			return false, nil
		}
	}
	if err := writeFileAtomic(path, want, KubeconfigMode, -1, -1); err != nil {
		return false, fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return true, nil
}

const legacyTLSSessionPrefix = "tls-session-"

// removeLegacyTLSSessions deletes the files in dir (the run dir) in which
// plugins before the switch to client-go kept their TLS session with the
// API server (a resumption secret): an upgrade leaves them behind.
func removeLegacyTLSSessions(dir string) error {
	matches, err := filepath.Glob(filepath.Join(dir, legacyTLSSessionPrefix+"*"))
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range matches {
		if err := os.Remove(m); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
