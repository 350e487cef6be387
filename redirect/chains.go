package redirect

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
