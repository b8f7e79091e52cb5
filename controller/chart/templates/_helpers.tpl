{{/* Names fixed by the interface contract (CONTRACTS.md): other components and the
     tenant charts refer to them, so they do not follow the release name. */}}
{{- define "cozystack-gpu.controllerName" -}}cozystack-gpu-controller{{- end -}}
{{- define "cozystack-gpu.agentName" -}}cozystack-gpu-agent{{- end -}}
{{- define "cozystack-gpu.webhookService" -}}cozystack-gpu-webhook{{- end -}}
{{- define "cozystack-gpu.webhookSecret" -}}cozystack-gpu-webhook-tls{{- end -}}
{{- define "cozystack-gpu.metricsReader" -}}cozystack-gpu-metrics-reader{{- end -}}
{{- define "cozystack-gpu.metricsScraper" -}}cozystack-gpu-metrics-scraper{{- end -}}
{{- define "cozystack-gpu.webhookCertDir" -}}/var/run/cozystack-gpu/webhook-certs{{- end -}}
{{- define "cozystack-gpu.webhookClientCADir" -}}/var/run/cozystack-gpu/webhook-client-ca{{- end -}}

{{- define "cozystack-gpu.labels" -}}
app.kubernetes.io/part-of: cozystack-gpu
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "cozystack-gpu.controllerSelector" -}}
app.kubernetes.io/name: cozystack-gpu
app.kubernetes.io/component: controller
{{- end -}}

{{- define "cozystack-gpu.agentSelector" -}}
app.kubernetes.io/name: cozystack-gpu
app.kubernetes.io/component: agent
{{- end -}}

{{- define "cozystack-gpu.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The restrictive container context both workloads share. */}}
{{- define "cozystack-gpu.containerSecurityContext" -}}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{- define "cozystack-gpu.pullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The webhook configurations' caBundle annotation (cert-manager) or field (generated). */}}
{{- define "cozystack-gpu.webhookCertificateName" -}}cozystack-gpu-webhook{{- end -}}

{{- define "cozystack-gpu.webhookDNSNames" -}}
{{- $svc := include "cozystack-gpu.webhookService" . -}}
- {{ $svc }}
- {{ $svc }}.{{ .Release.Namespace }}
- {{ $svc }}.{{ .Release.Namespace }}.svc
- {{ $svc }}.{{ .Release.Namespace }}.svc.cluster.local
{{- end -}}

{{/* The generated webhook certificate as Secret data (base64 values): the one in the
     cluster when there is one, else a new CA and serving certificate. Made once per render
     and remembered, so the Secret, the caBundles and the checksum agree. */}}
{{- define "cozystack-gpu.generatedCertificate" -}}
{{- if not (hasKey .Values "_generatedCertificate") -}}
{{- $data := dict -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "cozystack-gpu.webhookSecret" .) -}}
{{- if and $existing (hasKey ($existing.data | default dict) "ca.crt") (hasKey ($existing.data | default dict) "tls.crt") (hasKey ($existing.data | default dict) "tls.key") -}}
{{- $data = pick $existing.data "ca.crt" "tls.crt" "tls.key" -}}
{{- else -}}
{{- $days := int .Values.webhook.certificates.generated.validityDays -}}
{{- $ca := genCA "cozystack-gpu-webhook-ca" $days -}}
{{- $names := include "cozystack-gpu.webhookDNSNames" . | fromYamlArray -}}
{{- $cert := genSignedCert (index $names 2) nil $names $days $ca -}}
{{- $data = dict "ca.crt" ($ca.Cert | b64enc) "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) -}}
{{- end -}}
{{- $_ := set .Values "_generatedCertificate" $data -}}
{{- end -}}
{{- toYaml (get .Values "_generatedCertificate") -}}
{{- end -}}

{{/* caBundle field (generated) or nothing (cert-manager injects it). */}}
{{- define "cozystack-gpu.caBundle" -}}
{{- if eq .Values.webhook.certificates.source "generated" -}}
caBundle: {{ get (include "cozystack-gpu.generatedCertificate" . | fromYaml) "ca.crt" }}
{{- end -}}
{{- end -}}

{{- define "cozystack-gpu.webhookAnnotations" -}}
{{- if eq .Values.webhook.certificates.source "cert-manager" -}}
cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/{{ include "cozystack-gpu.webhookCertificateName" . }}
{{- end -}}
{{- end -}}

{{/* Values that contradict each other are refused before anything is rendered: each would
     leave rawResourceNames: forbidden promised and unkept, without a word. Included by
     the controller's Deployment, which every release renders. */}}
{{- define "cozystack-gpu.refuseContradictions" -}}
{{- $forbidden := eq .Values.controller.settings.rawResourceNames "forbidden" -}}
{{- if and $forbidden (not .Values.webhook.enabled) -}}
{{- fail "controller.settings.rawResourceNames=forbidden needs webhook.enabled=true: without the webhooks (and the claims-label policy that comes with them) a VMI or pod with the label gpu.cozystack.io/claims: \"true\" passes the raw-name policy and nothing checks its claims; set webhook.enabled=true, or rawResourceNames=allowed" -}}
{{- end -}}
{{- if and $forbidden (not .Values.rawNamePolicy.enabled) -}}
{{- fail "controller.settings.rawResourceNames=forbidden needs rawNamePolicy.enabled=true: the raw-name ValidatingAdmissionPolicy is what refuses GPU resource names without claims, and without it nothing does; set rawNamePolicy.enabled=true, or rawResourceNames=allowed" -}}
{{- end -}}
{{- end -}}

{{- /* "true" when webhook.mutatingAdmissionPolicy is on and the API server serves
MutatingAdmissionPolicy (admissionregistration.k8s.io/v1):
the claim-protection finalizer is then put on by the API server, else by the claim webhook's
mutating half. Empty otherwise. */ -}}
{{- define "cozystack-gpu.servesMutatingPolicy" -}}
{{- if and .Values.webhook.mutatingAdmissionPolicy (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy") -}}true{{- end -}}
{{- end -}}
