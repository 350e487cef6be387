{{/* The DaemonSet's fixed name: the plugin recognises the agent's own pods by it. */}}
{{- define "nftmesh.name" -}}nftmesh-agent{{- end -}}

{{- define "nftmesh.labels" -}}
app.kubernetes.io/name: nftmesh-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
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

{{- define "nftmesh.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
