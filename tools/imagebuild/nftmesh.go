package imagebuild

import (
	"bytes"
	"cmp"
	"debug/elf"
	"fmt"
	"runtime"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Where the nftmesh image holds its binaries. The Dockerfile copies them to
// the same places, and the chart runs AgentPath.
const (
	AgentPath    = "/usr/local/bin/nftmesh-agent"
	RedirectPath = "/usr/local/bin/redirect"
	// PluginPath is the agent's --plugin-binary default: the file it
	// copies into the host's CNI bin dir.
	PluginPath = "/opt/cni/bin/nftmesh-cni"
	// StandalonePath is the whole plugin, which the agent copies from the
	// directory of --plugin-binary next to the front, and which the front
	// execs when the agent is not there.
	StandalonePath = "/opt/cni/bin/nftmesh-cni-standalone"
	// User is numeric, so nothing needs an /etc/passwd. The agent runs as
	// root (it writes the host's CNI dirs); the chart drops capabilities.
	User = "0:0"
	// Path lets `kubectl exec <agent pod> -- redirect inspect ...` find
	// the CLI (the Dockerfile's distroless base sets the same).
	Path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// DefaultRepository is where the nftmesh image is published: the chart's
// default nftmesh.image.repository and the Makefile's IMAGE_REPO.
const DefaultRepository = "ghcr.io/nftmesh/nftmesh"

// DefaultSource is the image's org.opencontainers.image.source label.
const DefaultSource = "https://github.com/nftmesh/nftmesh"

// Binaries are the static linux binaries the nftmesh image holds: Plugin
// is the front the runtime runs, Standalone its companion.
type Binaries struct {
	Agent, Plugin, Standalone, Redirect []byte
}

// Meta is what the nftmesh image says about itself in its labels.
type Meta struct {
	Version  string // required: the version the binaries were stamped with
	Revision string // the source commit
	Source   string // default DefaultSource
	// Created is the image's time and every file's mtime: the commit time
	// or SOURCE_DATE_EPOCH, never the wall clock.
	Created      time.Time
	Architecture string // default runtime.GOARCH; the binaries must match
}

// Nftmesh builds the nftmesh image: the four binaries and nothing else on
// an empty base. They need no CA bundle (the only TLS peer is the API
// server, verified with the service account's CA; leaving the host's out
// keeps the image a function of the source), no /etc/passwd and no
// writable /tmp (the chart mounts the root file system read-only).
func Nftmesh(bins Binaries, meta Meta) (v1.Image, error) {
	if meta.Version == "" {
		return nil, fmt.Errorf("building the nftmesh image: the version is empty")
	}
	cfg := Config{
		Architecture: meta.Architecture,
		Entrypoint:   []string{AgentPath},
		Env:          []string{Path},
		User:         User,
		Created:      meta.Created,
		CreatedBy:    "nftmesh mkimage " + meta.Version,
		Labels:       Labels(meta),
	}
	arch := cmp.Or(cfg.Architecture, runtime.GOARCH)
	files := []File{
		{Path: AgentPath, Mode: 0o755, Data: bins.Agent},
		{Path: PluginPath, Mode: 0o755, Data: bins.Plugin},
		{Path: StandalonePath, Mode: 0o755, Data: bins.Standalone},
		{Path: RedirectPath, Mode: 0o755, Data: bins.Redirect},
	}
	for _, f := range files {
		if err := checkStatic(f.Data, arch); err != nil {
			return nil, fmt.Errorf("building the nftmesh image: %s: %w", f.Path, err)
		}
	}
	return Build(files, cfg)
}

// Labels are the nftmesh image's OCI annotations, in its config.
func Labels(meta Meta) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":       "nftmesh",
		"org.opencontainers.image.description": "nftmesh node agent, CNI plugin and redirect CLI: Istio sidecar capture with nftables over netlink",
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.version":     meta.Version,
		"org.opencontainers.image.source":      cmp.Or(meta.Source, DefaultSource),
		"org.opencontainers.image.created":     fixedTime(meta.Created).Format(time.RFC3339),
	}
	if meta.Revision != "" {
		l["org.opencontainers.image.revision"] = meta.Revision
	}
	return l
}

// elfMachine maps GOARCH to the ELF machine its binaries carry.
var elfMachine = map[string]elf.Machine{
	"amd64":   elf.EM_X86_64,
	"arm64":   elf.EM_AARCH64,
	"arm":     elf.EM_ARM,
	"386":     elf.EM_386,
	"ppc64le": elf.EM_PPC64,
	"s390x":   elf.EM_S390,
	"riscv64": elf.EM_RISCV,
}

// checkStatic refuses what would fail only when the container starts: a
// binary for another architecture, or one that needs a dynamic loader the
// empty base does not have (a build without CGO_ENABLED=0).
func checkStatic(data []byte, arch string) error {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("not an ELF binary: %w", err)
	}
	defer f.Close()
	want, ok := elfMachine[arch]
	if !ok {
		return fmt.Errorf("architecture %q is not supported", arch)
	}
	if f.Machine != want {
		return fmt.Errorf("built for %v, the image is %s", f.Machine, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("dynamically linked (build with CGO_ENABLED=0): the image has no loader or libc")
		}
	}
	return nil
}
