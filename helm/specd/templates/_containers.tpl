{{/*
The cell's containers, written once for both layouts: (dict "ctx" $ "layout" "services"|"pod").
services: each component in its own workload behind its Service (ports named grpc/metrics);
pod: all of them in one pod, the router dialling the draft and target on the pod's loopback in
plaintext (that hop never leaves the pod), their ports named <component>-grpc/-metrics.
*/}}

{{/* A worker's port name: "grpc" in its own pod, "target-grpc" beside the router. */}}
{{- define "specd.portName" -}}
{{- if eq .layout "pod" -}}{{ printf "%s-%s" .component .port }}{{- else -}}{{ .port }}{{- end -}}
{{- end -}}

{{- define "specd.routerContainer" -}}
{{- $ctx := .ctx -}}
{{- $r := $ctx.Values.router -}}
{{- $pod := eq .layout "pod" -}}
{{- $c := dict "ctx" $ctx "component" "router" "port" $r.grpcPort "values" $r -}}
- name: router
  image: {{ include "specd.image" (dict "ctx" $ctx "gpu" false) }}
  imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
  command: [{{ printf "%s/specd-router" $ctx.Values.binDir | quote }}]
  args:
    - --listen=0.0.0.0:{{ $r.grpcPort }}
    {{- if $pod }}
    - --target=localhost:{{ $ctx.Values.target.grpcPort }}
    {{- if $ctx.Values.draft.enabled }}
    - --draft=localhost:{{ $ctx.Values.draft.grpcPort }}
    {{- end }}
    {{- else }}
    - --target={{ include "specd.serviceAddress" (dict "ctx" $ctx "component" "target" "port" $ctx.Values.target.grpcPort) }}
    {{- if $ctx.Values.draft.enabled }}
    - --draft={{ include "specd.serviceAddress" (dict "ctx" $ctx "component" "draft" "port" $ctx.Values.draft.grpcPort) }}
    {{- end }}
    {{- end }}
    - --model={{ include "specd.modelPath" $ctx }}
    - --metrics-port={{ $r.metricsPort }}
    - --metrics-address=0.0.0.0
    - --http-port={{ $r.httpPort }}
    - --http-address=0.0.0.0
    - --drain-grace-s={{ $ctx.Values.drainGraceSeconds }}
    - --startup-timeout-s={{ $ctx.Values.startupSeconds }}
    - --num-draft-tokens={{ $r.numDraftTokens }}
    {{- with $r.maxRunning }}
    - --max-running={{ . }}
    {{- end }}
    {{- with $r.maxQueue }}
    - --max-queue={{ . }}
    {{- end }}
    {{- with $r.maxBatchTokens }}
    - --max-batch-tokens={{ . }}
    {{- end }}
    {{- if not (kindIs "invalid" $r.prefillTokensWhileDecoding) }}
    - --prefill-tokens-while-decoding={{ $r.prefillTokensWhileDecoding }}
    {{- end }}
    {{- if not (kindIs "invalid" $r.stepMsWhileDecoding) }}
    - --step-ms-while-decoding={{ $r.stepMsWhileDecoding }}
    {{- end }}
    {{- with $r.maxNewTokensLimit }}
    - --max-new-tokens-limit={{ . }}
    {{- end }}
    {{- with $r.servedModelName }}
    - --served-model-name={{ . }}
    {{- end }}
    {{- if $r.apiKeysSecret }}
    - --api-keys-file=/etc/specd/api-keys/keys
    {{- end }}
    {{- if $ctx.Values.tls.enabled }}
    - --tls-cert=/etc/specd/tls/tls.crt
    - --tls-key=/etc/specd/tls/tls.key
    {{- if not $pod }}
    - --upstream-tls-ca=/etc/specd/tls/ca.crt
    - --upstream-tls-cert=/etc/specd/tls/tls.crt
    - --upstream-tls-key=/etc/specd/tls/tls.key
    {{- end }}
    {{- end }}
    {{- with $r.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - {name: grpc, containerPort: {{ $r.grpcPort }}, protocol: TCP}
    {{- if $r.httpPort }}
    - {name: http, containerPort: {{ $r.httpPort }}, protocol: TCP}
    {{- end }}
    - {name: metrics, containerPort: {{ $r.metricsPort }}, protocol: TCP}
  {{- include "specd.probes" $c | nindent 2 }}
  securityContext:
    {{- toYaml $ctx.Values.securityContext | nindent 4 }}
  resources:
    {{- toYaml $r.resources | nindent 4 }}
  volumeMounts:
    {{- include "specd.volumeMounts" $c | nindent 4 }}
    {{- if $r.apiKeysSecret }}
    - name: api-keys
      mountPath: /etc/specd/api-keys
      readOnly: true
    {{- end }}
{{- end -}}

{{- define "specd.draftContainer" -}}
{{- $ctx := .ctx -}}
{{- $d := $ctx.Values.draft -}}
{{- $pod := eq .layout "pod" -}}
{{- $c := dict "ctx" $ctx "component" "draft" "port" $d.grpcPort "values" $d "plaintext" $pod -}}
- name: draft
  image: {{ include "specd.image" (dict "ctx" $ctx "gpu" false) }}
  imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
  command: [{{ printf "%s/specd-draft" $ctx.Values.binDir | quote }}]
  args:
    - --listen=0.0.0.0:{{ $d.grpcPort }}
    {{- if eq $d.model "default" }}
    - --model={{ $d.draftDir }}/{{ trimSuffix ".gguf" $ctx.Values.model.file }}.draft.gguf
    - --borrow-from={{ include "specd.modelPath" $ctx }}
    {{- else if eq $d.model "self" }}
    - --model={{ include "specd.modelPath" $ctx }}
    - --layers={{ $d.layers }}
    {{- else if hasPrefix "/" $d.model }}
    - --model={{ $d.model }}
    - --borrow-from={{ include "specd.modelPath" $ctx }}
    {{- else }}
    - --model={{ $ctx.Values.model.dir }}/{{ $d.model }}
    - --borrow-from={{ include "specd.modelPath" $ctx }}
    {{- end }}
    - --threads={{ $d.threads }}
    - --prefix-caching={{ $d.prefixCaching }}
    - --metrics-port={{ $d.metricsPort }}
    - --metrics-address=0.0.0.0
    - --drain-grace-s={{ $ctx.Values.drainGraceSeconds }}
    {{- with $d.kvBlocks }}
    - --kv-blocks={{ . }}
    {{- end }}
    {{- if not $pod }}
    {{- include "specd.workerTlsArgs" $c | nindent 4 }}
    {{- end }}
    {{- with $d.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - {name: {{ include "specd.portName" (dict "layout" .layout "component" "draft" "port" "grpc") }}, containerPort: {{ $d.grpcPort }}, protocol: TCP}
    - {name: {{ include "specd.portName" (dict "layout" .layout "component" "draft" "port" "metrics") }}, containerPort: {{ $d.metricsPort }}, protocol: TCP}
  {{- include "specd.probes" $c | nindent 2 }}
  securityContext:
    {{- toYaml $ctx.Values.securityContext | nindent 4 }}
  resources:
    {{- toYaml $d.resources | nindent 4 }}
  volumeMounts:
    {{- include "specd.volumeMounts" $c | nindent 4 }}
{{- end -}}

{{/* Rank 0 (serves gRPC) and, for rank processes, one container per further rank. */}}
{{- define "specd.targetContainers" -}}
{{- $ctx := .ctx -}}
{{- $t := $ctx.Values.target -}}
{{- $pod := eq .layout "pod" -}}
{{- $c := dict "ctx" $ctx "component" "target" "port" $t.grpcPort "values" $t "plaintext" $pod -}}
{{- $processes := and (gt (int $t.worldSize) 1) (eq $t.tensorParallel "processes") -}}
{{- /* GPUs: one per rank process, or all of them for the one process of thread ranks. */ -}}
{{- $resources := deepCopy $t.resources -}}
{{- if $t.gpu.enabled -}}
{{- $limits := default (dict) $resources.limits -}}
{{- $_ := set $limits $t.gpu.resourceName (ternary 1 $t.worldSize $processes) -}}
{{- $_ := set $resources "limits" $limits -}}
{{- end -}}
- name: target
  image: {{ include "specd.image" (dict "ctx" $ctx "gpu" $t.gpu.enabled) }}
  imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
  command: [{{ printf "%s/specd-target" $ctx.Values.binDir | quote }}]
  args:
    - --listen=0.0.0.0:{{ $t.grpcPort }}
    - --model={{ include "specd.modelPath" $ctx }}
    - --threads={{ $t.threads }}
    - --world-size={{ $t.worldSize }}
    {{- if $processes }}
    - --rank=0
    - --rendezvous=127.0.0.1:{{ $t.rendezvousPort }}
    - --tp-bind-address=127.0.0.1
    - --tp-timeout-s={{ $t.tpTimeoutSeconds }}
    {{- end }}
    - --prefix-caching={{ $t.prefixCaching }}
    - --metrics-port={{ $t.metricsPort }}
    - --metrics-address=0.0.0.0
    - --drain-grace-s={{ $ctx.Values.drainGraceSeconds }}
    {{- with $t.kvBlocks }}
    - --kv-blocks={{ . }}
    {{- end }}
    {{- with $t.kvBlockSize }}
    - --kv-block-size={{ . }}
    {{- end }}
    {{- with $t.kvDtype }}
    - --kv-dtype={{ . }}
    {{- end }}
    {{- with $t.maxBatchTokens }}
    - --max-batch-tokens={{ . }}
    {{- end }}
    {{- if not $pod }}
    {{- include "specd.workerTlsArgs" $c | nindent 4 }}
    {{- end }}
    {{- with $t.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - {name: {{ include "specd.portName" (dict "layout" .layout "component" "target" "port" "grpc") }}, containerPort: {{ $t.grpcPort }}, protocol: TCP}
    - {name: {{ include "specd.portName" (dict "layout" .layout "component" "target" "port" "metrics") }}, containerPort: {{ $t.metricsPort }}, protocol: TCP}
  {{- include "specd.probes" $c | nindent 2 }}
  securityContext:
    {{- toYaml $ctx.Values.securityContext | nindent 4 }}
  resources:
    {{- toYaml $resources | nindent 4 }}
  volumeMounts:
    {{- include "specd.volumeMounts" $c | nindent 4 }}
{{- if $processes }}
{{- range $rank := untilStep 1 (int $t.worldSize) 1 }}
# Tensor-parallel rank {{ $rank }}: computes its slice, no gRPC. When a rank process
# dies the group exits (rank 0 non-zero within seconds) and the kubelet restarts the
# containers, which meet again at rank 0's rendezvous.
- name: target-rank-{{ $rank }}
  image: {{ include "specd.image" (dict "ctx" $ctx "gpu" $t.gpu.enabled) }}
  imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
  command: [{{ printf "%s/specd-target" $ctx.Values.binDir | quote }}]
  args:
    - --model={{ include "specd.modelPath" $ctx }}
    - --threads={{ $t.threads }}
    - --world-size={{ $t.worldSize }}
    - --rank={{ $rank }}
    - --rendezvous=127.0.0.1:{{ $t.rendezvousPort }}
    - --tp-bind-address=127.0.0.1
    - --tp-timeout-s={{ $t.tpTimeoutSeconds }}
    - --prefix-caching={{ $t.prefixCaching }}
    {{- with $t.kvBlocks }}
    - --kv-blocks={{ . }}
    {{- end }}
    {{- with $t.kvBlockSize }}
    - --kv-block-size={{ . }}
    {{- end }}
    {{- with $t.kvDtype }}
    - --kv-dtype={{ . }}
    {{- end }}
    {{- with $t.maxBatchTokens }}
    - --max-batch-tokens={{ . }}
    {{- end }}
  securityContext:
    {{- toYaml $ctx.Values.securityContext | nindent 4 }}
  resources:
    {{- toYaml $resources | nindent 4 }}
  volumeMounts:
    {{- include "specd.volumeMounts" $c | nindent 4 }}
{{- end }}
{{- end }}
{{- end -}}
