{{/* Whether the controller serves arrivals over TLS with its own certificate ("true" or ""). */}}
{{- define "gangjob.ownCert" -}}
{{- with .Values.arrivals }}{{ if and .enabled .tls.enabled (not .tls.certManager.enabled) }}true{{ end }}{{ end }}
{{- end }}

{{/* Whether it serves cert-manager's certificate ("true" or ""). */}}
{{- define "gangjob.certManager" -}}
{{- with .Values.arrivals }}{{ if and .enabled .tls.enabled .tls.certManager.enabled }}true{{ end }}{{ end }}
{{- end }}
