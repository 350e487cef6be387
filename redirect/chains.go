package redirect

import "strings"

// Istio's chain names. Base chains use iptables' builtin names.
const (
	ChainPrerouting = "PREROUTING"
	ChainOutput     = "OUTPUT"
	ChainInbound    = "ISTIO_INBOUND"
	ChainRedirect   = "ISTIO_REDIRECT"
	ChainInRedirect = "ISTIO_IN_REDIRECT"
	ChainOutbound   = "ISTIO_OUTPUT"
	ChainOutputDNS  = "ISTIO_OUTPUT_DNS"
	ChainDivert     = "ISTIO_DIVERT"
	ChainTProxy     = "ISTIO_TPROXY"
	ChainDrop       = "ISTIO_DROP"
)

// Names of the sets Build makes where Istio emits one rule per element.
const (
	setInboundPorts    = "inbound-ports"
	setInboundExclude  = "inbound-exclude-ports"
	setOutboundPorts   = "outbound-ports"
	setOutboundExclude = "outbound-exclude-ports"
	setExcludeV4       = "outbound-exclude-v4"
	setExcludeV6       = "outbound-exclude-v6"
	setIncludeV4       = "outbound-include-v4"
	setIncludeV6       = "outbound-include-v6"
)

// builtinChain is where one of iptables' builtin chains hangs in netfilter.
type builtinChain struct {
	table    TableName
	name     string
	hook     Hook
	typ      ChainType
	priority int32
}

// builtinChains are the builtin chains Istio's rules use, per table. mangle
// OUTPUT is a route chain because iptables re-routes a packet whose mark
// changed there, which the TPROXY mode's marks rely on.
var builtinChains = []builtinChain{
	{TableNat, ChainPrerouting, HookPrerouting, ChainTypeNat, PriorityNat},
	{TableNat, ChainOutput, HookOutput, ChainTypeNat, PriorityNat},
	{TableMangle, ChainPrerouting, HookPrerouting, ChainTypeFilter, PriorityMangle},
	{TableMangle, ChainOutput, HookOutput, ChainTypeRoute, PriorityMangle},
	{TableRaw, ChainPrerouting, HookPrerouting, ChainTypeFilter, PriorityRaw},
	{TableRaw, ChainOutput, HookOutput, ChainTypeFilter, PriorityRaw},
}

// BuiltinChain returns iptables' builtin chain name of table t as a Plan
// holds it (hook, type and priority set, no rules), and whether there is one.
func BuiltinChain(t TableName, name string) (Chain, bool) {
	for _, bc := range builtinChains {
		if bc.table == t && bc.name == name {
			return Chain{Name: name, Hook: bc.hook, Type: bc.typ, Priority: bc.priority}, true
		}
	}
	return Chain{}, false
}

// ChainName is the one name a chain of table t goes by in everything
// nftmesh prints of a plan but iptables-save syntax (render -o nft, plan
// and json, trace, inspect's drift and its explanation), and in the
// nftables backend's table, so what `nft list ruleset` shows in a pod is
// what the CLI says: the table and the chain in lower case, "_" as "-"
// (nat/ISTIO_OUTPUT → "nat-istio-output"). iptables-save keeps Istio's
// names (ISTIO_OUTPUT in table nat), which are the chains' names there.
func ChainName(t TableName, chain string) string {
	// One allocation for the ASCII names every plan has (encoding a plan
	// names each chain twice and each jump once); anything else the long
	// way, which gives the same result.
	b := make([]byte, 0, len(t)+1+len(chain))
	for _, part := range [...]string{string(t), "-", chain} {
		for i := 0; i < len(part); i++ {
			c := part[i]
			switch {
			case c >= 0x80:
				return strings.ToLower(string(t) + "-" + strings.ReplaceAll(chain, "_", "-"))
			case c == '_':
				c = '-'
			case 'A' <= c && c <= 'Z':
				c += 'a' - 'A'
			}
			b = append(b, c)
		}
	}
	return string(b)
}
