package istiotest

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Container names the injector gives its containers.
const (
	ValidationContainer = "istio-validation"
	ProxyContainer      = "istio-proxy"
)

// Standin says what Rewrite puts in place of the images a machine without a
// registry cannot pull. One image holds all three programs.
type Standin struct {
	// Image is the image reference (e.g. localhost/istio-standin:test),
	// imported into the runtime beforehand: pods get imagePullPolicy Never.
	Image string
	// PilotAgent, Proxy and App are the programs' paths in Image; empty
	// means /usr/local/bin/pilot-agent (where Istio's proxy image keeps
	// it, so the injected native-sidecar preStop `pilot-agent request ...`
	// finds it on PATH too), /usr/local/bin/standin-proxy and
	// /usr/local/bin/standin-app.
	PilotAgent, Proxy, App string
	// ProxyConnect are destinations the stand-in proxy dials periodically
	// as the proxy (UID 1337, or GID 1337 under TPROXY): capture must let
	// them out untouched.
	ProxyConnect []string
	// ProxyForward makes the stand-in proxy relay what its outbound
	// listener (15001) accepts to the original destination, as Envoy does
	// (-forward), instead of answering it: the app's captured connection
	// is then answered at its destination.
	ProxyForward bool
	// AppConnect are destinations the app dials periodically: a mesh pod's
	// proxy must see them on 15001 with their original destination.
	AppConnect []string
	// Every is the dial period as a Go duration ("" means 2s).
	Every string
}

func (s Standin) paths() (agent, proxy, app string) {
	agent, proxy, app = s.PilotAgent, s.Proxy, s.App
	if agent == "" {
		agent = "/usr/local/bin/pilot-agent"
	}
	if proxy == "" {
		proxy = "/usr/local/bin/standin-proxy"
	}
	if app == "" {
		app = "/usr/local/bin/standin-app"
	}
	return agent, proxy, app
}

// Rewrite makes an injected (or opted-out) pod spec runnable offline, in
// place, changing only images, commands and stand-in arguments:
//
//   - istio-validation keeps Istio's real pilot-agent and every injected
//     argument (`istio-iptables -p 15001 -z 15006 -u 1337 -m REDIRECT ...
//     --run-validation --skip-rule-apply`): only its image changes, and its
//     command is set to pilot-agent, the entrypoint of Istio's proxy image.
//     It exits 0 once a connection to 127.0.0.6:15002 reaches its listener
//     on 15001/15006, i.e. when capture is in place, and fails otherwise;
//   - istio-proxy (a container, or an init container with restartPolicy
//     Always for native sidecars) runs standin-proxy, connecting to
//     ProxyConnect, forwarding with ProxyForward. Its injected arguments
//     (`proxy sidecar ...`) and environment stay as they are, since
//     nftmesh reads the pod's capture settings from them: the stand-in's
//     own flags go into the command, and Go's flag parsing stops at the
//     first injected argument;
//   - every other container runs standin-app listening on its
//     containerPorts and connecting to AppConnect (command and arguments
//     replaced: the application's own cannot run).
//
// Any other init container is an error: it would not run offline.
func Rewrite(spec *corev1.PodSpec, s Standin) error {
	if s.Image == "" {
		return fmt.Errorf("rewriting pod spec: no stand-in image")
	}
	agent, proxy, app := s.paths()
	var dials []string
	if s.Every != "" {
		dials = append(dials, "-every="+s.Every)
	}
	connect := func(targets []string) []string {
		args := append([]string(nil), dials...)
		for _, t := range targets {
			args = append(args, "-connect="+t)
		}
		return args
	}
	set := func(c *corev1.Container, cmd []string, args []string) {
		c.Image = s.Image
		c.ImagePullPolicy = corev1.PullNever
		c.Command = cmd
		if args != nil {
			c.Args = args
		}
	}
	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		switch c.Name {
		case ValidationContainer:
			set(c, []string{agent}, nil)
		case ProxyContainer:
			set(c, proxyCmd(proxy, s.ProxyForward, connect(s.ProxyConnect)), nil)
		default:
			return fmt.Errorf("rewriting pod spec: init container %q has no stand-in", c.Name)
		}
	}
	for i := range spec.Containers {
		c := &spec.Containers[i]
		if c.Name == ProxyContainer {
			set(c, proxyCmd(proxy, s.ProxyForward, connect(s.ProxyConnect)), nil)
			continue
		}
		var ports []string
		for _, p := range c.Ports {
			if p.Protocol == "" || p.Protocol == corev1.ProtocolTCP {
				ports = append(ports, strconv.Itoa(int(p.ContainerPort)))
			}
		}
		args := connect(s.AppConnect)
		if len(ports) > 0 {
			args = append([]string{"-listen=" + strings.Join(ports, ",")}, args...)
		}
		if args == nil {
			args = []string{}
		}
		set(c, []string{app}, args)
	}
	return nil
}

// proxyCmd is the stand-in proxy's command: the program, -forward if asked
// for, its dial flags.
func proxyCmd(proxy string, forward bool, dials []string) []string {
	cmd := []string{proxy}
	if forward {
		cmd = append(cmd, "-forward")
	}
	return append(cmd, dials...)
}
