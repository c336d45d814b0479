{{/*
The policy shipped as default.yaml when .Values.policies is empty: enforce mode, OpenAI and
Anthropic routes, doc-chunk citations, the six deterministic checks, block on unverified
claims, abstain when a verifier is unavailable. Kept in a named template (not a chart file)
so app charts that include the sidecar templates can render it too.
*/}}
{{- define "citewarden.defaultPolicy" -}}
name: default
mode: enforce
routes:
  - name: openai-chat
    match: {path: /v1/chat/completions}
    protocol: openai-chat
  - name: anthropic-messages
    match: {path: /v1/messages}
    protocol: anthropic-messages
passthrough: [/v1/models]
citations: {format: doc-chunk}
context: {from: [request, response, header]}
checks:
  - missing_citation
  - malformed_citation
  - hallucinated_citation
  - stale_source
  - quote_mismatch
  - number_mismatch
release:
  on_unverified: block
  on_infrastructure_failure: abstain
  block_status: 422
streaming: {mode: buffer}
{{- end }}
