{{- define "rewind.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "rewind.serviceAccountName" -}}
{{- default (include "rewind.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "rewind.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rewind.labels" -}}
{{ include "rewind.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/*
What the controller does in the namespaces it serves (deploy/rbac/controller.yaml;
with the archive on, deploy/rbac/argo-archive.yaml's ClusterRole too). `patch` on
pods only releases them from Argo's finalizer: templates/pod-policy.yaml refuses
the ServiceAccount any other change to a pod.
*/}}
{{- define "rewind.workRules" -}}
- apiGroups: ["argoproj.io"]
  resources: ["workflows"]
  verbs: ["get", "list", "watch", "update", "patch"]
{{- if .Values.archive.enabled }}
# Only archived retries create workflows (anew, from Argo's archive).
- apiGroups: ["argoproj.io"]
  resources: ["workflows"]
  verbs: ["create"]
{{- end }}
- apiGroups: ["rewind.dev"]
  resources: ["workflowretries"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: ["rewind.dev"]
  resources: ["workflowretries/status"]
  verbs: ["get", "update", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "delete", "deletecollection", "patch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{/*
The pod's affinity: .Values.affinity, plus replicas spread by
.Values.podAntiAffinity unless affinity.podAntiAffinity is given.
*/}}
{{- define "rewind.affinity" -}}
{{- $affinity := deepCopy .Values.affinity }}
{{- $spread := .Values.podAntiAffinity }}
{{- if and $spread.type (not (hasKey $affinity "podAntiAffinity")) }}
{{- $term := dict "topologyKey" $spread.topologyKey "labelSelector" (dict "matchLabels" (include "rewind.selectorLabels" . | fromYaml)) }}
{{- if eq $spread.type "required" }}
{{- $_ := set $affinity "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term)) }}
{{- else }}
{{- $_ := set $affinity "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) }}
{{- end }}
{{- end }}
{{- with $affinity }}
{{- toYaml . }}
{{- end }}
{{- end -}}


{{/*
The Secret holding the Argo API's certificate: the one given, or the chart's
self-signed one (templates/argo-api.yaml).
*/}}
{{- define "rewind.argoApiTLSSecret" -}}
{{- .Values.argoApi.tls.secretName | default (printf "%s-argo-api-tls" (include "rewind.fullname" .)) }}
{{- end -}}

{{/*
The path regular expressions of Argo's two retry calls, as the Ingress and the
HTTPRoute match them (a name or namespace is one path segment).
*/}}
{{- define "rewind.retryPaths" -}}
- /api/v1/workflows/[^/]+/[^/]+/retry
- /api/v1/archived-workflows/[^/]+/retry
{{- end -}}
