package istiotest

import (
	"fmt"

	"github.com/nftmesh/nftmesh/testkit/imagetest"
)

// StandinImage writes the one image Rewrite's pods run, tagged tag, as a
// docker-archive tarball at out: Istio's pilot-agent and the two stand-ins
// (all static binaries, given by path) at Standin's default paths, mode
// 0755 so the proxy's UID 1337 can run them. The entrypoint is
// pilot-agent, as in Istio's proxy image, but Rewrite sets every
// container's command anyway.
func StandinImage(pilotAgent, proxy, app, out, tag string) error {
	agentPath, proxyPath, appPath := Standin{}.paths()
	err := imagetest.Write(out, imagetest.Spec{
		Tag:        tag,
		Files:      []imagetest.File{{Path: agentPath, Src: pilotAgent}, {Path: proxyPath, Src: proxy}, {Path: appPath, Src: app}},
		Entrypoint: []string{agentPath},
		Labels:     map[string]string{"io.istio.module": "istio.io/istio@" + ModuleVersion},
	})
	if err != nil {
		return fmt.Errorf("building the stand-in image: %w", err)
	}
	return nil
}
