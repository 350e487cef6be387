{{- /*
linkerd2-cni's values (Linkerd's CNI chart), so that its values file installs
this chart as it is: each key is read under nftmesh's name, ignored with a
reason, or refused, by name. zz_values.yaml calls "nftmesh.linkerd" with
(dict "user" <every user layer merged> "top" <the user's top layer>); it
writes what it maps into top (the user's layer, so it beats a platform's
defaults) and returns YAML: on (the Linkerd profile is on), env (the agent's
NFTMESH_LINKERD* settings), refused, ignored and mapped (lines for the
install notes).
*/ -}}

{{/* The keys only linkerd2-cni's chart has: any of them turns the Linkerd
profile on. Shared names (logLevel, podLabels, tolerations, resources,
image, privileged, ...) do not. */}}
{{- define "nftmesh.linkerdKeys" -}}
inboundProxyPort outboundProxyPort proxyAdminPort proxyControlPort proxyUID proxyGID ignoreInboundPorts ignoreOutboundPorts portsToRedirect destCNINetDir destCNIBinDir useWaitFlag iptablesMode disableIPv6 repairController enablePSP
{{- end -}}

{{- define "nftmesh.linkerd" -}}
{{- $user := .user -}}
{{- $top := .top -}}
{{- $out := dict "on" false "env" dict "refused" list "ignored" list "mapped" list -}}
{{- $given := list -}}
{{- range splitList " " (include "nftmesh.linkerdKeys" .) -}}
{{- if hasKey $user . -}}{{- $given = append $given . -}}{{- end -}}
{{- end -}}
{{- $topLinkerd := $top.linkerd | default dict -}}
{{- $on := dig "linkerd" "enabled" false $user | default false -}}
{{- if $given -}}
{{- if and (hasKey $topLinkerd "enabled") (not $topLinkerd.enabled) -}}
{{- $_ := set $out "refused" (append $out.refused (printf "linkerd.enabled=false with linkerd2-cni's values (%s): they set Linkerd pods' capture, which linkerd.enabled=false leaves without its settings and its RBAC; remove linkerd.enabled=false, or those values" (join ", " $given))) -}}
{{- else if not $on -}}
{{- $on = true -}}
{{- $_ := set $out "mapped" (append $out.mapped (printf "linkerd2-cni's values (%s) → linkerd.enabled=true" (join ", " $given))) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $out "on" $on -}}
{{- if $on -}}
{{- include "nftmesh.linkerdSettings" (dict "user" $user "out" $out) -}}
{{- include "nftmesh.linkerdChart" (dict "user" $user "top" $top "out" $out) -}}
{{- end -}}
{{- include "nftmesh.linkerdShared" (dict "user" $user "top" $top "out" $out) -}}
{{- toYaml $out -}}
{{- end -}}

{{/* The proxy settings, as the agent's --linkerd-* flags (NFTMESH_LINKERD_*),
with linkerd2-cni's chart defaults; its inbound ignore list is the proxy's
admin and control ports plus ignoreInboundPorts, as linkerd2-cni writes it. */}}
{{- define "nftmesh.linkerdSettings" -}}
{{- $user := .user -}}
{{- $out := .out -}}
{{- $n := dict -}}
{{- range $k, $d := dict "inboundProxyPort" 4143 "outboundProxyPort" 4140 "proxyAdminPort" 4191 "proxyControlPort" 4190 "proxyUID" 2102 "proxyGID" -1 -}}
{{- $x := index $user $k -}}
{{- $_ := set $n $k (ternary $d $x (kindIs "invalid" $x) | int) -}}
{{- end -}}
{{- range $k := list "inboundProxyPort" "outboundProxyPort" "proxyAdminPort" "proxyControlPort" -}}
{{- if or (lt (index $n $k) 1) (gt (index $n $k) 65535) -}}
{{- $_ := set $out "refused" (append $out.refused (printf "%s=%d: not a port (1-65535)" $k (index $n $k))) -}}
{{- end -}}
{{- end -}}
{{- if lt $n.proxyUID 1 -}}
{{- $_ := set $out "refused" (append $out.refused (printf "proxyUID=%d: must be 1 or more (with no UID to exempt, the proxy's own connections would loop back to it)" $n.proxyUID)) -}}
{{- end -}}
{{- if eq $n.proxyGID 0 -}}
{{- $_ := set $out "refused" (append $out.refused "proxyGID=0: nftmesh exempts a proxy GID of 1 or more (group 0 would exempt every root-group process); -1 exempts none") -}}
{{- end -}}
{{- $lists := dict -}}
{{- range $k := list "ignoreInboundPorts" "ignoreOutboundPorts" "portsToRedirect" -}}
{{- $s := include "nftmesh.envValue" (index $user $k) | nospace -}}
{{- $bad := include "nftmesh.portListError" (dict "value" $s "ranges" (ne $k "portsToRedirect") "base" (ternary 2 0 (eq $k "ignoreInboundPorts"))) -}}
{{- if $bad -}}
{{- $_ := set $out "refused" (append $out.refused (printf "%s=%s: %s" $k ($s | trunc 64) $bad)) -}}
{{- end -}}
{{- $_ := set $lists $k $s -}}
{{- end -}}
{{- $env := $out.env -}}
{{- $_ := set $env "NFTMESH_LINKERD" "true" -}}
{{- $_ := set $env "NFTMESH_LINKERD_INCOMING_PROXY_PORT" (toString $n.inboundProxyPort) -}}
{{- $_ := set $env "NFTMESH_LINKERD_OUTGOING_PROXY_PORT" (toString $n.outboundProxyPort) -}}
{{- $_ := set $env "NFTMESH_LINKERD_PROXY_UID" (toString $n.proxyUID) -}}
{{- $_ := set $env "NFTMESH_LINKERD_PROXY_GID" (toString $n.proxyGID) -}}
{{- $_ := set $env "NFTMESH_LINKERD_INBOUND_PORTS_TO_IGNORE" (join "," (compact (list (toString $n.proxyAdminPort) (toString $n.proxyControlPort) $lists.ignoreInboundPorts))) -}}
{{- with $lists.ignoreOutboundPorts -}}{{- $_ := set $env "NFTMESH_LINKERD_OUTBOUND_PORTS_TO_IGNORE" . -}}{{- end -}}
{{- with $lists.portsToRedirect -}}{{- $_ := set $env "NFTMESH_LINKERD_PORTS_TO_REDIRECT" . -}}{{- end -}}
{{- $v6 := index $user "disableIPv6" -}}
{{- $_ := set $env "NFTMESH_LINKERD_IPV6" (ternary "false" (not $v6 | toString) (kindIs "invalid" $v6)) -}}
{{- end -}}

{{/* "" when .value (no spaces) is empty or a comma-separated list of ports
(1-65535), with ranges lo-hi when .ranges, of at most 4096 ports with .base
ports already in the list (the agent's bound: the iptables backend writes a
rule per port); else why not. */}}
{{- define "nftmesh.portListError" -}}
{{- $re := ternary "^[0-9]+(-[0-9]+)?$" "^[0-9]+$" .ranges -}}
{{- $what := ternary "a comma-separated list of ports and ranges (e.g. 25,3306,8000-8100)" "a comma-separated list of ports (e.g. 80,8080)" .ranges -}}
{{- $err := "" -}}
{{- $count := .base | int -}}
{{- if .value -}}
{{- range splitList "," .value -}}
{{- if not (regexMatch $re .) -}}
{{- $err = printf "not %s" $what -}}
{{- else -}}
{{- $ends := splitList "-" . -}}
{{- $lo := first $ends | atoi -}}
{{- $hi := last $ends | atoi -}}
{{- if or (lt $lo 1) (gt $hi 65535) (gt $lo $hi) -}}{{- $err = printf "%s is not a port or an ascending range of ports (1-65535)" . -}}{{- end -}}
{{- $count = add $count (sub $hi $lo) 1 -}}
{{- end -}}
{{- end -}}
{{- if and (not $err) (gt $count 4096) -}}{{- $err = "more than 4096 ports once its ranges are expanded, more than nftmesh takes (its iptables backend writes a rule per port)" -}}{{- end -}}
{{- end -}}
{{- $err -}}
{{- end -}}

{{/* linkerd2-cni's chart settings read under nftmesh's names: the CNI dirs,
iptablesMode as the backend, repairController as the repair controller,
logLevel as logging.level; what nftmesh has no use for is ignored. */}}
{{- define "nftmesh.linkerdChart" -}}
{{- $user := .user -}}
{{- $top := .top -}}
{{- $out := .out -}}
{{- range $pair := list (list "destCNINetDir" "cniConfDir") (list "destCNIBinDir" "cniBinDir") -}}
{{- $from := index $pair 0 -}}
{{- $to := index $pair 1 -}}
{{- $d := index $user $from -}}
{{- if not (kindIs "invalid" $d) -}}
{{- if and (hasKey $top $to) (ne (index $top $to | toString) (toString $d)) -}}
{{- $_ := set $out "refused" (append $out.refused (printf "%s=%s and %s=%s: the same host directory under linkerd2-cni's name and nftmesh's, with two values; keep one" $from ($d | toString | trunc 64) $to (index $top $to | toString | trunc 64))) -}}
{{- else -}}
{{- $_ := set $top $to (toString $d) -}}
{{- $_ := set $out "mapped" (append $out.mapped (printf "%s=%s → %s" $from ($d | toString | trunc 64) $to)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $user.iptablesMode -}}
{{- $b := get (dict "nft" "nftables" "legacy" "iptables-legacy" "plain" "auto") (toString .) -}}
{{- if not $b -}}
{{- $_ := set $out "refused" (append $out.refused (printf "iptablesMode=%s: linkerd2-cni's modes are nft, legacy and plain" (toString . | trunc 64))) -}}
{{- else if and (hasKey $top "backend") (ne (toString $top.backend) $b) -}}
{{- $_ := set $out "refused" (append $out.refused (printf "iptablesMode=%s and backend=%s: iptablesMode=%s is backend %s; keep one" . (toString $top.backend | trunc 64) . $b)) -}}
{{- else -}}
{{- $_ := set $top "backend" $b -}}
{{- $_ := set $out "mapped" (append $out.mapped (printf "iptablesMode=%s → backend=%s (nftmesh programs the rules itself, over netlink: no iptables command is run)" . $b)) -}}
{{- end -}}
{{- end -}}
{{- include "nftmesh.linkerdRepair" . -}}
{{- if hasKey $user "logLevel" -}}
{{- $lvl := get (dict "trace" "debug" "debug" "debug" "info" "info" "warn" "warn" "warning" "warn" "error" "error" "fatal" "error" "panic" "error") (lower (toString $user.logLevel)) -}}
{{- if dig "logging" "level" "" $top -}}
{{- $_ := set $out "ignored" (append $out.ignored "logLevel (logging.level is set)") -}}
{{- else if not $lvl -}}
{{- $_ := set $out "refused" (append $out.refused (printf "logLevel=%s: linkerd2-cni's levels are trace, debug, info, warn, error, fatal and panic" (toString $user.logLevel | trunc 64))) -}}
{{- else -}}
{{- $_ := set $top "logging" (mustMergeOverwrite ($top.logging | default dict) (dict "level" $lvl)) -}}
{{- $_ := set $out "mapped" (append $out.mapped (printf "logLevel=%s → logging.level=%s (the agent's and the plugin's)" $user.logLevel $lvl)) -}}
{{- end -}}
{{- end -}}
{{- if hasKey $user "useWaitFlag" -}}
{{- $_ := set $out "ignored" (append $out.ignored "useWaitFlag (iptables' -w: nftmesh runs no iptables command)") -}}
{{- end -}}
{{- if hasKey $user "enablePSP" -}}
{{- $_ := set $out "ignored" (append $out.ignored "enablePSP (PodSecurityPolicy is gone since Kubernetes 1.25)") -}}
{{- end -}}
{{- end -}}

{{/* repairController: Linkerd's deletes the pods whose
linkerd-network-validator failed; nftmesh's repair controller does that in
delete mode. Its own log and resource settings do not apply: it runs in the
agent. A repair.* value the user set wins. */}}
{{- define "nftmesh.linkerdRepair" -}}
{{- $user := .user -}}
{{- $top := .top -}}
{{- $out := .out -}}
{{- $rc := $user.repairController | default dict -}}
{{- $ur := $top.repair | default dict -}}
{{- if hasKey $rc "enabled" -}}
{{- if hasKey $ur "enabled" -}}
{{- $_ := set $out "ignored" (append $out.ignored "repairController.enabled (repair.enabled is set)") -}}
{{- else if $rc.enabled -}}
{{- $_ := set $top "repair" (mustMergeOverwrite (dict "enabled" true "repairPods" false "deletePods" true) $ur) -}}
{{- $_ := set $out "mapped" (append $out.mapped "repairController.enabled=true → repair.enabled=true, repair.deletePods=true (as Linkerd's, broken pods are deleted; repair.repairPods=true repairs them in place instead)") -}}
{{- else -}}
{{- $_ := set $top "repair" (mustMergeOverwrite (dict "enabled" false) $ur) -}}
{{- $_ := set $out "mapped" (append $out.mapped "repairController.enabled=false → repair.enabled=false (nftmesh's repair in place is off too; set repair.enabled=true to keep it)") -}}
{{- end -}}
{{- end -}}
{{- $unused := list -}}
{{- range $k := list "logLevel" "logFormat" "enableSecurityContext" "resources" -}}
{{- if hasKey $rc $k -}}{{- $unused = append $unused (printf "repairController.%s" $k) -}}{{- end -}}
{{- end -}}
{{- with $unused -}}
{{- $_ := set $out "ignored" (append $out.ignored (printf "%s (nftmesh's repair controller runs in the agent: logging.level, global.logAsJson and resources apply to it)" (join ", " .))) -}}
{{- end -}}
{{- end -}}

{{/* Keys linkerd2-cni shares with nftmesh in another form, read whether or
not the Linkerd profile is on: image (linkerd2-cni's image, a map),
resources in linkerd2-cni's form (cpu.request, ...), nodeAffinity. */}}
{{- define "nftmesh.linkerdShared" -}}
{{- $user := .user -}}
{{- $top := .top -}}
{{- $out := .out -}}
{{- if and (kindIs "map" $user.image) (not (omit $user.image "name" "version" "pullPolicy")) -}}
{{- $names := list -}}
{{- range $k := list "name" "version" -}}
{{- if hasKey $user.image $k -}}{{- $names = append $names (printf "image.%s" $k) -}}{{- end -}}
{{- end -}}
{{- with $names -}}
{{- $_ := set $out "ignored" (append $out.ignored (printf "%s (linkerd2-cni's image; nftmesh's image is nftmesh.image.repository and nftmesh.image.tag)" (join ", " .))) -}}
{{- end -}}
{{- with $user.image.pullPolicy -}}
{{- if $top.pullPolicy -}}
{{- $_ := set $out "ignored" (append $out.ignored "image.pullPolicy (pullPolicy is set)") -}}
{{- else -}}
{{- $_ := set $top "pullPolicy" . -}}
{{- $_ := set $out "mapped" (append $out.mapped (printf "image.pullPolicy=%s → pullPolicy" .)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $res := $top.resources -}}
{{- if and (kindIs "map" $res) (pick $res "cpu" "memory" "ephemeral-storage") -}}
{{- $req := dict -}}
{{- $lim := dict -}}
{{- range $name, $q := pick $res "cpu" "memory" "ephemeral-storage" -}}
{{- if kindIs "map" $q -}}
{{- with $q.request -}}{{- $_ := set $req $name . -}}{{- end -}}
{{- with $q.limit -}}{{- $_ := set $lim $name . -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- $new := omit $res "cpu" "memory" "ephemeral-storage" -}}
{{- if $req -}}{{- $_ := set $new "requests" (mustMergeOverwrite $req ($new.requests | default dict)) -}}{{- end -}}
{{- if $lim -}}{{- $_ := set $new "limits" (mustMergeOverwrite $lim ($new.limits | default dict)) -}}{{- end -}}
{{- $_ := set $top "resources" $new -}}
{{- if or $req $lim -}}
{{- $_ := set $out "mapped" (append $out.mapped "resources.<cpu|memory|ephemeral-storage>.<request|limit> (linkerd2-cni's form) → resources.requests/limits") -}}
{{- end -}}
{{- end -}}
{{- with $user.nodeAffinity -}}
{{- if dig "affinity" "nodeAffinity" nil $top -}}
{{- $_ := set $out "refused" (append $out.refused "nodeAffinity and affinity.nodeAffinity: the same setting under linkerd2-cni's name and nftmesh's; keep one") -}}
{{- else -}}
{{- $_ := set $top "affinity" (mustMergeOverwrite ($top.affinity | default dict) (dict "nodeAffinity" .)) -}}
{{- $_ := set $out "mapped" (append $out.mapped "nodeAffinity → affinity.nodeAffinity") -}}
{{- end -}}
{{- end -}}
{{- end -}}
