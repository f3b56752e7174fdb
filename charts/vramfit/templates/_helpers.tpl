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

{{/* Seconds in a Go duration ("10s", "1m30s", "1500ms"; values.schema.json has checked its form). */}}
{{- define "vramfit.durationSeconds" -}}
{{- $total := 0.0 -}}
{{- $units := dict "h" 3600.0 "m" 60.0 "s" 1.0 "ms" 0.001 "us" 0.000001 "µs" 0.000001 "ns" 0.000000001 -}}
{{- range regexFindAll "[0-9.]+(h|ms|us|µs|ns|m|s)" . -1 -}}
{{- $total = addf $total (mulf (float64 (regexFind "^[0-9.]+" .)) (get $units (regexReplaceAll "^[0-9.]+" . ""))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
What values.schema.json cannot say, checked before anything is installed; renders nothing. Each failure is
one line naming the value and what to set.
*/}}
{{- define "vramfit.checks" -}}
{{- $wait := 5.0 -}}
{{- if hasKey .Values.extender.config "admission_wait_s" }}{{ $wait = float64 .Values.extender.config.admission_wait_s }}{{ end -}}
{{- $timeout := float64 (include "vramfit.durationSeconds" .Values.scheduler.httpTimeout) -}}
{{- if gt (addf $wait 2.0) $timeout -}}
{{- fail (printf "extender.config.admission_wait_s (%v s) must be at most scheduler.httpTimeout (%s) minus 2 s: kube-scheduler gives up on a bind after httpTimeout, and a bind may wait admission_wait_s for the node's previous pod before it writes the Binding" $wait .Values.scheduler.httpTimeout) -}}
{{- end -}}
{{- include "vramfit.checkPodSecurity" . -}}
{{- end -}}

{{/*
The node agent needs the `privileged` Pod Security level (hostPath, hostPID, root). `helm install
--create-namespace` makes the namespace without that label, and a cluster whose default level is stricter then
refuses the agent's pods with nothing but a DaemonSet event. Against a cluster (install, upgrade,
--dry-run=server) the namespace is looked up; `helm template` has no cluster and skips this.
*/}}
{{- define "vramfit.checkPodSecurity" -}}
{{- if and .Values.nodeAgent.enabled .Values.namespace.checkPodSecurity (not .Values.namespace.create) -}}
{{- if lookup "v1" "Namespace" "" "kube-system" -}}
{{- $name := .Release.Namespace -}}
{{- $fix := printf "kubectl label namespace %s pod-security.kubernetes.io/enforce=privileged --overwrite" $name -}}
{{- $ns := lookup "v1" "Namespace" "" $name -}}
{{- if not $ns -}}
{{- fail (printf "namespace %s does not exist yet, and helm install --create-namespace would make it without the Pod Security label the node agent needs (privileged): run kubectl create namespace %s && %s, then helm install without --create-namespace (or set namespace.checkPodSecurity=false where no Pod Security admission applies)" $name $name $fix) -}}
{{- end -}}
{{- $level := get ($ns.metadata.labels | default dict) "pod-security.kubernetes.io/enforce" -}}
{{- if and $level (ne $level "privileged") -}}
{{- fail (printf "namespace %s enforces Pod Security level %s, which refuses the node agent (hostPath, hostPID, root): run %s (or set namespace.checkPodSecurity=false)" $name $level $fix) -}}
{{- else if and (not $level) (not .Release.IsUpgrade) -}}
{{- fail (printf "namespace %s sets no Pod Security level, so the cluster's default applies, and a stricter default refuses the node agent (hostPath, hostPID, root): run %s (or set namespace.checkPodSecurity=false)" $name $fix) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Whether the extender may run its DRA mode (extender.config.dra auto or true): the DRA RBAC and the webhook's
resourceClaims condition are rendered only then. */}}
{{- define "vramfit.draEnabled" -}}
{{- if ne (toString .Values.extender.config.dra) "false" }}true{{ end }}
{{- end }}
