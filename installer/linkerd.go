package installer

import (
	"strings"

	"github.com/nftmesh/nftmesh/podinfo/cniconf"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

// LinkerdSettings are the node's settings for Linkerd pods, written into
// the plugin's conflist entry under linkerd-cni's `linkerd` key with its
// names. Each flag is also NFTMESH_LINKERD_<NAME>.
type LinkerdSettings struct {
	// Enabled writes the settings (without it the plugin uses linkerd2-cni's
	// chart defaults for any Linkerd pod).
	Enabled bool
	meshpod.LinkerdConfig
}

// linkerdFlags is the --linkerd-* table, bound to c.Linkerd with
// linkerd2-cni's chart defaults.
func linkerdFlags(c *Config) []flagDef {
	l, d := &c.Linkerd, meshpod.DefaultLinkerd()
	return []flagDef{
		fl(&l.Enabled, "linkerd", false, "write the --linkerd-* settings for Linkerd pods into the plugin's config (without: linkerd2-cni's chart defaults)"),
		fl(&l.IncomingProxyPort, "linkerd-incoming-proxy-port", d.IncomingProxyPort, "Linkerd's proxy inbound port"),
		fl(&l.OutgoingProxyPort, "linkerd-outgoing-proxy-port", d.OutgoingProxyPort, "Linkerd's proxy outbound port"),
		fl(&l.ProxyUID, "linkerd-proxy-uid", d.ProxyUID, "Linkerd's proxy user id (its traffic is never captured)"),
		fl(&l.ProxyGID, "linkerd-proxy-gid", d.ProxyGID, "Linkerd's proxy group id (below 1: none)"),
		fl(&l.PortsToRedirect, "linkerd-ports-to-redirect", nil, "inbound ports captured for Linkerd pods (empty: all)"),
		fl(&l.InboundPortsToIgnore, "linkerd-inbound-ports-to-ignore", d.InboundPortsToIgnore, "inbound ports and ranges never captured (the proxy's control and admin ports among them)"),
		fl(&l.OutboundPortsToIgnore, "linkerd-outbound-ports-to-ignore", nil, "outbound ports and ranges never captured"),
		fl(&l.SubnetsToIgnore, "linkerd-subnets-to-ignore", nil, "sources whose inbound connections are never captured"),
		fl(&l.IPv6, "linkerd-ipv6", false, "capture IPv6 too for Linkerd pods (linkerd2-cni's disableIPv6: false)"),
	}
}

// check refuses settings no Linkerd pod could be captured with,
// naming the flag.
func (l *LinkerdSettings) check() error {
	if !l.Enabled {
		return nil
	}
	// The plugin's own check, on the entry as written.
	if _, err := cniconf.ParseConfig(cniconf.PluginConf{CNIVersion: "1.0.0", Name: "x", Type: PluginName,
		PluginSettings: cniconf.PluginSettings{Linkerd: &l.LinkerdConfig}}.JSON()); err != nil {
		return &ConfigError{Flag: "linkerd", Source: "flag", Value: "true", Reason: strings.ReplaceAll(strings.TrimPrefix(err.Error(), `plugin config field "linkerd": `), "field linkerd ", "--linkerd-")}
	}
	return nil
}

// linkerdConf is the conflist entry's linkerd value, nil when not enabled.
func (l *LinkerdSettings) conf() *meshpod.LinkerdConfig {
	if !l.Enabled {
		return nil
	}
	c := l.LinkerdConfig
	return &c
}
