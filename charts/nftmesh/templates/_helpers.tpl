{{/* The DaemonSet's fixed name: the plugin recognises the agent's own pods by it. */}}
{{- define "nftmesh.name" -}}nftmesh-agent{{- end -}}

{{- define "nftmesh.labels" -}}
app.kubernetes.io/name: nftmesh-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.revision }}
istio.io/rev: {{ . | quote }}
{{- end }}
{{- with .Values.ownerName }}
install.operator.istio.io/owning-resource: {{ . | quote }}
{{- end }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "nftmesh.selectorLabels" -}}
app.kubernetes.io/name: nftmesh-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The repair action that applies, with the agent's precedence: repair in place, delete, label. */}}
{{- define "nftmesh.repairMode" -}}
{{- if .Values.repair.enabled -}}
{{- if .Values.repair.repairPods -}}repair
{{- else if .Values.repair.deletePods -}}delete
{{- else if .Values.repair.labelPods -}}label
{{- end -}}
{{- end -}}
{{- end -}}

{{/* nftmesh's image: nftmesh.image.repository, with its digest when set,
else its tag (default: the chart's appVersion, the version `make image`
tags). Istio's hub, image, tag and variant (and their global forms) name
Istio's install-cni image and are never read. */}}
{{- define "nftmesh.image" -}}
{{- $img := dig "image" dict (.Values.nftmesh | default dict) -}}
{{- $repo := $img.repository | default "ghcr.io/nftmesh/nftmesh" -}}
{{- if $img.digest -}}
{{- $repo }}@{{ $img.digest }}
{{- else -}}
{{- $repo }}:{{ $img.tag | default .Chart.AppVersion | toString }}
{{- end -}}
{{- end -}}

{{- define "nftmesh.pullPolicy" -}}
{{- $g := .Values.global | default dict -}}
{{- $img := dig "image" dict (.Values.nftmesh | default dict) -}}
{{- $img.pullPolicy | default .Values.pullPolicy | default $g.imagePullPolicy | default "IfNotPresent" -}}
{{- end -}}

{{/* imagePullSecrets ([{name}]) and Istio's global.imagePullSecrets (names), as a YAML list. */}}
{{- define "nftmesh.pullSecrets" -}}
{{- $g := .Values.global | default dict -}}
{{- $out := list -}}
{{- range concat (.Values.imagePullSecrets | default list) ($g.imagePullSecrets | default list) -}}
{{- $s := ternary . (dict "name" .) (kindIs "map" .) -}}
{{- if not (has $s $out) -}}{{- $out = append $out $s -}}{{- end -}}
{{- end -}}
{{- if $out -}}{{ toYaml $out }}{{- end -}}
{{- end -}}

{{/* The host's CNI bin dir; empty picks GKE's when the platform or the
server's version says GKE, as Istio's chart does. */}}
{{- define "nftmesh.cniBinDir" -}}
{{- $gke := or (eq .Values.platform "gke") (contains "-gke" .Capabilities.KubeVersion.Version) -}}
{{- .Values.cniBinDir | default (ternary "/home/kubernetes/bin" "/opt/cni/bin" $gke) -}}
{{- end -}}

{{- define "nftmesh.logLevel" -}}
{{- $g := .Values.global | default dict -}}
{{- .Values.logging.level | default (dig "logging" "level" "" $g) | default "info" -}}
{{- end -}}

{{/* JSON lines unless global.logAsJson is set to false (Istio's default
is text; nftmesh's is JSON). */}}
{{- define "nftmesh.logFormat" -}}
{{- $g := .Values.global | default dict -}}
{{- if and (hasKey $g "logAsJson") (not (kindIs "invalid" $g.logAsJson)) (not $g.logAsJson) -}}text{{- else -}}json{{- end -}}
{{- end -}}

{{/* global.nativeNftables (Istio's switch to nftables) turns auto into nftables. */}}
{{- define "nftmesh.backend" -}}
{{- $g := .Values.global | default dict -}}
{{- if and (eq .Values.backend "auto") $g.nativeNftables -}}nftables{{- else -}}{{ .Values.backend }}{{- end -}}
{{- end -}}

{{/* The Multus network as namespace and name. */}}
{{- define "nftmesh.multusNamespace" -}}{{ splitList "/" .Values.multusNetwork | first }}{{- end -}}
{{- define "nftmesh.multusName" -}}{{ splitList "/" .Values.multusNetwork | last }}{{- end -}}

{{/* Whether global.resourceScope lets the chart render resources of a
scope ("cluster" or "namespace"). */}}
{{- define "nftmesh.inScope" -}}
{{- $s := dig "resourceScope" "all" (.ctx.Values.global | default dict) -}}
{{- if or (eq $s "all") (eq $s .scope) -}}true{{- end -}}
{{- end -}}

{{/* A scalar as the string an environment variable holds: whole numbers
without an exponent (YAML numbers arrive as floats), booleans as true/false. */}}
{{- define "nftmesh.envValue" -}}
{{- if kindIs "float64" . -}}
{{- if eq (floor .) . -}}{{ printf "%.0f" . }}{{- else -}}{{ . }}{{- end -}}
{{- else if kindIs "invalid" . -}}
{{- else -}}{{ toString . }}{{- end -}}
{{- end -}}

{{/* Resource requirements without null entries, so a user's null removes a
default; empty resources fall back to global.defaultResources. */}}
{{- define "nftmesh.resources" -}}
{{- $g := .Values.global | default dict -}}
{{- $r := .Values.resources | default $g.defaultResources | default dict -}}
{{- $out := dict -}}
{{- range $kind, $vals := $r -}}
{{- $kept := dict -}}
{{- range $name, $q := ($vals | default dict) -}}
{{- if not (kindIs "invalid" $q) -}}{{- $_ := set $kept $name $q -}}{{- end -}}
{{- end -}}
{{- if $kept -}}{{- $_ := set $out $kind $kept -}}{{- end -}}
{{- end -}}
{{- if $out -}}{{ toYaml $out }}{{- end -}}
{{- end -}}

{{/* Whether the chart grants the agent its node rights (nodeTaint: take
the not-ready taint off its own node). Only where the
ValidatingAdmissionPolicy that holds them to that node exists (Kubernetes
>= 1.30): RBAC alone would grant every node. `helm template` without
--kube-version renders for Kubernetes 1.20, so without them. */}}
{{- define "nftmesh.nodeRights" -}}
{{- if and .Values.nodeTaint.enabled (or (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") (semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version)) -}}true{{- end -}}
{{- end -}}

{{/* Stops the render with . as the message, printed alike by helm install,
template and lint: "execution error at (<caller's file:line:col>): <message>".
helm lint turns fail into a log line and renders on, so a second stop
follows: ranging over a string fails in every mode, and with the text in
the markers helm puts around fail's own message, helm cuts the error down
to that message as it does for fail. Both report the location of the
include, so call this from a top-level template. */}}
{{- define "nftmesh.fail" -}}
{{- fail . -}}
{{- $plain := printf "%s%s%s" (upper "helm_err_start") . (upper "helm_err_end") -}}
{{- range $plain }}{{ end -}}
{{- end -}}

{{/* The Levenshtein distance of two words (list a b), case ignored. */}}
{{- define "nftmesh.editDistance" -}}
{{- $a := splitList "" (lower (index . 0)) -}}
{{- $b := splitList "" (lower (index . 1)) -}}
{{- $prev := until (add1 (len $b) | int) -}}
{{- range $i, $ca := $a -}}
{{- $row := list (add1 $i) -}}
{{- range $j, $cb := $b -}}
{{- $row = append $row (min (add1 (index $prev (add1 $j))) (add1 (last $row)) (add (index $prev $j) (ternary 0 1 (eq $ca $cb)))) -}}
{{- end -}}
{{- $prev = $row -}}
{{- end -}}
{{- last $prev -}}
{{- end -}}

{{/* The word of .among closest to .word, or "" when none is near enough
to be a misspelling of it: at most a third of its letters apart (two for
short words). */}}
{{- define "nftmesh.closest" -}}
{{- $word := .word | toString -}}
{{- $best := "" -}}
{{- $bestDistance := max 2 (div (len $word) 3) | add1 -}}
{{- range .among -}}
{{- $d := include "nftmesh.editDistance" (list $word .) | atoi -}}
{{- if lt $d $bestDistance -}}
{{- $best = . -}}
{{- $bestDistance = $d -}}
{{- end -}}
{{- end -}}
{{- $best -}}
{{- end -}}
