{{/*
Names, labels and the few derived values every template shares.
*/}}

{{- define "lingstream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name, at most 63 characters (DNS label). A release named like the chart keeps one copy.
*/}}
{{- define "lingstream.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "lingstream.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lingstream.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lingstream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "lingstream.labels" -}}
helm.sh/chart: {{ include "lingstream.chart" . }}
{{ include "lingstream.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: lingstream
{{- end }}

{{- define "lingstream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lingstream.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Image reference: a digest wins over a tag; an empty tag is the appVersion, "-cuda" for GPU pods.
*/}}
{{- define "lingstream.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- $tag := .Values.image.tag }}
{{- if not $tag }}
{{- $tag = ternary (printf "%s-cuda" .Chart.AppVersion) .Chart.AppVersion (gt (int (include "lingstream.gpus" .)) 0) }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "lingstream.device" -}}
{{- if .Values.config.device }}
{{- .Values.config.device }}
{{- else }}
{{- ternary "cuda" "cpu" (gt (int (include "lingstream.gpus" .)) 0) }}
{{- end }}
{{- end }}

{{/*
GPUs the settings need: the CUDA devices config.devices lists; else, on CUDA (config.device, or gpu.count > 0
without devices), one per model worker with threads placement and denoiseRanks per worker with processes; else 0.
*/}}
{{- define "lingstream.requiredGpus" -}}
{{- $c := .Values.config -}}
{{- $listed := 0 -}}
{{- range (default list $c.devices) }}{{ if hasPrefix "cuda:" . }}{{ $listed = add1 $listed }}{{ end }}{{ end -}}
{{- if gt $listed 0 -}}
{{- $listed -}}
{{- else if and (not $c.devices) (or (eq (toString $c.device) "cuda") (and (not $c.device) (gt (int .Values.gpu.count) 0))) -}}
{{- $ranks := ternary (int (default 1 $c.denoiseRanks)) 1 (eq (toString $c.stagePlacement) "processes") -}}
{{- mul (int (default 1 $c.numWorkers)) $ranks -}}
{{- else -}}
0
{{- end -}}
{{- end }}

{{/*
GPUs the pod asks for: gpu.count, or (0) as many as the settings need; fewer than they need fails the render.
*/}}
{{- define "lingstream.gpus" -}}
{{- $required := int (include "lingstream.requiredGpus" .) -}}
{{- $count := int .Values.gpu.count -}}
{{- if and (gt $count 0) (lt $count $required) -}}
{{- fail (printf "gpu.count is %d, but config.devices / numWorkers x denoiseRanks need %d GPUs" $count $required) -}}
{{- end -}}
{{- ternary $count $required (gt $count 0) -}}
{{- end }}

{{/*
The preStop hook waits up to the drain timeout, then SIGTERM lets the process close what is left: the grace
period must cover both, so it is derived here and nowhere else.
*/}}
{{- define "lingstream.terminationGracePeriodSeconds" -}}
{{- add (int64 .Values.config.drainTimeout) (int64 .Values.terminationGraceMarginSeconds) }}
{{- end }}

{{/*
Seconds as the service reads them: whole numbers without a decimal point (YAML numbers reach templates as floats,
and large ones would otherwise print as 2e+06).
*/}}
{{- define "lingstream.number" -}}
{{- if eq (float64 (int64 .)) (float64 .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{/*
Name of the Secret the pods read: the user's own, or the one this chart renders.
*/}}
{{- define "lingstream.secretName" -}}
{{- default (include "lingstream.fullname" .) .Values.existingSecret }}
{{- end }}

{{/*
Whether the chart's own Secret has anything to hold.
*/}}
{{- define "lingstream.chartSecretHasData" -}}
{{- if and (not .Values.existingSecret) (or .Values.livekit.url .Values.auth.apiKeys .Values.auth.tokenSecret (eq .Values.admission.backend "redis") (include "lingstream.recordingsS3" .) .Values.webhooks.secret) }}true{{ end }}
{{- end }}

{{/*
"true" when recordings are uploaded to an object store (recordings.enabled and recordings.s3.endpoint).
*/}}
{{- define "lingstream.recordingsS3" -}}
{{- if and .Values.recordings.enabled .Values.recordings.s3.endpoint }}true{{ end }}
{{- end }}

{{/*
Checks the schema cannot express. They also hold when schema validation is skipped.
*/}}
{{- define "lingstream.validate" -}}
{{- if and .Values.recordings.s3.endpoint (not .Values.recordings.enabled) }}
{{- fail "recordings.s3.endpoint needs recordings.enabled: a recording is written to the volume, then uploaded" }}
{{- end }}
{{- if include "lingstream.recordingsS3" . }}
{{- if not .Values.recordings.s3.bucket }}
{{- fail "recordings.s3.endpoint needs recordings.s3.bucket" }}
{{- end }}
{{- if and (not .Values.existingSecret) (or (not .Values.recordings.s3.accessKeyId) (not .Values.recordings.s3.secretAccessKey)) }}
{{- fail "recordings.s3.endpoint needs recordings.s3.accessKeyId and secretAccessKey (or existingSecret holding them)" }}
{{- end }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) (ne .Values.admission.backend "redis") (not .Values.autoscaling.enabled) }}
{{- fail "replicaCount > 1 needs admission.backend=redis: each pod would otherwise keep its own queue and slots" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (ne .Values.admission.backend "redis") }}
{{- fail "autoscaling.enabled needs admission.backend=redis: each pod would otherwise keep its own queue and slots" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail "autoscaling.minReplicas must not exceed autoscaling.maxReplicas" }}
{{- end }}
{{- if not .Values.existingSecret }}
{{- if and .Values.livekit.url (not (and .Values.livekit.apiKey .Values.livekit.apiSecret)) }}
{{- fail "livekit.url is set: give livekit.apiKey and livekit.apiSecret, or existingSecret" }}
{{- end }}
{{- if and (eq .Values.admission.backend "redis") (not .Values.admission.redisUrl) }}
{{- fail "admission.backend=redis: give admission.redisUrl, or existingSecret" }}
{{- end }}
{{- end }}
{{- $c := .Values.config }}
{{- if and (gt (int (default 1 $c.denoiseRanks)) 1) (ne (toString $c.stagePlacement) "processes") }}
{{- fail "config.denoiseRanks > 1 needs config.stagePlacement=processes (threads run one rank in the service process)" }}
{{- end }}
{{- if and (eq (toString $c.device) "cpu") (gt (int (include "lingstream.requiredGpus" .)) 0) }}
{{- fail "config.device=cpu contradicts the CUDA devices in config.devices" }}
{{- end }}
{{- $m := .Values.model }}
{{- if and (eq $m.name "lingbot-fast") (eq (empty $m.persistentVolumeClaim) (empty $m.hostPath)) }}
{{- fail "model.name=lingbot-fast: give exactly one of model.persistentVolumeClaim and model.hostPath (the weights)" }}
{{- end }}
{{- if and (eq $m.name "lingbot-fast") (gt (int (default 1 $c.denoiseRanks)) 1) }}
{{- fail "model.name=lingbot-fast runs its DiT on one rank: config.denoiseRanks must be 1" }}
{{- end }}
{{- $pdb := .Values.podDisruptionBudget }}
{{- if and $pdb.enabled (eq (kindIs "invalid" $pdb.maxUnavailable) (kindIs "invalid" $pdb.minAvailable)) }}
{{- fail "podDisruptionBudget: set exactly one of maxUnavailable and minAvailable" }}
{{- end }}
{{- end }}
