{{/* The chart's name. */}}
{{- define "ringleader.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object names: <release>-operator ("ringleader-operator" for the
     documented `helm install ringleader`), the same as manifests/. */}}
{{- define "ringleader.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "ringleader.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ringleader.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "ringleader.labels" -}}
{{ include "ringleader.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ringleader.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ringleader.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ringleader.leaseName" -}}
{{- default (include "ringleader.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{- define "ringleader.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* What the operator does, as RBAC rules: one list for the ClusterRole
     (all namespaces) and for each watched namespace's Role. The README
     ("Deploying on Kubernetes") justifies each. */}}
{{- define "ringleader.rules" -}}
- apiGroups: [ringleader.dev]
  resources: [trainingjobs]
  verbs: [get, list, watch]
- apiGroups: [ringleader.dev]
  resources: [trainingjobs/status]
  verbs: [patch]
- apiGroups: [ringleader.dev]
  resources: [trainingjobs/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete]
- apiGroups: [""]
  resources: [services, serviceaccounts]
  verbs: [get, create]
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update, patch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
{{- end }}
