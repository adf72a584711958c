{{/*
Shared names and labels (the `helm create` helper set). Every object of the chart carries
`longhaul.labels`; selectors use only `longhaul.selectorLabels` plus a component.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "longhaul.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The fully qualified app name: "<release>-<chart>", or just the release name when it already
contains the chart name. Truncated to 63 characters (the DNS label limit).
*/}}
{{- define "longhaul.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "<chart>-<version>" for the helm.sh/chart label. */}}
{{- define "longhaul.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "longhaul.labels" -}}
helm.sh/chart: {{ include "longhaul.chart" . }}
{{ include "longhaul.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: longhaul
{{- end }}

{{/* The labels that select this release's objects (never change them after install). */}}
{{- define "longhaul.selectorLabels" -}}
app.kubernetes.io/name: {{ include "longhaul.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selector labels of the operator pods. */}}
{{- define "longhaul.operatorSelectorLabels" -}}
{{ include "longhaul.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "longhaul.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "longhaul.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image reference; the tag defaults to the chart's appVersion. */}}
{{- define "longhaul.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The leader-election Lease name. */}}
{{- define "longhaul.leaseName" -}}
{{- default (printf "%s-leader" (include "longhaul.fullname" .) | trunc 63 | trimSuffix "-") .Values.operator.leaderElection.leaseName }}
{{- end }}
