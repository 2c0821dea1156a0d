{{/* The chart's name, overridable. */}}
{{- define "sharder.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The base name of every object: the release name when it already contains the
chart name (e.g. release "sharder"), else "<release>-sharder".
*/}}
{{- define "sharder.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "sharder.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "sharder.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "sharder.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sharder
{{ include "sharder.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
{{- end }}

{{- define "sharder.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sharder.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sharder.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sharder.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Whether the metrics endpoint is reachable from outside the pod: only over
HTTPS with authentication; plain HTTP metrics listen on 127.0.0.1.
*/}}
{{- define "sharder.metricsServed" -}}
{{- if and .Values.metrics.enabled .Values.metrics.secure }}true{{ end }}
{{- end }}

{{- define "sharder.webhookServiceName" -}}
{{- printf "%s-webhook" (include "sharder.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sharder.webhookSecretName" -}}
{{- default (printf "%s-webhook-tls" (include "sharder.fullname" .)) .Values.webhook.secretName }}
{{- end }}

{{- define "sharder.certificateName" -}}
{{- printf "%s-webhook" (include "sharder.fullname" .) }}
{{- end }}

{{- define "sharder.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The certificate mode, checked. */}}
{{- define "sharder.certMode" -}}
{{- $mode := .Values.webhook.certificates.mode }}
{{- if not (has $mode (list "self-managed" "cert-manager")) }}
{{- fail (printf "webhook.certificates.mode %q: must be self-managed or cert-manager" $mode) }}
{{- end }}
{{- $mode }}
{{- end }}

{{/*
The ports the sharder listens on must differ: with hostNetwork they are the
node's ports, shared with everything else on the node.
*/}}
{{- define "sharder.checkPorts" -}}
{{- $ports := dict }}
{{- $listen := list (list "health.port" .Values.health.port) }}
{{- if .Values.webhook.enabled }}
{{- $listen = append $listen (list "webhook.port" .Values.webhook.port) }}
{{- end }}
{{- if .Values.metrics.enabled }}
{{- $listen = append $listen (list "metrics.port" .Values.metrics.port) }}
{{- end }}
{{- if .Values.pprof.enabled }}
{{- $listen = append $listen (list "pprof.port" .Values.pprof.port) }}
{{- end }}
{{- range $listen }}
{{- $key := toString (index . 1) }}
{{- if hasKey $ports $key }}
{{- fail (printf "%s and %s are both %s: the sharder listens on each port once" (get $ports $key) (index . 0) $key) }}
{{- end }}
{{- $_ := set $ports $key (index . 0) }}
{{- end }}
{{- end }}

{{/* The Secret holding the token the ServiceMonitor scrapes with. */}}
{{- define "sharder.scrapeTokenSecret" -}}
{{- default (printf "%s-metrics-scraper-token" (include "sharder.fullname" .)) .Values.metrics.serviceMonitor.authorization.credentials.name }}
{{- end }}
