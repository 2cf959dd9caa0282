{{/* The release's name for its objects, at most 52 characters (room for
"-meta-N" and the controller's suffixes). */}}
{{- define "nodekernel.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "nodekernel.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nodekernel.labels" -}}
{{ include "nodekernel.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "nodekernel.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "nodekernel.tokenSecret" -}}
{{- .Values.security.token.existingSecret | default (printf "%s-token" (include "nodekernel.fullname" .)) -}}
{{- end -}}

{{/* The metadata servers' addresses, in partition order: the list every
server and client of the cluster shares. */}}
{{- define "nodekernel.metaAddresses" -}}
{{- $full := include "nodekernel.fullname" . -}}
{{- $list := list -}}
{{- range $i := until (int .Values.meta.partitions) -}}
{{- $list = append $list (printf "%s-meta-%d.%s-meta.%s.svc.%s:%d" $full $i $full $.Release.Namespace $.Values.clusterDomain (int $.Values.meta.port)) -}}
{{- end -}}
{{- join "," $list -}}
{{- end -}}

{{/* Checks of values that the schema cannot express. */}}
{{- define "nodekernel.validate" -}}
{{- if gt (int .Values.meta.replicasPerPartition) 1 -}}
{{- fail "meta.replicasPerPartition > 1 needs replicated metadata partitions, which NodeKernel does not have yet (issue 42): a partition is one metadata server" -}}
{{- end -}}
{{- if and .Values.security.tls.enabled (not .Values.security.tls.existingSecret) -}}
{{- fail "security.tls.enabled needs security.tls.existingSecret: a Secret with ca.crt, tls.crt and tls.key (`nk tls new DIR --host NAME` makes them)" -}}
{{- end -}}
{{- if not (or .Values.store.dram.enabled .Values.store.file.enabled) -}}
{{- fail "store.dram.enabled and store.file.enabled are both false: the cluster would have no storage server" -}}
{{- end -}}
{{- if and .Values.store.file.persistent (not .Values.store.file.hostPath) -}}
{{- fail "store.file.persistent needs store.file.hostPath: an emptyDir is gone with its pod" -}}
{{- end -}}
{{- end -}}

{{/* The environment every nk container gets. */}}
{{- define "nodekernel.env" -}}
- name: NK_CONFIG
  value: /etc/nodekernel/nodekernel.toml
- name: NK_RUNTIME_DIR
  value: /run/nodekernel
- name: RUST_LOG
  value: info
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end -}}

{{/* Volumes every pod mounts: the configuration, the token, TLS, and the
writable places of a read-only root file system. */}}
{{- define "nodekernel.volumes" -}}
- name: config
  configMap:
    name: {{ include "nodekernel.fullname" . }}-config
- name: token
  secret:
    secretName: {{ include "nodekernel.tokenSecret" . }}
    defaultMode: 0440
    items:
      - key: token
        path: token
{{- if .Values.security.tls.enabled }}
- name: tls
  secret:
    secretName: {{ .Values.security.tls.existingSecret }}
    defaultMode: 0440
{{- end }}
- name: run
  emptyDir:
    medium: Memory
    sizeLimit: 16Mi
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- end -}}

{{- define "nodekernel.volumeMounts" -}}
- name: config
  mountPath: /etc/nodekernel
  readOnly: true
- name: token
  mountPath: /etc/nodekernel-token
  readOnly: true
{{- if .Values.security.tls.enabled }}
- name: tls
  mountPath: /etc/nodekernel-tls
  readOnly: true
{{- end }}
- name: run
  mountPath: /run/nodekernel
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/* Probes of a container whose admin port is named by the argument. */}}
{{- define "nodekernel.probes" -}}
readinessProbe:
  httpGet:
    path: /readyz
    port: {{ . }}
  periodSeconds: 2
  failureThreshold: 3
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ . }}
  initialDelaySeconds: 10
  periodSeconds: 10
  failureThreshold: 6
{{- end -}}
