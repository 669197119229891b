{{/* Names and labels, and the checks of the values that would otherwise fail only in the pods. */}}

{{- define "cotx.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 57 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 57 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The headless Service that gives each pod its DNS name (its advertise_url). */}}
{{- define "cotx.peers" -}}{{ include "cotx.fullname" . }}-peers{{- end -}}

{{- define "cotx.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: coordinator
{{- end -}}

{{- define "cotx.labels" -}}
{{ include "cotx.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* A TOML string: JSON's string escapes are TOML's (\" \\ \n \uXXXX). */}}
{{- define "cotx.tomlString" -}}{{ . | toString | toJson }}{{- end -}}

{{/* A section's keys from a map of scalars, as `key = value` lines, sorted by key. */}}
{{- define "cotx.tomlKeys" -}}
{{- $lines := list -}}
{{- range $k, $v := . -}}
{{- $lines = append $lines (printf "%s = %s" $k (toJson $v)) -}}
{{- end -}}
{{- join "\n" $lines -}}
{{- end -}}

{{/* The values a daemon cannot start without, refused at `helm install` with the fix
     rather than by a pod in CrashLoopBackOff. */}}
{{- define "cotx.validate" -}}
{{- $v := .Values -}}
{{- if not (regexMatch "^[A-Za-z0-9_-]*$" $v.nodeIdPrefix) -}}
{{- fail (printf "nodeIdPrefix %q: only A-Z a-z 0-9 _ - (it starts every daemon's node_id)" $v.nodeIdPrefix) -}}
{{- end -}}
{{- $maxId := printf "%s%d" $v.nodeIdPrefix (sub (int $v.replicas) 1) -}}
{{- if gt (len $maxId) 16 -}}
{{- fail (printf "nodeIdPrefix %q is too long: node id %q of the last replica is over 16 characters" $v.nodeIdPrefix $maxId) -}}
{{- end -}}
{{- if lt (int $v.replicas) 1 -}}
{{- fail "replicas must be at least 1" -}}
{{- end -}}
{{- if not $v.tls.secretName -}}
{{- fail "tls.secretName is required: the daemons listen on the pod's address, and the daemon serves plain HTTP on loopback only (a kubernetes.io/tls Secret naming the Services)" -}}
{{- end -}}
{{- if not $v.auth.secretName -}}
{{- fail "auth.secretName is required: a Secret with the client, operator (and metrics) credentials, each at least 16 characters" -}}
{{- end -}}
{{- if not (or $v.store.dsn $v.store.dsnSecret.name) -}}
{{- fail "store.dsn or store.dsnSecret.name is required: the PostgreSQL decision store the daemons share" -}}
{{- end -}}
{{- range $v.resources -}}
{{- if not (regexMatch "^[A-Za-z0-9_-]{1,64}$" (.name | default "")) -}}
{{- fail (printf "resources: name %q: 1-64 of A-Z a-z 0-9 _ -" (.name | default "")) -}}
{{- end -}}
{{- if not (or .dsn (and .dsnSecret .dsnSecret.name)) -}}
{{- fail (printf "resources %q: dsn or dsnSecret.name is required" .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
