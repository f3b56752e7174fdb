{{/* Common labels; call with (dict "ctx" $ "name" "vramfit"). Selectors use app.kubernetes.io/name only. */}}
{{- define "vramfit.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/part-of: vramfit
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version }}
{{- end -}}

{{/* Pod template labels: stable across chart versions. */}}
{{- define "vramfit.podLabels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/part-of: vramfit
{{- end -}}

{{- define "vramfit.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The secret the extender serves with (tls.crt, tls.key, ca.crt). */}}
{{- define "vramfit.servingSecret" -}}
{{- if .Values.certManager.enabled -}}
vramfit-webhook-tls
{{- else -}}
{{- required "tls.existingSecret is required when certManager.enabled is false" .Values.tls.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* kube-scheduler's client certificate secret. */}}
{{- define "vramfit.schedulerClientSecret" -}}
{{- if .Values.certManager.enabled -}}
vramfit-scheduler-client-tls
{{- else -}}
{{- required "tls.schedulerClientSecret is required when certManager.enabled is false" .Values.tls.schedulerClientSecret -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the assignment signing key (data key `key`). */}}
{{- define "vramfit.signingSecret" -}}
{{- .Values.signing.existingSecret | default "vramfit-signing" -}}
{{- end -}}
