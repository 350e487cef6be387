package istiotest

import (
	"fmt"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/nftmesh/nftmesh/internal/imagebuild"
)

// StandinImage builds the one image Rewrite's pods run: Istio's pilot-agent
// and the two stand-ins (all static binaries, given by path) at Standin's
// default paths, mode 0755 so the proxy's UID 1337 can run them. The
// entrypoint is pilot-agent, as in Istio's proxy image, but Rewrite sets
// every container's command anyway.
func StandinImage(pilotAgent, proxy, app string) (v1.Image, error) {
	agentPath, proxyPath, appPath := Standin{}.paths()
	var files []imagebuild.File
	for _, f := range []struct{ src, dst string }{{pilotAgent, agentPath}, {proxy, proxyPath}, {app, appPath}} {
		data, err := os.ReadFile(f.src)
		if err != nil {
			return nil, fmt.Errorf("building the stand-in image: %w", err)
		}
		files = append(files, imagebuild.File{Path: f.dst, Mode: 0o755, Data: data})
	}
	img, err := imagebuild.Build(files, imagebuild.Config{
		Entrypoint: []string{agentPath},
		Labels:     map[string]string{"io.istio.module": "istio.io/istio@" + ModuleVersion},
	})
	if err != nil {
		return nil, fmt.Errorf("building the stand-in image: %w", err)
	}
	return img, nil
}
