{{/*
Named templates. Those taking a dict ("root": the top-level context, "values": the citewarden
values) work both inside this chart and from an app chart that has citewarden as a
dependency, where .Chart and .Values belong to the app.
*/}}

{{/* The image tag when image.tag is empty; tests keep it equal to Chart.yaml appVersion. */}}
{{- define "citewarden.appVersion" -}}0.1.0{{- end }}

{{- define "citewarden.name" -}}
{{- default "citewarden" .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* fullname from (dict "root" . "values" .Values); the chart name is fixed so the result is
the same whether called here or from a parent chart. */}}
{{- define "citewarden.fullnameFor" -}}
{{- $v := .values -}}
{{- if $v.fullnameOverride }}
{{- $v.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default "citewarden" $v.nameOverride }}
{{- if contains $name .root.Release.Name }}
{{- .root.Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .root.Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "citewarden.fullname" -}}
{{- include "citewarden.fullnameFor" (dict "root" . "values" .Values) }}
{{- end }}

{{- define "citewarden.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "citewarden.selectorLabels" -}}
app.kubernetes.io/name: {{ include "citewarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "citewarden.labels" -}}
helm.sh/chart: {{ include "citewarden.chart" . }}
{{ include "citewarden.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: citewarden
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "citewarden.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "citewarden.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* image reference from (dict "root" . "values" .Values) */}}
{{- define "citewarden.image" -}}
{{- $img := .values.image -}}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- $tag := $img.tag | default (include "citewarden.appVersion" .) }}
{{- printf "%s:%s" $img.repository $tag }}
{{- end }}
{{- end }}

{{/* The policy files as a filename -> YAML text map, serialised with toYaml. */}}
{{- define "citewarden.policyData" -}}
{{- $files := dict -}}
{{- if .values.policies }}
{{- range $file, $body := .values.policies }}
{{- if kindIs "string" $body }}
{{- $_ := set $files $file $body }}
{{- else }}
{{- $_ := set $files $file (toYaml $body) }}
{{- end }}
{{- end }}
{{- else }}
{{- $_ := set $files "default.yaml" (include "citewarden.defaultPolicy" .root) }}
{{- end }}
{{- toYaml $files }}
{{- end }}

{{/* The files to load, in order. */}}
{{- define "citewarden.policyFiles" -}}
{{- $opts := .values.policyOptions -}}
{{- if $opts.files }}
{{- toYaml $opts.files }}
{{- else if $opts.existingConfigMap }}
{{- fail "policyOptions.files must list the policy filenames of policyOptions.existingConfigMap, in load order" }}
{{- else }}
{{- keys (include "citewarden.policyData" . | fromYaml) | sortAlpha | toYaml }}
{{- end }}
{{- end }}

{{- define "citewarden.policyConfigMapName" -}}
{{- .values.policyOptions.existingConfigMap | default (printf "%s-policies" (include "citewarden.fullnameFor" .)) }}
{{- end }}

{{- define "citewarden.policyChecksum" -}}
{{- include "citewarden.policyData" . | sha256sum }}
{{- end }}

{{/* Pod annotations that roll pods when the policies change; empty when turned off. */}}
{{- define "citewarden.policyAnnotations" -}}
{{- if and .values.policyOptions.rolloutOnChange (not .values.policyOptions.existingConfigMap) -}}
checksum/policies: {{ include "citewarden.policyChecksum" . }}
{{- end }}
{{- end }}

{{/*
The gateway container, from (dict "root" . "values" .Values "upstream" URL "name" NAME).
Shared by the standalone Deployment and the sidecar.
*/}}
{{- define "citewarden.container" -}}
{{- $v := .values -}}
{{- if and (hasKey $v "workers") (ne (int $v.workers) 1) }}
{{- fail "workers was removed: the gateway runs one process per container; scale out with replicaCount or autoscaling.enabled (docs/operations.md \"One process per container\")" }}
{{- end -}}
{{- $grace := int $v.shutdownGraceSeconds -}}
{{- $sleep := int $v.preStopSleepSeconds -}}
{{- $mount := $v.policyOptions.mountPath -}}
{{- $paths := list -}}
{{- range (include "citewarden.policyFiles" . | fromYamlArray) }}
{{- $paths = append $paths (printf "%s/%s" $mount .) }}
{{- end -}}
name: {{ .name | default "citewarden" }}
image: {{ include "citewarden.image" . | quote }}
imagePullPolicy: {{ $v.image.pullPolicy }}
{{- with $v.extraArgs }}
args:
  {{- toYaml . | nindent 2 }}
{{- end }}
env:
  - name: CITEWARDEN_UPSTREAM
    value: {{ .upstream | quote }}
  - name: CITEWARDEN_POLICY
    value: {{ join ":" $paths | quote }}
  - name: CITEWARDEN_HOST
    value: "0.0.0.0"
  - name: CITEWARDEN_PORT
    value: {{ $v.ports.proxy | quote }}
  - name: CITEWARDEN_ADMIN_PORT
    value: {{ $v.ports.admin | quote }}
  - name: CITEWARDEN_SHUTDOWN_GRACE
    value: {{ $grace | quote }}
  {{- range $key, $env := dict "caFile" "CITEWARDEN_UPSTREAM_CA_FILE" "clientCert" "CITEWARDEN_UPSTREAM_CLIENT_CERT" "clientKey" "CITEWARDEN_UPSTREAM_CLIENT_KEY" }}
  {{- with index ($v.upstream | default dict) $key }}
  - name: {{ $env }}
    value: {{ . | quote }}
  {{- end }}
  {{- end }}
  {{- with $v.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with $v.extraEnvFrom }}
envFrom:
  {{- toYaml . | nindent 2 }}
{{- end }}
ports:
  - name: http
    containerPort: {{ $v.ports.proxy }}
    protocol: TCP
  - name: admin
    containerPort: {{ $v.ports.admin }}
    protocol: TCP
{{- if $v.probes.startup.enabled }}
startupProbe:
  httpGet:
    path: /readyz
    port: admin
  periodSeconds: {{ $v.probes.startup.periodSeconds }}
  timeoutSeconds: {{ $v.probes.startup.timeoutSeconds }}
  failureThreshold: {{ $v.probes.startup.failureThreshold }}
{{- end }}
livenessProbe:
  httpGet:
    path: /healthz
    port: admin
  periodSeconds: {{ $v.probes.liveness.periodSeconds }}
  timeoutSeconds: {{ $v.probes.liveness.timeoutSeconds }}
  failureThreshold: {{ $v.probes.liveness.failureThreshold }}
readinessProbe:
  httpGet:
    path: /readyz
    port: admin
  periodSeconds: {{ $v.probes.readiness.periodSeconds }}
  timeoutSeconds: {{ $v.probes.readiness.timeoutSeconds }}
  failureThreshold: {{ $v.probes.readiness.failureThreshold }}
{{- if gt $sleep 0 }}
lifecycle:
  preStop:
    sleep:
      seconds: {{ $sleep }}
{{- end }}
resources:
  {{- toYaml $v.resources | nindent 2 }}
securityContext:
  {{- toYaml $v.securityContext | nindent 2 }}
volumeMounts:
  - name: citewarden-policies
    mountPath: {{ $mount }}
    readOnly: true
  - name: citewarden-tmp
    mountPath: /tmp
  {{- include "citewarden.checkExtraMounts" . }}
  {{- with $v.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* Every extraVolumeMounts entry names a volume of extraVolumes (or a built-in one). */}}
{{- define "citewarden.checkExtraMounts" -}}
{{- $names := list "citewarden-policies" "citewarden-tmp" -}}
{{- range .values.extraVolumes }}
{{- $names = append $names .name }}
{{- end }}
{{- range .values.extraVolumeMounts }}
{{- if not (has .name $names) }}
{{- fail (printf "extraVolumeMounts: %q mounts a volume that extraVolumes does not define" .name) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Volumes the gateway container mounts, from (dict "root" . "values" .Values). */}}
{{- define "citewarden.volumes" -}}
- name: citewarden-policies
  configMap:
    name: {{ include "citewarden.policyConfigMapName" . }}
- name: citewarden-tmp
  emptyDir:
    medium: Memory
    sizeLimit: {{ .values.tmpSizeLimit }}
{{- with .values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Refuse grace settings that would let the kubelet SIGKILL a pod mid-drain. */}}
{{- define "citewarden.checkGrace" -}}
{{- $v := .values -}}
{{- $need := add (int $v.shutdownGraceSeconds) (int $v.preStopSleepSeconds) -}}
{{- if le (int $v.terminationGracePeriodSeconds) (int $need) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed preStopSleepSeconds + shutdownGraceSeconds (%d)" (int $v.terminationGracePeriodSeconds) (int $need)) }}
{{- end }}
{{- end }}

{{/*
Sidecar API for app charts (add citewarden as a dependency, alias optional):

  spec:
    template:
      metadata:
        annotations:
          app.example.com/owner: my-team
          {{- include "citewarden.sidecar.podAnnotations" (dict "root" $ "values" .Values.citewarden) | nindent 10 }}
      spec:
        terminationGracePeriodSeconds: {{ .Values.citewarden.terminationGracePeriodSeconds }}
        containers:
          - name: app
            ...
          {{- include "citewarden.sidecar.container" (dict "root" $ "values" .Values.citewarden "upstream" "http://127.0.0.1:8000") | nindent 10 }}
        volumes:
          {{- include "citewarden.sidecar.volumes" (dict "root" $ "values" .Values.citewarden) | nindent 10 }}

Each renders a YAML list (one item for the container) at column 0; indent it with nindent.
"upstream" is where the app listens inside the pod (defaults to http://127.0.0.1:8000).
*/}}
{{- define "citewarden.sidecar.container" -}}
{{- include "citewarden.checkGrace" . -}}
- {{ include "citewarden.container" (dict "root" .root "values" .values "upstream" (.upstream | default "http://127.0.0.1:8000") "name" (.name | default "citewarden")) | nindent 2 | trim }}
{{- end }}

{{- define "citewarden.sidecar.volumes" -}}
{{- include "citewarden.volumes" . }}
{{- end }}

{{/* Annotation lines (possibly none) to add to the app's pod template annotations. */}}
{{- define "citewarden.sidecar.podAnnotations" -}}
{{- include "citewarden.policyAnnotations" . }}
{{- end }}
